"""Fairway's options: one typed, frozen object, built once at the edge and passed as an object.

`FairwayOptions` holds the ordering (`policy`), that policy's parameters (the fields of its
dataclass in `fairway.policies`, validated by the policy itself) and the serving options below.
It is built in one place, `FairwayOptions.from_settings`, from `Setting`s that remember where each
value came from, so every error names the key, the value, its source and what is allowed:

* a server: defaults < `--additional-config '{"fairway": {...}}'` < `FAIRWAY_<KEY>` variables
  (`from_vllm_config`; `fairway serve` does the same check before vLLM starts, with its flags
  between the JSON and the environment);
* the replay, sweeps and benchmarks: their arguments only. They never read `FAIRWAY_*`, so a
  server's environment cannot change what a replay measures (`fairway bench` warns that it
  ignores them).

The object crosses process boundaries only as JSON in the `vllm serve` argv (`to_json`) or by
pickling (sweep workers, Ray). `--policy-arg [POLICY.]KEY=VALUE` has one grammar everywhere
(`parse_policy_args`). Must not import vllm; `fairway --help` imports this module only lazily.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import json
import os
import textwrap
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import pydantic
from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

import fairway.policies as policies
from fairway.errors import FairwayConfigError
from fairway.policies.base import Policy
from fairway.tenants import TenantTable

#: The key of Fairway's section in vLLM's `--additional-config`.
SECTION = "fairway"
#: Prefix of the server's environment overrides: FAIRWAY_POLICY, FAIRWAY_FAST_WEIGHT, ...
ENV_PREFIX = "FAIRWAY_"
#: `FAIRWAY_*` variables that are not options: allowed beside a server, never read as options.
#: A new one must be added here, or servers started with it set refuse to start.
OTHER_ENV_VARS: dict[str, str] = {
    "FAIRWAY_DATA": "the data directory of `fairway trace build` / `fairway data`",
    "FAIRWAY_SOURCE_DATA": "the raw data the tests rebuild the shipped traces from",
    "FAIRWAY_TARGET": "the engine `make setup` installs (cpu or gpu)",
    "FAIRWAY_COMPAT_REPORT": "the report file of `make compat`",
    "FAIRWAY_SHARE_EXAMPLES": "the number of examples of a property test",
}
#: Prefixes of more such variables (test settings).
OTHER_ENV_PREFIXES = ("FAIRWAY_E2E_",)
_JSON_SOURCE = "--additional-config"
#: The ordering a server uses when none is given: `fairway`, the paper's work charges carried
#: across steps (docs/results.md has the measurements behind the choice).
DEFAULT_POLICY = "fairway"

_PositiveInt = Annotated[int, Field(strict=True, ge=1)]


@pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid", arbitrary_types_allowed=True))
class FairwayOptions:
    """Resolved options of one Fairway scheduler (one per engine or per replay)."""

    policy: str = DEFAULT_POLICY
    """The ordering of the waiting queue: a registered policy name (`fairway`, the default;
    `fairway-step`, the paper's per-step rule, and its ablations `fairway-abswait` and
    `fairway-nofair`; or a baseline such as `fcfs`, `lpm`, `peek`)."""
    policy_params: dict[str, Any] = field(default_factory=dict)
    """The policy's parameters (fields of its dataclass, e.g. `fast_weight` for `fairway`);
    given ones only, the policy's defaults apply to the rest."""
    protect: bool | None = None
    """Soft eviction protection: the cached blocks of the first `protect_top_k` waiting requests
    move to the most-recently-used end of vLLM's free list, so they are evicted last. null: on
    for `peek` (the baseline defines it), off for every other policy."""
    protect_top_k: _PositiveInt | None = None
    """How many of the first waiting requests are protected; null: vLLM's max_num_seqs."""
    reorder_preempted: bool = False
    """false keeps vLLM's rule that preempted requests go first, in their current order; true
    lets the policy place them like any other request."""
    self_calibrate: bool = False
    """Learn the prefill-time table T(L) from the engine's own step times and give it to the
    policy once the fit is good (off by default)."""
    step_log: Annotated[str, Field(min_length=1)] | None = None
    """Path of the step log (JSONL): for every engine step, its measured seconds and the
    (new tokens, tokens before) of each scheduled request; for checking a step-time model
    against the live engine (`benchmarks/fidelity.py --step-log`). null: off."""
    decision_trace: Annotated[str, Field(min_length=1)] | None = None
    """Path of the decision trace (JSONL, `fairway.vllm.decisions`): every
    `decision_trace_every` steps, the head of the order with each request's h, c, wait, score,
    lane, the ledgers and what vLLM admitted; null: off (no cost)."""
    decision_trace_every: _PositiveInt = 10
    """Write a decision-trace record every this many steps that have a waiting queue."""
    decision_trace_head: _PositiveInt = 16
    """Queue positions per decision-trace record (the head of Fairway's order)."""
    decision_trace_max_bytes: _PositiveInt = 64 * 1024 * 1024
    """Rotate the decision trace (PATH.1, PATH.2) once it is larger than this."""
    tenants: Any = None
    """The tenants this node shares its prefill between: a JSON object of tenant name -> weight
    (a number > 0; `{"team-a": 2, "team-b": 1}`) or a list of names (weight 1 each). A request
    names its tenant with `"vllm_xargs": {"tenant": NAME}`; requests without one, or naming an
    unlisted tenant, share the `default` tenant (list `default` to weigh it). Under contention
    `fairway` gives each backlogged tenant its weight's share of the prefill tokens; null: one
    tenant (the plain rule)."""
    tier: Literal["priced", "equal", "fixed", "blind"] = "priced"
    """How a prefix held in vLLM's CPU offload tier (`--kv-offloading-size`) counts in the order:
    `priced`, as a load (its tokens cost load time over compute time, from the profile's load
    figures or the estimate for its GPU class); `equal`, as a GPU hit (SGLang HiCache's rule);
    `fixed`, as `tier_weight` of a GPU hit (Dynamo's router: 0.75); `blind`, as a miss. Without a
    tier, no effect."""
    tier_weight: Annotated[float, Field(gt=0.0, le=1.0)] = 0.75
    """The share of a GPU hit one tier token counts as under `tier: fixed`."""
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    """Where each given value came from (JSON key, flag or variable), for logs and errors."""

    def __post_init__(self) -> None:
        build_policy(self.policy, self.policy_params)  # an object is valid, however built
        try:
            TenantTable.parse(self.tenants)
        except FairwayConfigError as exc:
            source = self.sources.get("tenants", "the default")
            raise FairwayConfigError(f"{exc} (set by {source})") from None

    @property
    def tenant_table(self) -> TenantTable:
        """The configured tenants (`fairway.tenants`)."""
        return TenantTable.parse(self.tenants)

    @property
    def protect_enabled(self) -> bool:
        """Whether soft protection runs (the null default resolved per policy)."""
        return self.policy == "peek" if self.protect is None else self.protect

    def top_k(self, max_num_seqs: int) -> int:
        """Number of waiting requests whose cached blocks are protected."""
        return self.protect_top_k if self.protect_top_k is not None else max_num_seqs

    def build_policy(self) -> Policy:
        """A fresh policy object for one scheduler (policies may keep per-queue state)."""
        return build_policy(self.policy, self.policy_params)

    def describe(self) -> dict[str, Any]:
        """Plain dict for logs and result files (the tier rule only when not the default: it
        acts only with an offload tier, and result files without one stay as they were)."""
        tier = {} if (self.tier, self.tier_weight) == ("priced", 0.75) else {
            "tier": self.tier, "tier_weight": self.tier_weight,
        }
        return {
            "policy": self.policy,
            **dict(self.policy_params),
            "protect": self.protect_enabled,
            "protect_top_k": self.protect_top_k,
            "reorder_preempted": self.reorder_preempted,
            "self_calibrate": self.self_calibrate,
            "decision_trace": self.decision_trace,
            "step_log": self.step_log,
            "tenants": self.tenants,
            **tier,
        }

    def to_json(self, *, skip_env: bool = False) -> dict[str, Any]:
        """The given values as a `"fairway"` section of `--additional-config` (JSON-safe).

        Args:
            skip_env: leave out values that came from `FAIRWAY_*` (the server reads them itself).
        """
        given = {"policy": self.policy, **dict(self.policy_params)}
        given |= {k: getattr(self, k) for k in SERVING_OPTIONS if k in self.sources}
        out = {
            k: v for k, v in given.items()
            if k in self.sources and not (skip_env and self.sources[k].startswith(ENV_PREFIX))
        }
        for key, value in out.items():
            if key == "tenants":  # a JSON object or list, checked by TenantTable
                continue
            if not isinstance(value, str | int | float | bool | type(None)):
                raise FairwayConfigError(
                    f"Fairway option {key}={value!r} cannot be sent to a server (give a path or "
                    "a name)"
                )
        return out

    @classmethod
    def from_settings(cls, settings: Iterable[Setting]) -> FairwayOptions:
        """The one constructor at the edge: later settings win; everything is checked here.

        Raises:
            FairwayConfigError: unknown key, bad value or unknown policy; the message names the
                key, the value, its source and what is allowed.
        """
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for s in settings:
            values[s.key] = s.value
            sources[s.key] = s.source
        policy = _check_policy(values.get("policy", _DEFAULTS["policy"]), sources)
        params = policies.param_names(policy)
        _reject_unknown(values, sources, policy, params)
        given_params = {k: values[k] for k in params if k in values}
        _check_params(policy, given_params, sources)
        serving = {k: values[k] for k in SERVING_OPTIONS if k in values}
        try:
            return cls(policy=policy, policy_params=given_params, sources=sources, **serving)
        except pydantic.ValidationError as exc:
            raise FairwayConfigError(_validation_message(exc, values, sources)) from None

    @classmethod
    def from_vllm_config(
        cls, vllm_config: Any, environ: Mapping[str, str] | None = None
    ) -> FairwayOptions:
        """A server's options: `additional_config["fairway"]`, then `FAIRWAY_*` (os.environ)."""
        additional = getattr(vllm_config, "additional_config", None) or {}
        section = additional.get(SECTION) if isinstance(additional, Mapping) else None
        return cls.resolve(section, os.environ if environ is None else environ)

    @classmethod
    def resolve(cls, json_options: Any, environ: Mapping[str, str] | None = None) -> FairwayOptions:
        """Defaults < `json_options` (the `"fairway"` section) < `environ` (FAIRWAY_*)."""
        return cls.from_settings([*json_settings(json_options), *env_settings(environ or {})])

    @classmethod
    def for_replay(
        cls,
        policy: str | FairwayOptions,
        policy_params: Mapping[str, Any] | None = None,
        serving: Mapping[str, Any] | None = None,
        source: str = "the replay",
    ) -> FairwayOptions:
        """Options of an in-process scheduler (replay, sweeps, tests): arguments only, no env.

        `policy` may already be an object; `policy_params` and `serving` are then added to it.
        """
        base = policy.settings() if isinstance(policy, FairwayOptions) else [
            Setting("policy", policy, f"{source} policy")
        ]
        extra = {**(policy_params or {}), **(serving or {})}
        if not extra and isinstance(policy, FairwayOptions):
            return policy
        return cls.from_settings([
            *base, *(Setting(k, v, f"{source} {k}") for k, v in extra.items())
        ])

    def settings(self) -> list[Setting]:
        """The given values as settings (to extend the object with more)."""
        values = {"policy": self.policy, **dict(self.policy_params)}
        values |= {k: getattr(self, k) for k in SERVING_OPTIONS}
        return [Setting(k, v, self.sources[k]) for k, v in values.items() if k in self.sources]


