"""E4, ablations: relative vs absolute wait, and the Fair lane.

    python benchmarks/e4_ablation.py [--out DIR] [--quick] [--workers N] [--ray ADDRESS]

(a) `fairway-step` (wait / SLO, SLO = max(1 s, 3 x T(L))) against `fairway-abswait` (wait / 1 s):
p99 TTFT of short and of long prompts, split at the trace's median prompt length (short:
L <= median), on a similar-length trace (`sec-a`, ~4-5k tokens) and a mixed-length one
(`sec-long`, 1k-16k tokens).
Relative wait should help short prompts on the mixed trace and change little on the similar one.
(b) `fairway-step` against `fairway-nofair` (Fast lane only): p99, max TTFT, starvation flag on
`sec-a`, `sec-long` and the `flood` preset (the Fair lane exists for floods of cache hits).
KV cache as in `fairway bench` (0.3 x reusable content, or the floor). Writes e4.md / e4.json /
e4.png and one JSON per replay. Both ablations are variants of the paper's rule, `fairway-step` (the
cross-step `fairway` has no `wait_mode` or `fair_lane` parameter).
"""

from __future__ import annotations

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
    run_experiment,
    trace_info,
)
from fairway.replay.results import ReplayResult  # noqa: E402
from fairway.replay.summary import PERCENTILE_METHOD, starvation_check  # noqa: E402
from fairway.replay.sweep import ReplayJob  # noqa: E402

NAME = "e4"
WAIT_TRACES = ("sec-a", "sec-long")
BASE = "fairway-step"
WAIT_POLICIES = (BASE, "fairway-abswait")
FAIR_TRACES = ("sec-a", "sec-long", "flood")
FAIR_POLICIES = (BASE, "fairway-nofair")


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    return float(np.percentile(values, 99, method=PERCENTILE_METHOD))


def split_p99(result: ReplayResult, median_tokens: float) -> dict[str, Any]:
    """p99 of short (L <= median) and long prompts, and of all."""
    short = [
        r.ttft_s
        for r in result.requests
        if r.ttft_s is not None and r.prompt_tokens <= median_tokens
    ]
    long = [
        r.ttft_s
        for r in result.requests
        if r.ttft_s is not None and r.prompt_tokens > median_tokens
    ]
    every = [r.ttft_s for r in result.requests if r.ttft_s is not None]
    return {
        "short_n": len(short),
        "long_n": len(long),
        "short_p99_s": p99(short),
        "long_p99_s": p99(long),
        "all_p99_s": p99(every),
        "errors": result.n_errors,
    }


def fair_stats(result: ReplayResult) -> dict[str, Any]:
    check = starvation_check(result.trace_name, result.policy, result.requests)
    return {
        "p99_s": check.p99_s,
        "max_s": check.max_s,
        "starved": check.starved,
        "errors": result.n_errors,
    }


