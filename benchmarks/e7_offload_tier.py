"""E7, a CPU offload tier: E2's scenarios with vLLM's `OffloadingConnector` at 4 x the GPU cache.

    python benchmarks/e7_offload_tier.py [--out DIR] [--quick] [--workers N] [--ray ADDRESS]

Every scenario of E2 (`benchmarks/e2_p99_scenarios.py`: its presets, loads, cache sizes and step
budgets) replayed with a CPU tier of `TIER_RATIO` x the GPU cache's blocks: vLLM's connector (its
scheduler half, in the engine) decides what is stored, evicted and loaded; the worker's copies
take the profile's load cost (the shipped A6000 table: an estimate, PCIe 4.0 x16 at ~24 GB/s,
Llama-3.1-8B's KV). Arms, all with the tier:

- `fairway`: the default, the tier priced (a tier token counts as 1 - load/compute of a GPU hit);
- `fairway[tier=equal]` (a tier hit counted as a GPU hit: SGLang HiCache's rule),
  `fairway[tier=fixed]` (0.75 of one: Dynamo's router's host-memory weight),
  `fairway[tier=blind]` (the probe off: today's Fairway on a node with a tier);
- the baselines of E2 (fcfs, lpm, klpm-4, ragcache, preble, peek, hrrn), each ordering with the
  tier counted as a GPU hit (HiCache's rule; FCFS ignores hits);
- `fairway[no tier]`: Fairway on the node without the tier, for what the tier itself buys.

Per scenario: p99 and median TTFT of the four Fairway rules, the best of blind/equal/fixed, the
best baseline (lowest p99 without a starvation flag or errors, as E2) and Fairway / best. Writes
e7.md / e7.json and one JSON per replay.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2_p99_scenarios as e2  # noqa: E402
import numpy as np  # noqa: E402

from fairway.replay.bench import (  # noqa: E402
    experiment_parser,
    finish_experiment,
    new_out_dir,
    run_experiment,
)
from fairway.replay.engine_sizing import size_cache  # noqa: E402
from fairway.replay.summary import ALL, Summary, summarize  # noqa: E402
from fairway.replay.sweep import ReplayJob  # noqa: E402

NAME = "e7"
#: The tier's blocks per GPU cache block.
TIER_RATIO = 4
RULES = ("priced", "equal", "fixed", "blind")
PRICED = "fairway"
OTHER_RULES = tuple(f"fairway[tier={rule}]" for rule in RULES[1:])
NO_TIER = "fairway[no tier]"
BASELINES = e2.BASELINES
#: The baselines' rule with the tier: a tier hit is a hit (SGLang HiCache's LPM).
BASELINE_RULE = "equal"
LABELS = (PRICED, *OTHER_RULES, *BASELINES, NO_TIER)


def jobs_of(scenario: e2.Scenario, trace: Any, options: dict[str, Any]) -> list[ReplayJob]:
    """The scenario's replays: four Fairway rules, the baselines, Fairway without the tier."""
    replay = {**options, **scenario.replay_options()}
    sizing = size_cache(
        trace, cache_fraction=scenario.cache_fraction,
        max_num_batched_tokens=replay.get("max_num_batched_tokens", 2048),
    )
    tiered = {**replay, "offload_blocks": TIER_RATIO * sizing.num_blocks}
    jobs = [ReplayJob(scenario.name, trace, "fairway", {}, tiered)]
    for rule, label in zip(RULES[1:], OTHER_RULES, strict=True):
        jobs.append(ReplayJob(scenario.name, trace, "fairway", {},
                              {**tiered, "fairway_options": {"tier": rule}}, label=label))
    for policy in BASELINES:
        jobs.append(ReplayJob(scenario.name, trace, policy, {},
                              {**tiered, "fairway_options": {"tier": BASELINE_RULE}}))
    jobs.append(ReplayJob(scenario.name, trace, "fairway", {}, replay, label=NO_TIER))
    return jobs


