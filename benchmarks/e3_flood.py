"""E3, flood: does a flood of cache hits make the backlogged misses wait far longer than FCFS would?

    python benchmarks/e3_flood.py [--out DIR] [--quick] [--workers N] [--ray ADDRESS]

Trace: the `flood` preset (seed 6): 60 s of 8,192-token misses at 1.3x capacity (the backlog), 90 s
of a flood of requests sharing one 6,144-token prefix plus a 256-token unique suffix (0.9x capacity
in uncached tokens), then 150 s of calm with 20% misses. Per policy: the worst TTFT of any miss
(requests tagged `kind=miss`), its ratio to FCFS's worst miss, the misses' p99, and the median and
p99 of the flood requests (phase `flood`), plus when the first flood request with a cache hit was
scheduled. The claim tested: Fairway's worst miss is close to FCFS's, not 3-9x longer as under
cache-greedy orders. Three variants:

* `flood` (every registered policy): the preset as built, KV cache sized as in `fairway bench`
  (the floor, largest prompt plus two step budgets: the trace has little reusable content). The
  prefix is not cached when the flood starts (nothing computed it yet, and LRU eviction under the
  miss backlog would drop it anyway), so no policy sees a hit until one flood request has been
  computed.
* `flood-warm` (every registered policy): one extra request computes the prefix at t = 0, and the
  KV cache holds all of the trace's content (no eviction): every flood request is a hit from the
  start, the situation the claim is about.
* `flood-warm-m8000` (fcfs, lpm, fairway): as `flood-warm` with 8,000-token misses, a
  sensitivity check of Fairway's per-step bound (a miss's work / fast_weight vs the 2,048-token
  step budget).

Writes e3.md / e3.json / e3.png and one JSON per replay.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairway.replay import report  # noqa: E402
from fairway.replay.bench import (  # noqa: E402
    experiment_parser,
    finish_experiment,
    load_trace_spec,
    new_out_dir,
    ordered_policies,
    run_experiment,
    trace_info,
)
from fairway.replay.results import ReplayResult  # noqa: E402
from fairway.replay.sweep import ReplayJob  # noqa: E402
from fairway.traces.format import Trace, TraceRequest  # noqa: E402

NAME = "e3"
PRESET = "flood"
WARM_POLICIES_SENSITIVITY = ("fcfs", "lpm", "fairway")


def warm(trace: Trace, label: str) -> Trace:
    """`trace` with one request at t = 0 that computes the flood's shared prefix."""
    hit = next(r for r in trace.requests if r.tags.get("kind") == "hit")
    warmup = TraceRequest(
        f"{label}-warmup", 0.0, (hit.blocks[0],), phase="warmup", tags={"kind": "warmup"}
    )
    info = {
        **trace.header.info,
        "e3_warmup": f"request {warmup.request_id} computes {hit.blocks[0][0]} at t = 0",
    }
    header = dataclasses.replace(trace.header, num_requests=len(trace) + 1, info=info)
    return Trace(header, (warmup, *trace.requests))


