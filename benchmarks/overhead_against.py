"""The scheduler step's cost before and after a change: `scheduler_overhead.py` from an older git
revision and from this tree, taking turns on the same machine.

The older code runs from a temporary git worktree of `--rev` with this tree's
`scheduler_overhead.py` copied in, so both sides are measured by the same harness (the older code
must have the Fairway names the harness uses). The sides alternate `--turns` times, and which
side goes first alternates too (before, after, after, before, before, after, ...), so a slow spell
of a shared machine, or one that drifts within a turn, hits both alike. Every turn is one run of
the harness, whose "added" pairs an arm with vLLM's own scheduler in that same run.

The table gives, per size, step kind and policy, the mean over the turns of: the added median
(the arm's median minus vLLM's, the quantity `scheduler_overhead.GOALS_MS` bounds) before and
after, the goal and whether the after side meets it, the same for the own added median (Fairway's
own median minus vLLM's arm's, `scheduler_overhead.own_added_ms`), Fairway's own median before
and after, how much of the added median is vLLM's own part running longer (more requests
started), the requests started per step (after), and the added median between steps that
started and finished as many requests (`scheduler_overhead.same_work_added`) before and after,
judged by the same goal.

Run: `python benchmarks/overhead_against.py --rev e9c2d6a --turns 2 --out results/overhead --
--policies fairway fairway-step --sizes 1000 10000 --no-memory` (the arguments after `--` go to
`scheduler_overhead.py`; `--json` is set by this script). Each turn's JSON and the table
(`table.md`) are written under `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HARNESS = Path("benchmarks") / "scheduler_overhead.py"
SIDES = ("before", "after")
KINDS = ("full", "admit", "busy", "prefilling", "burst")
FIELDS = ("added", "own", "own_added", "vllm_added", "started", "same_work")


def turn_order(turn: int) -> tuple[str, ...]:
    """The sides of turn `turn` (from 1) in the order they run: who goes first alternates."""
    return SIDES if turn % 2 else SIDES[::-1]


def _run_harness(tree: Path, args: Sequence[str], json_path: Path) -> None:
    """One run of the harness with `tree`'s Fairway (its directory first on the import path)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(tree / HARNESS), *args, "--json", str(json_path)]
    done = subprocess.run(command, cwd=tree, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"overhead_against: {' '.join(command)} failed "
                         f"(exit {done.returncode}):\n{done.stderr[-2000:]}")


def rows_of(report: dict[str, Any]) -> dict[tuple[int, str, str], dict[str, float | None]]:
    """Per (waiting, kind, arm) of one harness report: added, own, vLLM's added part, started,
    the added median at the same work (`scheduler_overhead.same_work_added`)."""
    same_work_added = _harness().same_work_added
    base = {(r["waiting"], r["kind"]): r for r in report["results"] if r["arm"] == "vllm"}
    rows = {}
    for r in report["results"]:
        b = base.get((r["waiting"], r["kind"]))
        if r["arm"] == "vllm" or b is None:
            continue
        paired = (
            same_work_added(r["samples_ms"], r["samples_work"], b["samples_ms"], b["samples_work"])
            if r.get("samples_work") and b.get("samples_work") else None
        )
        rows[(r["waiting"], r["kind"], r["arm"])] = {
            "same_work": paired[0] if paired is not None else None,
            "added": r["median_ms"] - b["median_ms"],
            "own": r["own_median_ms"],
            "own_added": r["own_median_ms"] - b["own_median_ms"],
            "vllm_added": r["vllm_median_ms"] - b["vllm_median_ms"],
            "started": r.get("admitted_mean"),
        }
    return rows


def mean_rows(
    reports: Sequence[dict[str, Any]],
) -> dict[tuple[int, str, str], dict[str, float | None]]:
    """The mean over the turns of every field (None where a turn has none)."""
    turns = [rows_of(report) for report in reports]
    out = {}
    for key in set().union(*turns):
        values = [turn[key] for turn in turns if key in turn]
        out[key] = {
            name: (statistics.mean(v[name] for v in values)  # type: ignore[misc]
                   if all(v[name] is not None for v in values) else None)
            for name in FIELDS
        }
    return out


