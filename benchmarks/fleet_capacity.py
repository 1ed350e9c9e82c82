"""Capacity at a TTFT SLO behind each router: how much load a fleet of Fairway nodes serves.

    python benchmarks/fleet_capacity.py [--trace NAME] [--nodes N] [--slo-p99 S] [--slo-median S]
        [--routers NAME ...] [--policies NAME ...] [--tolerance T] [--start-load X]
        [--min-load X] [--max-load X] [--offered-load L] [--max-nodes N] [--quick]
        [--workers N] [--ray ADDRESS] [--out DIR]

For each router x policy (every node of the fleet runs the policy), the highest load that meets
the SLO (default: fleet-wide TTFT p99 <= 10 s and median <= 1 s, a failed request counting as an
infinite TTFT): `fairway.fleet.capacity.capacity_grid`. The load is each node's share of the
offered rate as a multiple of one node's capacity, the `--load` of `fairway bench --nodes`: the
trace is the preset built at N x capacity x load. Bracketing from load 1 (x2 up, /2 down, within
[0.05, 4]; --start-load, --min-load, --max-load), then bisection to `--tolerance` (0.05); every
cell's probe of a round runs at once on `--workers` processes (or Ray). Each node's KV cache is
what `fairway bench --nodes` gives a node at load 1 (what a single replay of the preset at one
node's capacity gives its engine: --cache-fraction of that trace's reusable content), kept at
every load: a busier fleet gets no more memory. The capacity is the highest load that met the
SLO; "never" means the cell missed it at load 0.05, "at least 4" that it met it at the largest
load tried.

The ratio column is Fairway's capacity over FCFS's behind the same router; the goal (issue 48):
at least 1.2 behind the prefix-aware routers (`CACHE_AWARE`).

With `--offered-load L`, also the nodes needed: per cell the fewest nodes that meet the SLO on
the trace built at L single-node capacities (`load_fleet_trace(spec, num_nodes=1, load=L)`),
each node's cache as above, so more nodes hold more (`fairway.fleet.capacity.nodes_grid`).

Default trace: `hit-heavy` (after SGLang #31954: 96% of requests hit one of four hot 8k-token
contexts, 4% are 8k-token misses; cache 1.5 x the hot contexts), a synthetic family that builds
at any rate without the source data: the shipped presets are built at one node's capacity only,
and a SEC, MuSiQue or Mooncake preset at a fleet rate needs `fairway data download` (SEC's
FinanceBench pages have no download at all). Its prompts (8,448 tokens) let an idle fleet meet
the default SLO; presets with long prompts do not (`tenants-mixed`'s 25k-token agent contexts
take ~10 s alone, `agent-sessions`' up to 131k) and need a looser --slo-p99. Routing matters on
it: a node's cache holds about one hot context, so a router that spreads a context's requests
recomputes it. Replay settings per preset (`PRESET_OPTIONS`: the cache fraction and step budget
its description asks for) unless --cache-fraction / --max-num-batched-tokens say otherwise.

Writes capacity.md, capacity.json (every probe: load, SLO check, the fleet table row) and
capacity.png (capacity per router, a bar per policy) to the output directory; prints the table.
After every search round, progress-capacity.json (and progress-nodes_needed.json) hold the
outcomes so far.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairway.fleet import capacity  # noqa: E402
from fairway.fleet.capacity import AT_LEAST, FOUND, NEVER, SLO, Outcome  # noqa: E402
from fairway.replay.bench import (  # noqa: E402
    environment_info,
    experiment_parser,
    new_out_dir,
    trace_info,
    write_json,
)

NAME = "capacity"
DEFAULT_TRACE = "hit-heavy"
DEFAULT_NODES = 8
DEFAULT_ROUTERS = ("round-robin", "least-load", "vllm-cache-aware", "vllm-kv-aware", "dynamo-kv",
                   "llm-d", "fairway-work")
DEFAULT_POLICIES = ("fcfs", "lpm", "fairway")
#: The routers that route by prefix (the issue's capacity goal is stated behind these).
CACHE_AWARE = ("vllm-cache-aware", "vllm-kv-aware", "dynamo-kv", "llm-d", "fairway-work")
#: Fairway's capacity / FCFS's behind a cache-aware router, at least.
CAPACITY_GOAL = 1.2
#: The replay settings a preset's description asks for (`fairway trace list`): a cache that holds
#: the hot contexts, or the long-context step budget.
PRESET_OPTIONS: dict[str, dict[str, Any]] = {
    "hit-heavy": {"cache_fraction": 1.5},
    "tenants": {"cache_fraction": 1.5},
    "tenants-mixed": {"cache_fraction": 1.5},
    "priority": {"cache_fraction": 1.5},
    "hit-heavy-long": {"cache_fraction": 1.5, "max_num_batched_tokens": 8192},
    "mooncake-long": {"max_num_batched_tokens": 8192},
    "agent-sessions": {"max_num_batched_tokens": 8192},
    "agent-sessions-busy": {"max_num_batched_tokens": 8192},
}


def replay_options(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    """`fleet_replay`'s keyword arguments for `spec`: the preset's settings, the flags' over
    them."""
    options = dict(PRESET_OPTIONS.get(spec, {}))
    if args.cache_fraction is not None:
        options["cache_fraction"] = args.cache_fraction
    if args.max_num_batched_tokens is not None:
        options["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.profile is not None:
        options["profile"] = args.profile
    return options


def fleet_parser(description: str) -> argparse.ArgumentParser:
    """The flags both fleet scripts take: the experiment's, the fleet's and the engine's."""
    parser = experiment_parser(description)
    parser.add_argument("--nodes", type=int, default=DEFAULT_NODES,
                        help="nodes in the fleet (default %(default)s)")
    parser.add_argument("--routers", nargs="+", default=list(DEFAULT_ROUTERS), metavar="NAME",
                        help="routers (default: %(default)s)")
    parser.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES), metavar="NAME",
                        help="every node's policy, one cell each (default: %(default)s)")
    parser.add_argument("--cache-fraction", type=float, default=None,
                        help="share of the trace's reusable content the fleet's caches hold "
                        "(default: the preset's, else 0.3)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="vLLM's step budget (default: the preset's, else 2048)")
    return parser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = fleet_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=DEFAULT_TRACE,
                        help="a preset, built at each load (default %(default)s)")
    parser.add_argument("--slo-p99", type=float, default=capacity.DEFAULT_P99_S, metavar="S",
                        help="the SLO's p99 TTFT bound in seconds (default %(default)s)")
    parser.add_argument("--slo-median", type=float, default=capacity.DEFAULT_MEDIAN_S,
                        metavar="S", help="the SLO's median TTFT bound (default %(default)s)")
    parser.add_argument("--tolerance", type=float, default=capacity.DEFAULT_TOLERANCE,
                        help="bisection stops at a bracket this wide (default %(default)s)")
    parser.add_argument("--start-load", type=float, default=capacity.DEFAULT_START_LOAD,
                        help="the first load tried (default %(default)s)")
    parser.add_argument("--min-load", type=float, default=capacity.DEFAULT_MIN_LOAD,
                        help="the smallest load tried (default %(default)s)")
    parser.add_argument("--max-load", type=float, default=capacity.DEFAULT_MAX_LOAD,
                        help="the largest load tried (default %(default)s)")
    parser.add_argument("--offered-load", type=float, default=None, metavar="L",
                        help="also the nodes needed at L single-node capacities")
    parser.add_argument("--max-nodes", type=int, default=None,
                        help="with --offered-load: the most nodes tried (default 4 x ceil(L))")
    return parser.parse_args(argv)


