"""Help text from the classes' own source: the options' docstrings and the policies' `#:` lines.

`fairway serve --help` and `fairway bench --help` print it, so the lists never drift from the
code; it is built only when help is shown (it reads the policy registry).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import textwrap

import fairway.policies as policies
from fairway.options.checks import allowed_values
from fairway.options.fields import DEFAULTS, SERVING_OPTIONS, OptionFields


def attribute_docs(cls: type) -> dict[str, str]:
    """Field name -> its documentation, for `cls` and its bases.

    Two conventions are read: a string right after the field (vLLM's config classes, and
    `OptionFields`, the fields of `FairwayOptions`) or `#:` comment lines right above it (the
    policy dataclasses).
    """
    out: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        try:
            source = textwrap.dedent(inspect.getsource(base))
        except (OSError, TypeError):
            continue
        lines = source.splitlines()
        node = ast.parse(source).body[0]
        if not isinstance(node, ast.ClassDef):
            continue
        body = node.body
        for i, item in enumerate(body):
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            after = body[i + 1] if i + 1 < len(body) else None
            if (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                doc = after.value.value
            else:
                above: list[str] = []
                row = item.lineno - 2
                while row >= 0 and lines[row].strip().startswith("#:"):
                    above.insert(0, lines[row].strip()[2:].strip())
                    row -= 1
                doc = " ".join(above)
            if doc:
                out[item.target.id] = " ".join(doc.split())
    return out


def _wrap(text: str, indent: int = 6) -> str:
    return textwrap.fill(text, width=100, initial_indent=" " * indent,
                         subsequent_indent=" " * indent)


def serving_options_help() -> str:
    """`--fairway-option KEY=VALUE` keys with their defaults and documentation."""
    docs = attribute_docs(OptionFields)
    lines = ["serving options (--fairway-option KEY=VALUE; server: FAIRWAY_<KEY>):"]
    for key in SERVING_OPTIONS:
        default = json.dumps(DEFAULTS[key])
        lines += [f"  {key} (default {default}; {allowed_values(key)})", _wrap(docs.get(key, ""))]
    return "\n".join(lines)


def policy_params_help() -> str:
    """Each policy's parameters (`--policy-arg [POLICY.]KEY=VALUE`), from the policy classes."""
    by_class: dict[type, list[str]] = {}
    for name in policies.names():
        by_class.setdefault(type(policies.get(name)), []).append(name)
    lines = ["policy parameters (--policy-arg [POLICY.]KEY=VALUE; KEY=VALUE applies to every "
             "chosen policy that has KEY):"]
    for cls, names in sorted(by_class.items(), key=lambda kv: kv[1][0]):
        params = [f for f in dataclasses.fields(cls) if f.init] if dataclasses.is_dataclass(
            cls) else []
        lines.append(f"  {', '.join(names)}:" + ("" if params else " (no parameters)"))
        docs = attribute_docs(cls)
        for f in params:
            default = f.default if f.default is not dataclasses.MISSING else None
            lines += [f"    {f.name} (default {json.dumps(default, default=str)})",
                      _wrap(docs.get(f.name, ""), 8)]
    return "\n".join(lines)
