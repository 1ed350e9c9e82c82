"""The layers of `fairway/`, read from the code's own imports (issue 46, "Rooms").

Every module under `fairway/` is parsed with `ast` (nothing is imported or run), and every import
counts: at the top, inside functions (the lazy ones) and under `TYPE_CHECKING`. The rules:

(a) no import cycle among fairway's modules (a lazy import inside a function is no excuse: it
    only hides the circle from Python, not from whoever reads the code);
(b) `fairway/policies/` is engine-agnostic: it imports nothing from `fairway.vllm`,
    `fairway.replay` or `fairway.cli`, and no `vllm` at all;
(c) only `fairway/vllm/` imports `vllm` (the rest reaches the engine through it);
(d) no module is over `MAX_LINES` lines.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fairway"
MAX_LINES = 600
#: Where `vllm` may be imported: the engine adapter, and nothing above or beside it.
VLLM_IMPORTERS = ("fairway/vllm/",)
#: What the policies must not import (besides `vllm`): the layers above them.
POLICIES_MUST_NOT_IMPORT = ("fairway.vllm", "fairway.replay", "fairway.cli")


@dataclass(frozen=True)
class Import:
    """One imported name as written: `target` is a module path (`fairway.x.y`, `vllm.config`)."""

    source: str  # the importing file, relative to the repository root
    line: int
    target: str


def module_name(path: Path) -> str:
    """`fairway/a/b.py` -> `fairway.a.b`; `fairway/a/__init__.py` -> `fairway.a`."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> dict[str, Path]:
    """Module name -> file, for every Python file under `fairway/`."""
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, text: str | None = None) -> Iterator[Import]:
    """Every import of `path` (or of `text` as if it were that file), wherever it stands;
    `from X import n` yields `X.n` (a module or not: `fairway_target` decides), relative imports
    resolved."""
    source = str(path.relative_to(ROOT))
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if text is None:
        text = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(text, filename=source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(source, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield Import(source, node.lineno, f"{base}.{alias.name}")


def fairway_target(target: str, modules: dict[str, Path]) -> str | None:
    """The fairway module an import reaches (its longest known prefix), or None."""
    while target:
        if target in modules:
            return target
        target = target.rpartition(".")[0]
    return None


def is_vllm(target: str) -> bool:
    return target == "vllm" or target.startswith("vllm.")


def all_imports() -> tuple[dict[str, Path], list[Import]]:
    modules = source_files()
    return modules, [imp for path in modules.values() for imp in imports_of(path)]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_among_fairway_modules():
    modules, imports = all_imports()
    edges: dict[str, set[str]] = {name: set() for name in modules}
    where: dict[tuple[str, str], list[str]] = {}
    for imp in imports:
        source, target = module_name(ROOT / imp.source), fairway_target(imp.target, modules)
        if target is not None and target != source:
            edges[source].add(target)
            where.setdefault((source, target), []).append(f"{imp.source}:{imp.line}")
    found = cycles(edges)
    lines = []
    for component in found:
        members = set(component)
        ties = [f"    {a} -> {b} ({', '.join(dict.fromkeys(where[a, b]))})"
                for a in component for b in sorted(edges[a] & members)]
        lines.append(f"  circle of {len(component)}: {', '.join(component)}\n" + "\n".join(ties))
    assert not found, (
        "import cycles among fairway modules (lazy imports count too):\n" + "\n".join(lines)
    )


def offending(imports: list[Import], rule: Callable[[Import], bool]) -> list[str]:
    """`  file:line imports target` for each import that breaks `rule`."""
    return [f"  {imp.source}:{imp.line} imports {imp.target}" for imp in imports if rule(imp)]


def test_policies_import_no_engine_replay_or_cli():
    _, imports = all_imports()
    bad = offending(imports, lambda imp: imp.source.startswith("fairway/policies/") and (
        is_vllm(imp.target) or any(
            imp.target == layer or imp.target.startswith(layer + ".")
            for layer in POLICIES_MUST_NOT_IMPORT
        )
    ))
    assert not bad, (
        "fairway/policies/ is engine-agnostic: no vllm, fairway.vllm, fairway.replay or "
        "fairway.cli:\n" + "\n".join(bad)
    )


def test_only_the_engine_adapter_imports_vllm():
    _, imports = all_imports()
    bad = offending(
        imports, lambda imp: is_vllm(imp.target) and not imp.source.startswith(VLLM_IMPORTERS)
    )
    assert not bad, (
        f"only {', '.join(VLLM_IMPORTERS)} may import vllm (go through fairway.vllm):\n"
        + "\n".join(bad)
    )


def test_no_module_is_over_the_line_limit():
    too_long = []
    for path in source_files().values():
        rel = str(path.relative_to(ROOT))
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            too_long.append(f"  {rel}: {lines} lines")
    assert not too_long, (
        f"modules over {MAX_LINES} lines (split them by job, issue 46):\n" + "\n".join(too_long)
    )


def test_the_reader_sees_lazy_and_relative_imports():
    """The reader itself: an import inside a function counts, a relative one is resolved."""
    text = "def f():\n    from .b import c\n\n\ndef g():\n    import vllm.config\n"
    path = PACKAGE / "replay" / "sim.py"  # a real module: its package anchors the relative import
    found = sorted(imports_of(path, text), key=lambda imp: imp.line)
    assert [imp.target for imp in found] == ["fairway.replay.b.c", "vllm.config"]
    assert is_vllm(found[1].target) and not is_vllm("fairway.vllm.offline")