# --- tables ---------------------------------------------------------------------------------------


def value_text(o: Outcome | None, kind: str = "load") -> str:
    if o is None:
        return "—"
    if o.status == NEVER:
        return f"never (> {o.missed:g})" if kind == "nodes" else f"never (misses at {o.missed:g})"
    if kind == "nodes":
        return f"{o.value:g}"
    return f"≥ {o.value:.2f}" if o.status == AT_LEAST else f"{o.value:.2f}"


def ratio_text(outcomes: Sequence[Outcome], router: str, policy: str = "fairway") -> str:
    """`policy`'s capacity / FCFS's, marked ≥ / ≤ where a side is a lower bound."""
    by = {(o.cell.router, o.cell.policy): o for o in outcomes}
    a, b = by.get((router, policy)), by.get((router, "fcfs"))
    if a is None or b is None:
        return "—"
    if a.status == NEVER or b.status == NEVER:
        return {(True, True): "both never meet", (True, False): f"{policy} never meets",
                (False, True): "FCFS never meets"}[a.status == NEVER, b.status == NEVER]
    value = capacity.ratio(outcomes, router, policy)
    assert value is not None
    mark = {(AT_LEAST, AT_LEAST): "~", (AT_LEAST, FOUND): "≥ ", (FOUND, AT_LEAST): "≤ "}
    return f"{mark.get((a.status, b.status), '')}{value:.2f}"