def compare(summary: Summary, name: str) -> dict[str, Any]:
    """One scenario's row: p99 / median per arm, the best rule and the best baseline."""
    stats = {p: summary.row(name, p, ALL) for p in LABELS}
    p99 = {p: stats[p].p99_s for p in LABELS}
    median = {p: stats[p].median_s for p in LABELS}
    errors = {p: stats[p].n_errors for p in LABELS}
    flags = {s.policy: s.starved for s in summary.starvation if s.trace_name == name}
    starved = {p: bool(flags.get(p)) for p in LABELS}
    eligible = [p for p in BASELINES if not starved[p] and not errors[p]]
    best = e2._lowest(eligible, p99, LABELS)
    best_rule_p99 = e2._lowest(list(OTHER_RULES), p99, LABELS)
    best_rule_median = e2._lowest(list(OTHER_RULES), median, LABELS)

    def over(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None or b <= 0 else a / b

    return {
        "p99_s": p99, "median_s": median, "errors": errors, "starved": starved,
        "best_baseline": best,
        "vs_best_baseline": over(p99[PRICED], p99[best] if best else None),
        "best_rule_p99": best_rule_p99,
        "vs_best_rule_p99": over(p99[PRICED], p99[best_rule_p99] if best_rule_p99 else None),
        "best_rule_median": best_rule_median,
        "vs_best_rule_median": over(median[PRICED],
                                    median[best_rule_median] if best_rule_median else None),
        "vs_no_tier_p99": over(p99[PRICED], p99[NO_TIER]),
    }


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _cell(row: dict[str, Any], label: str) -> str:
    return f"{_f(row['p99_s'][label])} / {_f(row['median_s'][label])}"


def table(rows: dict[str, dict[str, Any]]) -> str:
    head = ("| scenario | fairway (priced) p99 / median | equal | fixed | blind | "
            "priced / best rule p99, median | best baseline (tier) p99 | priced / best | "
            "lpm | fcfs | no tier |")
    lines = [head, "|---|" + "---|" * 10]
    for name, row in rows.items():
        best = row["best_baseline"]
        lines.append(
            f"| {name} | {_cell(row, PRICED)} | "
            + " | ".join(_cell(row, r) for r in OTHER_RULES)
            + f" | {_f(row['vs_best_rule_p99'], 3)}, {_f(row['vs_best_rule_median'], 3)} | "
            f"{_f(row['p99_s'][best]) if best else '-'} ({best}) | "
            f"{_f(row['vs_best_baseline'], 3)} | "
            f"{_cell(row, 'lpm')} | {_cell(row, 'fcfs')} | {_cell(row, NO_TIER)} |"
        )
    return "\n".join(lines) + "\n"


def _ratios(rows: dict[str, dict[str, Any]], a: str, b: str) -> list[float]:
    """p99 of arm `a` over arm `b`, per scenario where both have one."""
    return [r["p99_s"][a] / r["p99_s"][b] for r in rows.values()
            if r["p99_s"][a] is not None and r["p99_s"][b]]


def summary_lines(rows: dict[str, dict[str, Any]]) -> str:
    """The counts and ratios under the table (what docs/results.md quotes)."""
    n = len(rows)

    def at_most(key: str, bound: float = 1.0) -> int:
        return sum(1 for r in rows.values() if r[key] is not None and r[key] <= bound)

    both = sum(1 for r in rows.values() if r["vs_best_rule_p99"] is not None
               and r["vs_best_rule_median"] is not None
               and r["vs_best_rule_p99"] <= 1.0 and r["vs_best_rule_median"] <= 1.0)
    best = [r["vs_best_baseline"] for r in rows.values() if r["vs_best_baseline"] is not None]
    equal = _ratios(rows, PRICED, "fairway[tier=equal]")
    blind = _ratios(rows, "fairway[tier=blind]", PRICED)
    no_tier = _ratios(rows, PRICED, NO_TIER)
    fixed_worst = sum(1 for r in rows.values() if r["p99_s"]["fairway[tier=fixed]"] > max(
        r["p99_s"][PRICED], r["p99_s"]["fairway[tier=equal]"]))
    lines = [
        f"- priced p99 <= the best of equal/fixed/blind: {at_most('vs_best_rule_p99')} of {n}; "
        f"median: {at_most('vs_best_rule_median')} of {n}; both: {both} of {n}",
        f"- priced p99 <= the best baseline's (with the tier): {at_most('vs_best_baseline')} of "
        f"{n}; within 1.02: {at_most('vs_best_baseline', 1.02)} of {n}"
        + (f"; priced / best: geometric mean {float(np.exp(np.mean(np.log(best)))):.2f}, "
           f"max {max(best):.2f}" if best else ""),
    ]
    if equal and blind and no_tier:
        lines += [
            f"- priced / equal p99: {min(equal):.3f}-{max(equal):.3f}; fixed above both in "
            f"{fixed_worst} of {n}",
            f"- blind / priced p99: {min(blind):.3f}-{max(blind):.3f}, priced <= blind in "
            f"{sum(1 for x in blind if x >= 1.0)} of {n}",
            f"- priced with the tier / without it (p99): {min(no_tier):.2f}-{max(no_tier):.2f}",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = experiment_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", action="append", metavar="TEXT",
                        help="only the scenarios whose name contains TEXT (repeatable)")
    args = parser.parse_args(argv)
    scenarios = [s for s in e2.SCENARIOS
                 if not args.scenario or any(t in s.name for t in args.scenario)]
    started = time.perf_counter()
    out_dir = new_out_dir(args.out, NAME)
    options = {} if args.profile is None else {"profile": args.profile}
    jobs: list[ReplayJob] = []
    traces: dict[str, Any] = {}
    for scenario in scenarios:
        trace = e2.build(scenario, args)
        traces[scenario.name] = {"num_requests": len(trace.requests)}
        jobs += jobs_of(scenario, trace, options)
    results = run_experiment(jobs, args, out_dir)
    summary = summarize(results)
    rows = {s.name: compare(summary, s.name) for s in scenarios}
    for result in results:
        tier = result.settings.get("kv_offloading")
        if tier is not None and result.policy == PRICED:
            rows[result.trace_name]["tier_blocks"] = tier["blocks"]
            rows[result.trace_name]["loaded_tokens"] = tier.get("loaded_tokens")
    markdown = (
        f"p99 / median TTFT (s) with a CPU offload tier of {TIER_RATIO} x the GPU cache "
        "(vLLM's OffloadingConnector, its worker's copies at the profile's load cost: the "
        "shipped A6000 estimate). Best rule: the lowest of fairway's equal / fixed / blind "
        "rules; best baseline: the lowest p99 among E2's baselines (with the tier, counting a "
        "tier hit as a hit) without a starvation flag or errors. `no tier`: fairway on the same "
        "node without the tier.\n\n" + table(rows) + "\n" + summary_lines(rows)
    )
    finish_experiment(out_dir, NAME, markdown, {"scenarios": rows, "traces": traces}, results,
                      args, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