def table(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]],
          goals: dict[tuple[int, str], float]) -> str:
    """The Markdown table of the two sides (means over their turns)."""
    old, new = mean_rows(before), mean_rows(after)

    def cell(value: float | None, spec: str = "+.3f") -> str:
        return "-" if value is None else format(value, spec)

    def met(value: float | None, goal: float | None) -> str:
        return "-" if goal is None or value is None else ("yes" if value <= goal else "no")

    lines = [
        "| waiting | step kind | arm | added ms before | added ms after | goal ms | met after | "
        "own added ms before | own added after | own met after | Fairway's own ms before | "
        "own after | vLLM's part of added, after | started per step, after | "
        "added at same work before | after | same-work met after |",
        "|---:|---|---|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for key in sorted(new, key=lambda k: (k[0], KINDS.index(k[1]), k[2])):
        waiting, kind, arm = key
        was, now = old.get(key, dict.fromkeys(FIELDS)), new[key]
        goal = goals.get((waiting, kind))
        lines.append(
            f"| {waiting:,} | {kind} | {arm} | {cell(was['added'])} | {cell(now['added'])} | "
            f"{'-' if goal is None else f'{goal:g}'} | {met(now['added'], goal)} | "
            f"{cell(was['own_added'])} | {cell(now['own_added'])} | "
            f"{met(now['own_added'], goal)} | {cell(was['own'], '.3f')} | "
            f"{cell(now['own'], '.3f')} | {cell(now['vllm_added'])} | "
            f"{cell(now['started'], '.2f')} | {cell(was['same_work'])} | "
            f"{cell(now['same_work'])} | {met(now['same_work'], goal)} |"
        )
    return "\n".join(lines)


def _harness() -> Any:
    """This tree's `scheduler_overhead` module."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import scheduler_overhead
    finally:
        sys.path.pop(0)
    return scheduler_overhead


def _goals() -> dict[tuple[int, str], float]:
    """`GOALS_MS` of this tree's harness."""
    return dict(_harness().GOALS_MS)


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", required=True, help="the git revision to measure against")
    parser.add_argument("--turns", type=int, default=2, help="runs of each side, alternating")
    parser.add_argument("--out", type=Path, required=True, help="where the JSON and table go")
    parser.add_argument("harness_args", nargs=argparse.REMAINDER,
                        help="-- then the arguments of scheduler_overhead.py")
    args = parser.parse_args(argv)
    if args.turns < 1:
        parser.error(f"--turns must be >= 1, got {args.turns}")
    harness_args = args.harness_args[1:] if args.harness_args[:1] == ["--"] else args.harness_args
    if "--json" in harness_args:
        parser.error("--json is set by this script (one file per turn under --out)")
    args.out = args.out.resolve()  # the harness runs in the worktree: not relative to there
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="overhead-against-"))
    old_tree = scratch / "tree"
    added = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old_tree),
                            args.rev], capture_output=True, text=True)
    if added.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise SystemExit(f"overhead_against: cannot check out {args.rev!r} "
                         f"(a git checkout is needed): {added.stderr.strip()}")
    try:
        shutil.copy(ROOT / HARNESS, old_tree / HARNESS)
        reports: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        trees = dict(zip(SIDES, (old_tree, ROOT), strict=True))
        for turn in range(1, args.turns + 1):
            for side in turn_order(turn):
                tree = trees[side]
                print(f"turn {turn}: {side}", file=sys.stderr, flush=True)
                path = args.out / f"{side}-{turn}.json"
                _run_harness(tree, harness_args, path)
                reports[side].append(json.loads(path.read_text()))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)],
                       capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    text = table(reports["before"], reports["after"], _goals())
    heading = (f"{args.rev} (before) against this tree (after), {args.turns} turns each; "
               f"scheduler_overhead.py {' '.join(harness_args)}")
    (args.out / "table.md").write_text(f"{heading}\n\n{text}\n")
    print(text)
    return text


if __name__ == "__main__":
    main()