def capacity_table(outcomes: Sequence[Outcome], routers: Sequence[str],
                   policies: Sequence[str], kind: str = "load") -> str:
    by = {(o.cell.router, o.cell.policy): o for o in outcomes}
    both = "fcfs" in policies and "fairway" in policies
    head = ["router", *policies]
    if both and kind == "load":
        head += ["fairway / fcfs", f"goal (≥ {CAPACITY_GOAL:g}, prefix-aware routers)"]
    elif both:
        head.append("nodes fairway saves")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for router in routers:
        cells = [value_text(by.get((router, p)), kind) for p in policies]
        if both and kind == "load":
            ratio = capacity.ratio(outcomes, router, "fairway")
            goal = "—" if router not in CACHE_AWARE else (
                "met" if ratio is not None and ratio >= CAPACITY_GOAL else "missed")
            cells += [ratio_text(outcomes, router), goal]
        elif both:
            f, c = by[router, "fairway"].value, by[router, "fcfs"].value
            cells.append("—" if f is None or c is None else f"{c - f:g}")
        lines.append(f"| {router} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _num(value: float | None, fmt: str = ".2f", none: str = "—") -> str:
    return none if value is None else format(value, fmt)


def probes_table(outcomes: Sequence[Outcome], kind: str = "load") -> str:
    """Every probe: value, p50, p99 (fleet-wide, failures infinite), failed, hit share, balance
    (the busiest node's tokens computed over the mean), met."""
    lines = [f"| router | policy | {kind} | p50 (s) | p99 (s) | failed | hit share | "
             "balance tokens | meets |", "|---|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        for p in sorted(o.probes, key=lambda p: p.value):
            c, row = p.check, p.summary
            lines.append(
                f"| {o.cell.router} | {o.cell.policy} | {p.value:g} | "
                f"{_num(c.ttft_p50_s, none='∞')} | {_num(c.ttft_p99_s, none='∞')} | {c.failed} | "
                f"{_num(row.get('hit_share'), '.0%')} | {_num(row.get('balance_tokens'))} | "
                f"{'yes' if c.meets else 'no'} |")
    return "\n".join(lines) + "\n"


def plot(outcomes: Sequence[Outcome], routers: Sequence[str], policies: Sequence[str],
         title: str, path: Path) -> None:
    """Capacity per router, a bar per policy; a cell that never met the SLO gets an x at 0, a
    lower bound a hatched bar."""
    from matplotlib.figure import Figure

    by = {(o.cell.router, o.cell.policy): o for o in outcomes}
    fig = Figure(figsize=(max(6.0, 1.3 * len(routers) + 2), 4.5), layout="tight")
    ax = fig.add_subplot()
    width = 0.8 / len(policies)
    for k, policy in enumerate(policies):
        xs = [i + (k - (len(policies) - 1) / 2) * width for i in range(len(routers))]
        found = [by.get((r, policy)) for r in routers]
        heights = [o.value if o is not None and o.value is not None else 0.0 for o in found]
        bars = ax.bar(xs, heights, width, label=policy, color=f"C{k}")
        for bar, o, x in zip(bars, found, xs, strict=True):
            if o is not None and o.status == AT_LEAST:
                bar.set_hatch("//")
            elif o is not None and o.status == NEVER:
                ax.plot([x], [0.0], marker="x", color=f"C{k}", markersize=8)
    ax.set_xticks(range(len(routers)), routers, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("capacity at the SLO (load, x one node's capacity)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)


def write(out_dir: Path, name: str, markdown: str, data: Mapping[str, Any], started: float,
          args: argparse.Namespace) -> float:
    """`<name>.md` (with a header line: date, machine, vLLM, commit, wall time) and
    `<name>.json`; prints the markdown. Returns the wall seconds since `started`."""
    wall = time.perf_counter() - started
    env = environment_info()
    header = (f"_{name}: {env['date']}, {env['cpu_count']}-core {env['machine']} CPU, "
              f"{env['vllm']}, virtual-clock fleet replays at {env['git_commit']}; "
              f"{wall:.0f} s wall._\n\n")
    (out_dir / f"{name}.md").write_text(header + markdown, encoding="utf-8")
    write_json(out_dir / f"{name}.json", {"experiment": name, "args": vars(args),
                                          "environment": env, "wall_s": round(wall, 3), **data})
    print(header + markdown)
    print(f"wrote {out_dir}", file=sys.stderr)
    return wall


def saver(out_dir: Path, kind: str) -> capacity.OnRound:
    """Writes `progress-<kind>.json` after every search round (the outcomes so far), so a run
    stopped midway keeps what it measured."""
    def save(round_no: int, outcomes: list[Outcome]) -> None:
        write_json(out_dir / f"progress-{kind}.json",
                   {"round": round_no, "cells": [o.to_json() for o in outcomes]})
    return save


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    logging.getLogger(capacity.__name__).setLevel(logging.INFO)  # one line per search round
    started = time.perf_counter()
    slo = SLO(args.slo_p99, args.slo_median)
    options = replay_options(args.trace, args)
    common: dict[str, Any] = {
        "quick": args.quick, "cache_dir": args.trace_cache, "options": options,
        "workers": args.workers, "ray": args.ray, "progress": not args.no_progress,
    }
    out_dir = new_out_dir(args.out, NAME)
    reference = capacity.fleet_trace_at(args.trace, float(args.nodes), quick=args.quick,
                                        cache_dir=args.trace_cache)
    blocks = capacity.node_memory(args.trace, reference, options, quick=args.quick,
                                  cache_dir=args.trace_cache)
    found = capacity.capacity_grid(
        args.trace, args.routers, args.policies, args.nodes, slo, tolerance=args.tolerance,
        start_load=args.start_load, min_load=args.min_load, max_load=args.max_load,
        on_round=saver(out_dir, "capacity"), **common)
    title = (f"{args.trace}{' (quick)' if args.quick else ''} on {args.nodes} nodes, "
             f"{slo.describe()}")
    markdown = (
        f"# Capacity at the SLO: {title}\n\n"
        "The highest load (each node's share of the offered rate, x one node's capacity) at "
        "which the fleet-wide TTFT meets the SLO (a failed request counts as an infinite TTFT); "
        f"bisection to {args.tolerance:g}: the lowest load that missed is within that above. "
        f"Each node's KV cache: {blocks} blocks at every load (a node's at load 1: the single "
        "replay of the preset at one node's capacity; more only where a trace's longest prompt "
        "needs it). fairway / fcfs: Fairway's capacity over FCFS's "
        "behind the same router.\n\n"
        + capacity_table(found, args.routers, args.policies)
        + "\nEvery probe (fleet-wide TTFT; ∞: failures reach the percentile):\n\n"
        + probes_table(found)
    )
    plot(found, args.routers, args.policies, title, out_dir / f"{NAME}.png")
    data: dict[str, Any] = {"slo": {"p99_s": slo.p99_s, "median_s": slo.median_s},
                            "trace": trace_info(reference), "options": options, "kv_blocks": blocks,
                            "capacity": [o.to_json() for o in found]}
    if args.offered_load is not None:
        nodes = capacity.nodes_grid(args.trace, args.routers, args.policies, args.offered_load,
                                    slo, max_nodes=args.max_nodes,
                                    on_round=saver(out_dir, "nodes_needed"), **common)
        markdown += (
            f"\n## Nodes needed at {args.offered_load:g} single-node capacities\n\n"
            "The fewest nodes that meet the SLO on the trace built at that rate (each node's "
            "KV cache as above, so more nodes hold more).\n\n"
            + capacity_table(nodes, args.routers, args.policies, kind="nodes")
            + "\nEvery probe:\n\n" + probes_table(nodes, kind="nodes")
        )
        data["nodes_needed"] = {"offered_load": args.offered_load,
                                "cells": [o.to_json() for o in nodes]}
    data["wall_s"] = write(out_dir, NAME, markdown, data, started, args)
    data["out_dir"] = str(out_dir)
    return data


if __name__ == "__main__":
    main()
