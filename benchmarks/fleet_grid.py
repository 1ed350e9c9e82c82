"""The fleet grid: every router x policy at three loads on two fleet traces (issue 48's tables).

    python benchmarks/fleet_grid.py [--traces NAME ...] [--loads X ...] [--nodes N]
        [--routers NAME ...] [--policies NAME ...] [--quick] [--workers N] [--ray ADDRESS]
        [--out DIR]

Each trace x load x router x policy is one fleet replay (`fairway.fleet.bench.run_fleet_bench`,
what `fairway bench --nodes N --router R --load X` runs): N nodes (8), each running the policy,
behind the router, the preset built at N x one node's capacity x the load (0.9, 1.0, 1.2). Each
node's KV cache is what `fairway bench --nodes` gives a node at load 1 (never below a load's own
floor), kept for the three loads: the fleet's hardware does not grow with its load (as in
`fleet_capacity.py`; `fairway bench --nodes --load X` sizes a node at load X instead). Per
cell, from `fleet.md`: fleet-wide TTFT p50/p90/p99, hit share, node balance (the busiest node
over the mean, by tokens computed and by requests), prefill tokens computed and the worst
node's p99.

The goal columns (issue 48), per trace, load and router: Fairway's p99 / FCFS's (goal <= 0.8),
Fairway's p99 / the best other policy's (<= 1.0) and Fairway's median / the best other policy's
median (<= 1.1); "best" is the lowest among the policies run other than Fairway (the default
three: FCFS and LPM), named in the table.

Default traces: `hit-heavy` (four hot 8k-token contexts, 96% hits; cache 1.5 x them) and
`agent-sessions` (coding-agent sessions replayed closed loop, contexts growing to 131k tokens,
8,192-token steps): synthetic families that build at any fleet rate without the source data
(SEC, MuSiQue and Mooncake presets at a fleet rate need `fairway data download`; give them with
--traces where the data is present). Replay settings per preset as in `fleet_capacity.py`
(`PRESET_OPTIONS`), unless --cache-fraction / --max-num-batched-tokens say otherwise.

Writes grid.md and grid.json (every row and goal) to the output directory, and per trace a
`fairway bench --nodes` directory (`<trace>/`: fleet.md, fleet.json, bench.json and every replay
under replays/); prints the tables.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet_capacity import fleet_parser, replay_options, write  # noqa: E402

from fairway.fleet import capacity  # noqa: E402
from fairway.fleet.bench import FleetBenchConfig, fleet_markdown, run_fleet_bench  # noqa: E402
from fairway.fleet.traces import fleet_trace_label  # noqa: E402
from fairway.replay.bench import BenchConfig, new_out_dir  # noqa: E402
from fairway.replay.engine_sizing import (  # noqa: E402
    DEFAULT_BATCHED_TOKENS,
    DEFAULT_CACHE_FRACTION,
)

NAME = "grid"
DEFAULT_TRACES = ("hit-heavy", "agent-sessions")
DEFAULT_LOADS = (0.9, 1.0, 1.2)
#: The goals: Fairway's p99 / FCFS's, p99 / the best other policy's, median / the best median.
P99_VS_FCFS, P99_VS_BEST, MEDIAN_VS_BEST = 0.8, 1.0, 1.1


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = fleet_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--traces", nargs="+", default=list(DEFAULT_TRACES), metavar="NAME",
                        help="presets, each built at every load (default: %(default)s)")
    parser.add_argument("--loads", nargs="+", type=float, default=list(DEFAULT_LOADS),
                        metavar="X", help="each node's load, x one node's capacity "
                        "(default: %(default)s)")
    return parser.parse_args(argv)


def fleet_blocks(spec: str, args: argparse.Namespace, options: Mapping[str, Any]) -> int | None:
    """Each node's KV blocks for every load of `spec`: a node's at load 1
    (`fairway.fleet.capacity.node_memory`), at least every load's floor; None for a trace file
    (the fleet replay sizes it)."""
    found = []
    for load in args.loads:
        trace = capacity.fleet_trace_at(spec, args.nodes * load, quick=args.quick,
                                        cache_dir=args.trace_cache)
        found.append(capacity.node_memory(spec, trace, options, quick=args.quick,
                                          cache_dir=args.trace_cache))
    return None if None in found else max(b for b in found if b is not None)


def run_trace(spec: str, args: argparse.Namespace, out_dir: Path) -> tuple[list[dict[str, Any]],
                                                                            dict[str, Any]]:
    """The router x policy x load grid of one trace: its table rows and its settings."""
    options = replay_options(spec, args)
    blocks = fleet_blocks(spec, args, options)
    bench = BenchConfig(
        traces=(spec,), policies=tuple(args.policies), profile=args.profile,
        cache_fraction=options.get("cache_fraction", DEFAULT_CACHE_FRACTION), num_blocks=blocks,
        max_num_batched_tokens=options.get("max_num_batched_tokens", DEFAULT_BATCHED_TOKENS),
        out=str(out_dir / spec), workers=args.workers, ray=args.ray, quick=args.quick,
        trace_cache=args.trace_cache, progress=not args.no_progress,
    )
    outcome = run_fleet_bench(FleetBenchConfig(bench, args.nodes, tuple(args.routers),
                                               tuple(args.loads)))
    labels = {fleet_trace_label(spec, args.quick, args.nodes, load): load for load in args.loads}
    rows = [{**r.summary(), "preset": spec, "load": labels[r.replay.trace_name]}
            for r in outcome.results]
    return rows, {"options": options, "kv_blocks": blocks, "dir": str(outcome.out_dir),
                  "wall_s": round(outcome.wall_s, 1)}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def goals(rows: Sequence[Mapping[str, Any]], policy: str = "fairway") -> list[dict[str, Any]]:
    """Per trace, load and router: `policy`'s p99 and median against FCFS's and the best other
    policy's (lowest p99, lowest median: possibly two policies)."""
    out = []
    cells: dict[tuple[str, float, str], dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["preset"], r["load"], r["router"]), {})[r["policy"]] = r
    for (preset, load, router), by_policy in cells.items():
        ours, others = by_policy.get(policy), {p: r for p, r in by_policy.items() if p != policy}
        if ours is None or not others:
            continue
        known = {p: r for p, r in others.items() if r["ttft_p99_s"] is not None}
        best_p99 = min(known, key=lambda p: known[p]["ttft_p99_s"], default=None)
        best_p50 = min(known, key=lambda p: known[p]["ttft_p50_s"], default=None)
        fcfs = by_policy.get("fcfs")
        row = {
            "preset": preset, "load": load, "router": router,
            "p99": ours["ttft_p99_s"], "p50": ours["ttft_p50_s"],
            "fcfs_p99": None if fcfs is None else fcfs["ttft_p99_s"],
            "best_p99_policy": best_p99, "best_p50_policy": best_p50,
            "best_p99": None if best_p99 is None else known[best_p99]["ttft_p99_s"],
            "best_p50": None if best_p50 is None else known[best_p50]["ttft_p50_s"],
            "errors": {p: r["errors"] for p, r in by_policy.items() if r["errors"]},
        }
        row["p99_vs_fcfs"] = _ratio(row["p99"], row["fcfs_p99"])
        row["p99_vs_best"] = _ratio(row["p99"], row["best_p99"])
        row["p50_vs_best"] = _ratio(row["p50"], row["best_p50"])
        row["met"] = {
            "p99_vs_fcfs": _within(row["p99_vs_fcfs"], P99_VS_FCFS),
            "p99_vs_best": _within(row["p99_vs_best"], P99_VS_BEST),
            "p50_vs_best": _within(row["p50_vs_best"], MEDIAN_VS_BEST),
        }
        out.append(row)
    return out