def _f(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def wait_table(rows: dict[str, dict[str, Any]], medians: dict[str, float]) -> str:
    lines = [
        "| trace | median L (tokens) | policy | short p99 (s) | long p99 (s) | all p99 (s) |"
        " n short / long |",
        "|---|---|---|---|---|---|---|",
    ]
    for trace, by_policy in rows.items():
        for policy, row in by_policy.items():
            lines.append(
                f"| {trace} | {medians[trace]:.0f} | {policy} | {_f(row['short_p99_s'])} "
                f"| {_f(row['long_p99_s'])} | {_f(row['all_p99_s'])} | "
                f"{row['short_n']} / {row['long_n']} |"
            )
    return "\n".join(lines) + "\n"


def fair_table(rows: dict[str, dict[str, Any]]) -> str:
    lines = ["| trace | policy | p99 (s) | max (s) | starved |", "|---|---|---|---|---|"]
    for trace, by_policy in rows.items():
        for policy, row in by_policy.items():
            lines.append(
                f"| {trace} | {policy} | {_f(row['p99_s'])} | {_f(row['max_s'])} | "
                f"{'yes' if row['starved'] else 'no'} |"
            )
    return "\n".join(lines) + "\n"


def plot(
    wait_rows: dict[str, dict[str, Any]], fair_rows: dict[str, dict[str, Any]], path: Path
) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), layout="tight")
    left, right = fig.subplots(1, 2)
    labels, fw, ab = [], [], []
    for trace, by_policy in wait_rows.items():
        for part in ("short", "long"):
            labels.append(f"{trace}\n{part}")
            fw.append(by_policy[BASE][f"{part}_p99_s"] or 0.0)
            ab.append(by_policy["fairway-abswait"][f"{part}_p99_s"] or 0.0)
    xs = np.arange(len(labels))
    left.bar(xs - 0.2, fw, 0.4, label=f"{BASE} (wait / SLO)")
    left.bar(xs + 0.2, ab, 0.4, label="fairway-abswait (wait / 1 s)")
    left.set_xticks(xs, labels, fontsize=8)
    left.set_ylabel("p99 TTFT (s)")
    left.set_title("(a) relative vs absolute wait")
    left.legend(fontsize=8)
    traces = list(fair_rows)
    xs = np.arange(len(traces))
    for k, policy in enumerate(FAIR_POLICIES):
        right.bar(
            xs + (k - 0.5) * 0.4,
            [fair_rows[t][policy]["max_s"] or 0.0 for t in traces],
            0.4,
            label=f"{policy} max",
        )
    right.set_xticks(xs, traces)
    right.set_ylabel("worst TTFT (s)")
    right.set_title("(b) Fair lane: worst TTFT")
    right.legend(fontsize=8)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    args = experiment_parser(__doc__.split("\n\n")[0]).parse_args(argv)
    started = time.perf_counter()
    out_dir = new_out_dir(args.out, NAME)
    options = {} if args.profile is None else {"profile": args.profile}
    suffix = "-quick" if args.quick else ""
    traces = {
        f"{p}{suffix}": load_trace_spec(p, quick=args.quick, cache_dir=args.trace_cache)
        for p in dict.fromkeys((*WAIT_TRACES, *FAIR_TRACES))
    }
    wanted: dict[str, set[str]] = {}
    for p in WAIT_TRACES:
        wanted.setdefault(f"{p}{suffix}", set()).update(WAIT_POLICIES)
    for p in FAIR_TRACES:
        wanted.setdefault(f"{p}{suffix}", set()).update(FAIR_POLICIES)
    order = (*WAIT_POLICIES, "fairway-nofair")
    jobs = [
        ReplayJob(name, traces[name], policy, {}, options)
        for name, policies in wanted.items()
        for policy in order
        if policy in policies
    ]
    results = run_experiment(jobs, args, out_dir)
    by_key = {(r.trace_name, r.policy): r for r in results}
    medians = {
        name: float(np.median([r.prompt_tokens for r in traces[name].requests])) for name in traces
    }
    wait_rows = {
        f"{p}{suffix}": {
            pol: split_p99(by_key[(f"{p}{suffix}", pol)], medians[f"{p}{suffix}"])
            for pol in WAIT_POLICIES
        }
        for p in WAIT_TRACES
    }
    fair_rows = {
        f"{p}{suffix}": {pol: fair_stats(by_key[(f"{p}{suffix}", pol)]) for pol in FAIR_POLICIES}
        for p in FAIR_TRACES
    }
    plot(wait_rows, fair_rows, out_dir / f"{NAME}.png")
    markdown = (
        "(a) Relative vs absolute wait: p99 TTFT of prompts up to / above the trace's median "
        "length.\n\n"
        + wait_table(wait_rows, medians)
        + "\n(b) Fair lane: p99 and worst TTFT over all requests (starved: worst > 3 x own "
        "p99).\n\n" + fair_table(fair_rows)
    )
    finish_experiment(
        out_dir,
        NAME,
        markdown,
        {
            "relative_wait": wait_rows,
            "fair_lane": fair_rows,
            "median_prompt_tokens": medians,
            "traces": {name: trace_info(t) for name, t in traces.items()},
        },
        results,
        args,
        started,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