def whole_content_blocks(trace: Trace, block_size: int = 16) -> int:
    """KV blocks that hold every distinct block of the trace plus the bench's working-set floor."""
    distinct: dict[str, int] = {}
    for r in trace.requests:
        for block_id, tokens in r.blocks:
            distinct[block_id] = -(-tokens // block_size) + 1  # +1: a block straddling two
    largest = max(r.prompt_tokens for r in trace.requests)
    return sum(distinct.values()) + -(-(largest + 2 * 2048) // block_size) + 1


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "median_s": None, "p99_s": None, "max_s": None}
    median, p99 = np.percentile(values, [50, 99], method=report.PERCENTILE_METHOD)
    return {
        "n": len(values),
        "median_s": float(median),
        "p99_s": float(p99),
        "max_s": float(max(values)),
    }


def measure(result: ReplayResult) -> dict[str, Any]:
    """Miss and flood statistics of one replay (errored requests counted separately)."""
    misses = [r for r in result.requests if r.tags.get("kind") == "miss"]
    flood = [r for r in result.requests if r.phase == "flood"]
    first_hit = [r.first_scheduled_s for r in flood if r.cached_tokens]
    return {
        "miss": _stats([r.ttft_s for r in misses if r.ttft_s is not None]),
        "flood": _stats([r.ttft_s for r in flood if r.ttft_s is not None]),
        "first_flood_hit_scheduled_s": min(first_hit) if first_hit else None,
        "flood_starts_s": min((r.arrival_s for r in flood), default=None),
        "errors": result.n_errors,
    }


def _f(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def table(rows: dict[str, dict[str, Any]]) -> str:
    ref = rows["fcfs"]["miss"]["max_s"] if "fcfs" in rows else None
    lines = [
        "| policy | worst miss (s) | x FCFS | miss p99 (s) | flood median (s) | flood p99 (s) | "
        "first flood hit at (s) | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for policy, row in rows.items():
        worst = row["miss"]["max_s"]
        ratio = worst / ref if worst is not None and ref else None
        row["worst_miss_vs_fcfs"] = ratio
        lines.append(
            f"| {policy} | {_f(worst)} | {_f(ratio)} | {_f(row['miss']['p99_s'])} | "
            f"{_f(row['flood']['median_s'])} | {_f(row['flood']['p99_s'])} | "
            f"{_f(row['first_flood_hit_scheduled_s'])} | {row['errors']} |"
        )
    return "\n".join(lines) + "\n"


def plot(groups: dict[str, list[ReplayResult]], path: Path) -> None:
    """Worst miss TTFT per policy (bars), one group per variant, log scale."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5), layout="tight")
    ax = fig.add_subplot()
    policies = [r.policy for r in next(iter(groups.values()))]
    width = 0.8 / len(groups)
    for k, (variant, results) in enumerate(groups.items()):
        worst = {
            r.policy: max(
                (
                    q.ttft_s
                    for q in r.requests
                    if q.tags.get("kind") == "miss" and q.ttft_s is not None
                ),
                default=0.0,
            )
            for r in results
        }
        xs = [i + (k - (len(groups) - 1) / 2) * width for i, p in enumerate(policies) if p in worst]
        ax.bar(xs, [worst[p] for p in policies if p in worst], width, label=variant)
    ax.set_xticks(range(len(policies)), policies, rotation=30, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("worst miss TTFT (s)")
    ax.set_title("E3: worst miss under a flood of cache hits")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)


def variants(args: Any) -> list[tuple[str, Trace, list[str], dict[str, Any]]]:
    """(label, trace, policies, replay options) of each variant."""
    suffix = "-quick" if args.quick else ""
    base = load_trace_spec(PRESET, quick=args.quick, cache_dir=args.trace_cache)
    short = load_trace_spec(PRESET, quick=args.quick, cache_dir=args.trace_cache, miss_tokens=8000)
    everyone = ordered_policies(None)
    hot = warm(base, "warm")
    hot_short = warm(short, "warm8000")
    return [
        (f"flood{suffix}", base, everyone, {}),
        (f"flood-warm{suffix}", hot, everyone, {"num_blocks": whole_content_blocks(hot)}),
        (
            f"flood-warm-m8000{suffix}",
            hot_short,
            list(WARM_POLICIES_SENSITIVITY),
            {"num_blocks": whole_content_blocks(hot_short)},
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    args = experiment_parser(__doc__.split("\n\n")[0]).parse_args(argv)
    started = time.perf_counter()
    out_dir = new_out_dir(args.out, NAME)
    profile = {} if args.profile is None else {"profile": args.profile}
    jobs, info = [], {}
    plan = variants(args)
    for label, trace, policies, options in plan:
        info[label] = {**trace_info(trace), **options}
        jobs += [ReplayJob(label, trace, p, {}, {**profile, **options}) for p in policies]
    results = run_experiment(jobs, args, out_dir)
    groups = {label: [r for r in results if r.trace_name == label] for label, *_ in plan}
    rows = {label: {r.policy: measure(r) for r in group} for label, group in groups.items()}
    parts = []
    for label, trace, _, options in plan:
        n_miss = sum(1 for r in trace.requests if r.tags.get("kind") == "miss")
        n_flood = sum(1 for r in trace.requests if r.phase == "flood")
        cache = (
            f"{options['num_blocks']} KV blocks (all content)"
            if "num_blocks" in options
            else f"{groups[label][0].settings['kv_cache']['num_blocks']} KV blocks (floor)"
        )
        parts.append(
            f"**{label}**: {n_miss} misses, {n_flood} flood requests, {cache}.\n\n"
            + table(rows[label])
        )
    plot(groups, out_dir / f"{NAME}.png")
    finish_experiment(
        out_dir, NAME, "\n".join(parts), {"variants": rows, "traces": info}, results, args, started
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