def _within(value: float | None, goal: float) -> bool | None:
    return None if value is None else value <= goal + 1e-9


def _cell(value: float | None, met: bool | None) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}" if met else f"**{value:.2f}**"


def goals_markdown(goal_rows: Sequence[Mapping[str, Any]]) -> str:
    """One table per trace: a row per load x router; a missed goal in bold; a tally per goal."""
    def s(v: float | None) -> str:
        return "—" if v is None else f"{v:.2f}"

    lines = []
    for preset in dict.fromkeys(g["preset"] for g in goal_rows):
        mine = [g for g in goal_rows if g["preset"] == preset]
        lines += [
            f"### {preset}\n",
            "| load | router | fcfs p99 | best p99 (policy) | fairway p99 | fairway / fcfs p99 "
            f"(≤ {P99_VS_FCFS:g}) | fairway / best p99 (≤ {P99_VS_BEST:g}) | fairway median | "
            f"best median (policy) | fairway / best median (≤ {MEDIAN_VS_BEST:g}) | errors |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {g['load']:g} | {g['router']} | {s(g['fcfs_p99'])} | {s(g['best_p99'])} "
            f"({g['best_p99_policy']}) | {s(g['p99'])} | "
            f"{_cell(g['p99_vs_fcfs'], g['met']['p99_vs_fcfs'])} | "
            f"{_cell(g['p99_vs_best'], g['met']['p99_vs_best'])} | {s(g['p50'])} | "
            f"{s(g['best_p50'])} ({g['best_p50_policy']}) | "
            f"{_cell(g['p50_vs_best'], g['met']['p50_vs_best'])} | "
            f"{', '.join(f'{p} {n}' for p, n in g['errors'].items()) or '0'} |"
            for g in mine
        ]
        tally = ", ".join(
            f"{name} met in {sum(g['met'][key] is True for g in mine)} of {len(mine)}"
            for key, name in (("p99_vs_fcfs", "p99 / FCFS"), ("p99_vs_best", "p99 / best"),
                              ("p50_vs_best", "median / best")))
        lines += ["", f"Goals: {tally}.", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = time.perf_counter()
    out_dir = new_out_dir(args.out, NAME)
    rows: list[dict[str, Any]] = []
    traces: dict[str, Any] = {}
    for spec in args.traces:
        found, traces[spec] = run_trace(spec, args, out_dir)
        rows += found
    goal_rows = goals(rows)
    markdown = (
        f"# Fleet grid: {args.nodes} nodes, loads {', '.join(f'{x:g}' for x in args.loads)}"
        f"{' (quick traces)' if args.quick else ''}\n\n"
        "Fleet-wide TTFT in seconds. Goals (issue 48), per trace, load and router: Fairway's p99 "
        "/ FCFS's, Fairway's p99 / the best other policy's, Fairway's median / the best other "
        "policy's median (the policy in brackets); a missed goal in bold. Each node's KV cache "
        "is a node's at load 1, kept for every load: "
        + ", ".join(f"{spec} {t['kv_blocks']} blocks" for spec, t in traces.items())
        + ".\n\n## Goals\n\n" + goals_markdown(goal_rows)
        + "\n## Every cell\n\n" + fleet_markdown(rows, args.nodes).split("\n", 1)[1]
    )
    data = {"rows": rows, "goals": goal_rows, "traces": traces}
    data["wall_s"] = write(out_dir, NAME, markdown, data, started, args)
    data["out_dir"] = str(out_dir)
    return data


if __name__ == "__main__":
    main()
