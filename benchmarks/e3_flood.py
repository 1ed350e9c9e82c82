"""E3, flood: does a flood of cache hits make the backlogged misses wait far longer than FCFS would?

    python benchmarks/e3_flood.py [--out DIR] [--quick] [--workers N] [--ray ADDRESS]
        [--miss-tokens N[,N...]] [--policy NAME ...] [--floor]

Trace: the `flood` preset (seed 6): one warm-up request at t = 0 computes the flood's shared
6,144-token prefix (plus its own 256-token suffix) on the idle engine, then 60 s of misses at 1.3x
capacity (the backlog), 90 s of a flood of requests sharing that prefix plus a 256-token unique
suffix (0.9x capacity in uncached tokens), then 150 s of calm with 20% misses. The miss size is
the experiment's parameter: one variant per `--miss-tokens` value (default 4,096, 8,192, 16,384
and 32,000 tokens: 2, 4, 8 and ~16 step budgets of 2,048 tokens), each with a KV cache that holds
all of the trace's content (no eviction), so the warm prefix is still cached when the flood starts
and every flood request is a hit, the situation the claim is about. Arrivals are the same Poisson
draws for every size; the rates follow the size (the backlog's load is fixed, so larger misses
are fewer).

Per policy (every registered policy, or those given with `--policy`): the worst TTFT of a
backlog miss (requests tagged `kind=miss` in phase `backlog`), its ratio to FCFS's worst backlog
miss, the backlog misses' p99, the worst TTFT of any miss (calm included), the median and p99 of
the flood requests (phase `flood`) and the median of those that were cache hits
(`fairway.replay.results.HIT_DEFINITION`), when the first flood request with a cache hit was
scheduled, when the last flood request got its first token, and how many backlog misses got no
token until then. The claim tested: Fairway's worst miss is close to FCFS's, not 3-9x longer as
under cache-greedy orders, while its flood median stays far below FCFS's.

`--floor` adds `flood-floor`: the preset (8,192-token misses) with the KV cache sized as in
`fairway bench` (the floor, largest prompt plus two step budgets: 770 blocks); LRU eviction under
the miss backlog drops the warm prefix, so no policy sees a flood hit until a flood request has
computed it again: a check of how much the warm cache matters.

Writes e3.md / e3.json / e3.png and one JSON per replay.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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
from fairway.replay.summary import PERCENTILE_METHOD  # noqa: E402
from fairway.replay.sweep import ReplayJob  # noqa: E402
from fairway.traces.format import Trace  # noqa: E402

NAME = "e3"
PRESET = "flood"
#: Default miss sizes: 2, 4, 8 and ~16 step budgets (32,000 fits the replay's 32,768 model length).
MISS_SIZES = (4096, 8192, 16384, 32000)


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
    median, p99 = np.percentile(values, [50, 99], method=PERCENTILE_METHOD)
    return {
        "n": len(values),
        "median_s": float(median),
        "p99_s": float(p99),
        "max_s": float(max(values)),
    }


def measure(result: ReplayResult) -> dict[str, Any]:
    """Miss and flood statistics of one replay (errored requests counted separately).

    `miss`: the backlog's misses (phase `backlog`); `any_miss`: every miss, calm included.
    """
    misses = [r for r in result.requests if r.tags.get("kind") == "miss"]
    backlog = [r for r in misses if r.phase == "backlog"]
    flood = [r for r in result.requests if r.phase == "flood"]
    first_hit = [r.first_scheduled_s for r in flood if r.hit]
    flood_done = max((r.first_token_s for r in flood if r.first_token_s is not None), default=None)
    return {
        "miss": _stats([r.ttft_s for r in backlog if r.ttft_s is not None]),
        "any_miss": _stats([r.ttft_s for r in misses if r.ttft_s is not None]),
        "flood": _stats([r.ttft_s for r in flood if r.ttft_s is not None]),
        "flood_hit": _stats([r.ttft_s for r in flood if r.hit and r.ttft_s is not None]),
        "flood_hits": sum(1 for r in flood if r.hit),
        "flood_requests": len(flood),
        "first_flood_hit_scheduled_s": min(first_hit) if first_hit else None,
        "flood_starts_s": min((r.arrival_s for r in flood), default=None),
        "flood_done_s": flood_done,
        # Backlog misses that got no token until every flood request had its first token.
        "misses_after_flood": sum(
            1
            for r in backlog
            if flood_done is not None
            and r.first_scheduled_s is not None
            and r.first_scheduled_s >= flood_done
        ),
        "errors": result.n_errors,
    }


def _f(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def add_ratios(rows: dict[str, dict[str, Any]]) -> None:
    """`worst_miss_vs_fcfs`: each policy's worst backlog miss / FCFS's (None without FCFS)."""
    ref = rows["fcfs"]["miss"]["max_s"] if "fcfs" in rows else None
    for row in rows.values():
        worst = row["miss"]["max_s"]
        row["worst_miss_vs_fcfs"] = worst / ref if worst is not None and ref else None


def table(rows: dict[str, dict[str, Any]]) -> str:
    """One variant: the miss and flood statistics of every policy."""
    lines = [
        "| policy | worst backlog miss (s) | x FCFS | backlog miss p99 (s) | worst miss, any "
        "phase (s) | flood median (s) | flood-hit median (s) | flood p99 (s) | flood requests "
        "with a hit | first flood "
        "hit at (s) | last flood first token at (s) | backlog misses started after it | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for policy, row in rows.items():
        lines.append(
            f"| {policy} | {_f(row['miss']['max_s'])} | {_f(row['worst_miss_vs_fcfs'])} | "
            f"{_f(row['miss']['p99_s'])} | {_f(row['any_miss']['max_s'])} | "
            f"{_f(row['flood']['median_s'])} | {_f(row['flood_hit']['median_s'])} | "
            f"{_f(row['flood']['p99_s'])} | "
            f"{row['flood_hits']}/{row['flood_requests']} | "
            f"{_f(row['first_flood_hit_scheduled_s'])} | {_f(row['flood_done_s'])} | "
            f"{row['misses_after_flood']}/{row['miss']['n']} | {row['errors']} |"
        )
    return "\n".join(lines) + "\n"


def summary_table(rows: dict[str, dict[str, dict[str, Any]]], sizes: dict[str, int]) -> str:
    """Per policy and miss size (warm cache): worst backlog miss, x FCFS, flood-hit median."""
    labels = list(sizes)
    header = " | ".join(f"{sizes[v]:,}: worst miss (s) | x FCFS | flood-hit median (s)"
                        for v in labels)
    lines = [f"| policy | {header} |", "|---|" + "---|---|---|" * len(labels)]
    for policy in rows[labels[0]]:
        cells = []
        for label in labels:
            r = rows[label].get(policy)
            if r is None:
                cells += ["—"] * 3
                continue
            cells += [_f(r["miss"]["max_s"]), _f(r["worst_miss_vs_fcfs"]),
                      _f(r["flood_hit"]["median_s"])]
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
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
                    if q.tags.get("kind") == "miss"
                    and q.phase == "backlog"
                    and q.ttft_s is not None
                ),
                default=0.0,
            )
            for r in results
        }
        xs = [i + (k - (len(groups) - 1) / 2) * width for i, p in enumerate(policies) if p in worst]
        ax.bar(xs, [worst[p] for p in policies if p in worst], width, label=variant)
    ax.set_xticks(range(len(policies)), policies, rotation=30, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("worst backlog miss TTFT (s)")
    ax.set_title("E3: worst miss under a flood of cache hits")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)


def parse_sizes(text: str) -> tuple[int, ...]:
    """`--miss-tokens 4096,8192`: distinct positive integers, in the given order."""
    try:
        sizes = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--miss-tokens: integers separated by commas, got "
                                         f"{text!r}") from None
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
        raise argparse.ArgumentTypeError(f"--miss-tokens: distinct integers >= 1, got {text!r}")
    return sizes


def warm_variant(size: int, args: Any) -> tuple[str, Trace, dict[str, Any]]:
    """(label, trace, replay options) of the preset with `size`-token misses, all content cached."""
    suffix = "-quick" if args.quick else ""
    trace = load_trace_spec(PRESET, quick=args.quick, cache_dir=args.trace_cache,
                            miss_tokens=size)
    return f"flood-m{size}{suffix}", trace, {"num_blocks": whole_content_blocks(trace)}


def variants(args: Any) -> list[tuple[str, Trace, list[str], dict[str, Any]]]:
    """(label, trace, policies, replay options) of each variant; the warm ones are the table."""
    everyone = ordered_policies(args.policy)
    out = [(label, trace, everyone, options)
           for label, trace, options in (warm_variant(n, args) for n in args.miss_tokens)]
    if args.floor:
        base = load_trace_spec(PRESET, quick=args.quick, cache_dir=args.trace_cache)
        out.append((f"flood-floor{'-quick' if args.quick else ''}", base, everyone, {}))
    return out


def add_miss_tokens(p: argparse.ArgumentParser, default: tuple[int, ...]) -> None:
    """`--miss-tokens N[,N...]` (shared with e5_tradeoff.py)."""
    p.add_argument("--miss-tokens", type=parse_sizes, default=default, metavar="N[,N...]",
                   help="miss sizes, one warm-cache variant each (default "
                   f"{','.join(map(str, default))})")


def parser() -> argparse.ArgumentParser:
    """The common experiment flags plus `--miss-tokens` and `--floor`."""
    p = experiment_parser(__doc__.split("\n\n")[0])
    add_miss_tokens(p, MISS_SIZES)
    p.add_argument("--policy", action="append", default=None, metavar="NAME",
                   help="a policy (repeatable; default: every registered policy)")
    p.add_argument("--floor", action="store_true",
                   help="add the floor-sized-cache check (8,192-token misses, 770 blocks)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
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
    for by_policy in rows.values():
        add_ratios(by_policy)
    warm = {label: trace.header.params["miss_tokens"] for label, trace, _, options in plan
            if "num_blocks" in options}
    parts = [
        "Worst backlog miss TTFT, its ratio to FCFS's, and the median TTFT of the flood requests "
        "that were cache hits, per miss size (tokens); KV cache holding all content (the warm "
        "prefix is never evicted):\n\n" + summary_table(rows, warm)
    ]
    for label, trace, _, options in plan:
        n_miss = sum(1 for r in trace.requests if r.tags.get("kind") == "miss")
        n_backlog = sum(
            1 for r in trace.requests if r.tags.get("kind") == "miss" and r.phase == "backlog"
        )
        n_flood = sum(1 for r in trace.requests if r.phase == "flood")
        n_warm = sum(1 for r in trace.requests if r.tags.get("kind") == "warmup")
        cache = (
            f"{options['num_blocks']} KV blocks (all content)"
            if "num_blocks" in options
            else f"{groups[label][0].settings['kv_cache']['num_blocks']} KV blocks (floor)"
        )
        parts.append(
            f"**{label}**: {trace.header.params['miss_tokens']}-token misses ({n_backlog} in the "
            f"backlog, {n_miss} in all), {n_flood} flood requests, {n_warm} warm-up request(s), "
            f"{cache}.\n\n" + table(rows[label])
        )
    plot(groups, out_dir / f"{NAME}.png")
    finish_experiment(
        out_dir, NAME, "\n".join(parts), {"variants": rows, "traces": info}, results, args,
        started,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