#: The serving options (not policy parameters) and their defaults, from the class itself.
_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(FairwayOptions) if f.name != "sources"
    and f.default is not dataclasses.MISSING
}
SERVING_OPTIONS: tuple[str, ...] = tuple(k for k in _DEFAULTS if k != "policy")
#: Every option key that is not a policy parameter.
OPTION_KEYS: tuple[str, ...] = ("policy", *SERVING_OPTIONS)


@dataclass(frozen=True)
class Setting:
    """One given value and where it came from (`--policy-arg fast_weight`, `FAIRWAY_PROTECT`)."""

    key: str
    value: Any
    source: str


def build_policy(policy: str, params: Mapping[str, Any]) -> Policy:
    """A fresh policy object; unknown names or parameters raise (`policies.get`)."""
    return policies.get(policy, **dict(params))


# --- the sources ----------------------------------------------------------------------------------


def parse_value(raw: str) -> Any:
    """A value given as text (flag or variable): a JSON scalar (4, 0.5, true, null) or the text."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def env_name(key: str) -> str:
    """The environment variable that overrides option `key`."""
    return ENV_PREFIX + key.upper()


def json_settings(section: Any, source: str = _JSON_SOURCE) -> list[Setting]:
    """The `"fairway"` section of `--additional-config` as settings."""
    if section is None:
        return []
    if not isinstance(section, Mapping):
        raise FairwayConfigError(
            f"{source} {SECTION!r} must be a JSON object, got {section!r}; "
            f'e.g. --additional-config \'{{"fairway": {{"policy": "fairway"}}}}\''
        )
    return [Setting(str(k), v, f"{source} {SECTION}.{k}") for k, v in section.items()]


def known_env_names() -> dict[str, str]:
    """`FAIRWAY_<KEY>` of every option and every policy's parameter -> what it sets."""
    names = {env_name(k): "serving option" for k in OPTION_KEYS}
    for param, owners in _param_owners().items():
        names.setdefault(env_name(param), f"parameter of {', '.join(owners)}")
    return names


def env_settings(environ: Mapping[str, str]) -> list[Setting]:
    """The `FAIRWAY_*` variables of a server's environment as settings.

    Variables in `OTHER_ENV_VARS` are skipped. Any other `FAIRWAY_*` name that is neither an
    option nor a parameter of some policy is an error listing the known names (a typo such as
    FAIRWAY_FASTWEIGHT must not be ignored); a parameter of another policy than the chosen one
    is rejected by `FairwayOptions.from_settings`, as the same key in the JSON would be.
    """
    known = known_env_names()
    out = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or not is_option_name(name):
            continue
        if name not in known:
            raise FairwayConfigError(unknown_env_message(name, environ[name], known))
        out.append(Setting(name[len(ENV_PREFIX):].lower(), parse_value(environ[name]), name))
    return out


def unknown_env_message(name: str, value: str, known: Mapping[str, str]) -> str:
    """The error for a `FAIRWAY_*` variable that is no option."""
    close = difflib.get_close_matches(name, [*known, *OTHER_ENV_VARS], n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return (
        f"unknown Fairway variable {name}={value!r} in the environment; {hint}Fairway options: "
        f"{', '.join(env_name(k) for k in OPTION_KEYS)}; policy parameters: "
        f"{', '.join(sorted(k for k in known if env_name_key(k) not in OPTION_KEYS))}; "
        f"other FAIRWAY_ variables: {', '.join(OTHER_ENV_VARS)}, {OTHER_ENV_PREFIXES[0]}*"
    )


def env_name_key(name: str) -> str:
    """The option key of a `FAIRWAY_<KEY>` name."""
    return name[len(ENV_PREFIX):].lower()


def is_option_name(name: str) -> bool:
    """Whether a `FAIRWAY_*` name is meant as an option (known or not), not another setting."""
    return name not in OTHER_ENV_VARS and not name.startswith(OTHER_ENV_PREFIXES)


def option_env_vars(environ: Mapping[str, str]) -> list[str]:
    """The `FAIRWAY_*` names in `environ` that a server would read as options (sorted)."""
    return sorted(n for n in environ if n.startswith(ENV_PREFIX) and is_option_name(n))


# --- --policy-arg [POLICY.]KEY=VALUE --------------------------------------------------------------


@dataclass(frozen=True)
class PolicyArg:
    """One `--policy-arg [POLICY.]KEY=VALUE`: for POLICY only, or for every chosen policy."""

    policy: str | None
    key: str
    value: Any
    text: str


def parse_key_value(item: str, flag: str) -> tuple[str, Any]:
    """`KEY=VALUE` -> (key, value), the value read by `parse_value`."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise FairwayConfigError(f"{flag} must be KEY=VALUE, got {item!r}")
    return key.strip(), parse_value(raw)


def parse_policy_args(items: Sequence[str]) -> list[PolicyArg]:
    """`--policy-arg` strings: `KEY=VALUE` or `POLICY.KEY=VALUE` (policy names have no dot)."""
    out = []
    for item in items:
        key, sep, raw = item.partition("=")
        name, dot, param = key.strip().rpartition(".")
        if not sep or not param or (dot and not name):
            raise FairwayConfigError(
                f"--policy-arg must be KEY=VALUE or POLICY.KEY=VALUE (e.g. fast_weight=2 or "
                f"fairway.fast_weight=2), got {item!r}"
            )
        out.append(PolicyArg(name or None, param, parse_value(raw.strip()), item))
    return out


def policy_arg_settings(
    args: Sequence[PolicyArg], selected: Sequence[str]
) -> dict[str, list[Setting]]:
    """Assign parsed `--policy-arg`s to the chosen policies -> {policy: [Setting, ...]}.

    `KEY=VALUE` applies to every chosen policy that has parameter KEY and is an error if none
    has it; `POLICY.KEY=VALUE` applies to POLICY only, which must be chosen and have KEY.
    """
    out: dict[str, list[Setting]] = {name: [] for name in selected}
    for arg in args:
        source = f"--policy-arg {arg.key}"
        if arg.policy is not None:
            if arg.policy not in selected:
                raise FairwayConfigError(
                    f"--policy-arg {arg.text!r}: policy {arg.policy!r} is not in this run "
                    f"(policies: {', '.join(selected)})"
                )
            targets = [arg.policy]
            if arg.key not in policies.param_names(arg.policy):
                raise FairwayConfigError(
                    f"--policy-arg {arg.text!r}: policy {arg.policy!r} has no parameter "
                    f"{arg.key!r}; its parameters: "
                    f"{', '.join(policies.param_names(arg.policy)) or '(none)'}"
                )
        else:
            targets = [p for p in selected if arg.key in policies.param_names(p)]
            if not targets:
                raise FairwayConfigError(
                    f"--policy-arg {arg.text!r}: "
                    + _no_param_message(arg.key, selected)
                )
        for name in targets:
            out[name].append(Setting(arg.key, arg.value, source))
    return out


def _no_param_message(key: str, selected: Sequence[str]) -> str:
    if len(selected) == 1:
        name = selected[0]
        return (
            f"policy {name!r} has no parameter {key!r}; its parameters: "
            f"{', '.join(policies.param_names(name)) or '(none)'}"
        )
    listing = "; ".join(
        f"{p}: {', '.join(policies.param_names(p)) or '(none)'}" for p in selected
    )
    return f"no policy of this run has a parameter {key!r} (parameters: {listing})"


# --- checks and messages --------------------------------------------------------------------------


def _where(sources: Mapping[str, str], key: str) -> str:
    return sources.get(key, "the default")


def _check_policy(value: Any, sources: Mapping[str, str]) -> str:
    known = policies.names()
    if not isinstance(value, str) or value not in known:
        raise FairwayConfigError(
            f"Fairway option policy={value!r} (from {_where(sources, 'policy')}) is not a known "
            f"policy; known policies: {', '.join(known)}"
        )
    return value


def _reject_unknown(
    values: Mapping[str, Any], sources: Mapping[str, str], policy: str, params: list[str]
) -> None:
    allowed = set(OPTION_KEYS) | set(params)
    for key in values:
        if key not in allowed:
            owners = _param_owners().get(key)
            other = f" (a parameter of {', '.join(owners)})" if owners else ""
            raise FairwayConfigError(
                f"unknown Fairway option {key}={values[key]!r} (from {_where(sources, key)})"
                f"{other}; options: {', '.join(OPTION_KEYS)}; parameters of policy {policy!r}: "
                f"{', '.join(params) or '(none)'}"
            )


def _check_params(policy: str, params: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """Build the policy; if that fails, once per parameter, so the error names its cause."""
    try:
        build_policy(policy, params)
        return
    except FairwayConfigError as exc:
        whole = exc
    for key, value in params.items():
        try:
            build_policy(policy, {key: value})
        except FairwayConfigError as exc:
            raise FairwayConfigError(
                f"Fairway option {key}={value!r} (from {_where(sources, key)}): {exc}"
            ) from None
    given = ", ".join(f"{k}={v!r} (from {_where(sources, k)})" for k, v in params.items())
    raise FairwayConfigError(f"Fairway policy parameters {given}: {whole}") from None


def _validation_message(
    exc: pydantic.ValidationError, values: Mapping[str, Any], sources: Mapping[str, str]
) -> str:
    error = exc.errors()[0]
    if not error["loc"] and isinstance(error.get("ctx", {}).get("error"), FairwayConfigError):
        return str(error["ctx"]["error"])  # raised by __post_init__, already worded
    key = str(error["loc"][0]) if error["loc"] else "?"
    return (
        f"Fairway option {key}={values.get(key)!r} (from {_where(sources, key)}) must be "
        f"{allowed_values(key)}"
    )


def allowed_values(key: str) -> str:
    """What a serving option accepts, in words, from its annotation (for messages and help)."""
    hint = typing.get_type_hints(FairwayOptions, include_extras=True)[key]
    args = typing.get_args(hint) if typing.get_origin(hint) in (types.UnionType, typing.Union) \
        else (hint,)
    words = []
    for arg in args:
        if arg is type(None):
            continue
        if typing.get_origin(arg) is typing.Literal:
            words.append("one of " + ", ".join(str(v) for v in typing.get_args(arg)))
            continue
        base, *meta = typing.get_args(arg) or (arg,)
        bounds = [b for m in meta for b in getattr(m, "metadata", [])]
        limits = [f"{op} {value}" for attr, op in (("gt", ">"), ("ge", ">="), ("le", "<="))
                  for b in bounds if (value := getattr(b, attr, None)) is not None]
        word = {bool: "true or false", int: "an integer", str: "a string", float: "a number"}.get(
            base, getattr(base, "__name__", str(base)))
        words.append(" ".join([word, " and ".join(limits)]) if limits else word)
    text = " or ".join(words)
    return text + ", or null (the default)" if type(None) in args else text


def _param_owners() -> dict[str, list[str]]:
    """Parameter name -> the policies that take it."""
    owners: dict[str, list[str]] = {}
    for name in policies.names():
        for param in policies.param_names(name):
            owners.setdefault(param, []).append(name)
    return owners


# --- help text from the field docstrings ----------------------------------------------------------


def attribute_docs(cls: type) -> dict[str, str]:
    """Field name -> its documentation, for `cls` and its bases.

    Two conventions are read: a string right after the field (vLLM's config classes, and
    `FairwayOptions`) or `#:` comment lines right above it (the policy dataclasses).
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
    docs = attribute_docs(FairwayOptions)
    lines = ["serving options (--fairway-option KEY=VALUE; server: FAIRWAY_<KEY>):"]
    for key in SERVING_OPTIONS:
        default = json.dumps(_DEFAULTS[key])
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
