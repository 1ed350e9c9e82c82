"""E2, p99 across scenarios: Fairway against the best baseline that does not starve anyone.

    python benchmarks/e2_p99_scenarios.py [--out DIR] [--quick] [--workers N] [--ray ADDRESS]

Thirteen scenarios mix workloads (SEC a/b/long, MuSiQue agents, the Mooncake conversation trace
time-scaled), offered load (0.7 / 1.0 / 1.3 x the engine's capacity: the presets' shapes built
against a capacity scaled by 1 / x, or Mooncake's `load` parameter) and KV cache size
(cache_fraction 0.15 / 0.3 / 0.6 of the trace's reusable content); two are long-context
(`hit-heavy-long`: hot contexts of 32k-64k tokens, cache 1.5 x them; `mooncake-long`: prompts up
to the 131,072-token context), replayed as long-context servers run, with 8,192-token steps
(the others 2,048). Policies: fcfs, lpm, klpm-4,
ragcache, preble, peek, hrrn, fairway-step (the seed's per-step rule, when registered) and
fairway. Per scenario: the p99 TTFT over all requests of the best baseline whose starvation flag
is off (worst TTFT <= 3 x its own p99), Fairway's p99 and starvation flag, the ratio Fairway /
best, and the ratio Fairway / fairway-step (the goal: no scenario above 1.02). Writes
e2.md / e2.json / e2.png and one JSON per replay.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairway.replay import report  # noqa: E402
from fairway.replay.bench import (  # noqa: E402
    experiment_parser,
    finish_experiment,
    load_trace_spec,
    new_out_dir,
    run_experiment,
    trace_info,
)
from fairway.replay.sweep import ReplayJob  # noqa: E402
from fairway.traces.build import LONG_CONTEXT_BATCHED_TOKENS, default_capacity_tps  # noqa: E402

NAME = "e2"
BASELINES = ("fcfs", "lpm", "klpm-4", "ragcache", "preble", "peek", "hrrn")
#: The seed's per-step rule, compared with `fairway` when it is registered.
STEP = "fairway-step"
#: `fairway`'s p99 may exceed `fairway-step`'s by at most this factor in any scenario.
STEP_TOLERANCE = 1.02


def run_policies() -> tuple[str, ...]:
    """The baselines, `fairway-step` when registered, and `fairway`."""
    import fairway.policies as policies

    step = (STEP,) if STEP in policies.names() else ()
    return (*BASELINES, *step, "fairway")


POLICIES = run_policies()


@dataclass(frozen=True)
class Scenario:
    """One row of the table: a preset at a load, a cache size and a step budget."""

    preset: str
    load: float = 1.0
    cache_fraction: float = 0.3
    overrides: dict[str, Any] = field(default_factory=dict)
    #: vLLM's token budget per step; None: the replay's default (2,048).
    max_num_batched_tokens: int | None = None

    @property
    def name(self) -> str:
        budget = self.max_num_batched_tokens
        steps = "" if budget is None else f" steps{budget}"
        return f"{self.preset} x{self.load:g} cache{self.cache_fraction:g}{steps}"

    def replay_options(self) -> dict[str, Any]:
        """The scenario's keyword arguments of `sim.replay` (cache size, step budget)."""
        options: dict[str, Any] = {"cache_fraction": self.cache_fraction}
        if self.max_num_batched_tokens is not None:
            options["max_num_batched_tokens"] = self.max_num_batched_tokens
        return options


SCENARIOS = (
    Scenario("sec-a"),
    Scenario("sec-a", load=0.7),
    Scenario("sec-a", load=1.3),
    Scenario("sec-a", cache_fraction=0.15),
    Scenario("sec-a", cache_fraction=0.6),
    Scenario("sec-b"),
    Scenario("sec-b", load=1.3, cache_fraction=0.15),
    Scenario("sec-long"),
    Scenario("musique"),
    # Mooncake keeps its recorded arrivals; `load` time-scales them to a mean load.
    Scenario("mooncake", load=1.0, overrides={"load": 1.0}),
    Scenario("mooncake", load=1.3, cache_fraction=0.15, overrides={"load": 1.3}),
    # Long context: the presets as shipped (their own loads), at the step budget they are meant
    # for; hit-heavy-long's cache holds its hot contexts (as hit-heavy's in `hit_miss_split.py`).
    Scenario("hit-heavy-long", cache_fraction=1.5,
             max_num_batched_tokens=LONG_CONTEXT_BATCHED_TOKENS),
    Scenario("mooncake-long", max_num_batched_tokens=LONG_CONTEXT_BATCHED_TOKENS),
)


def build(scenario: Scenario, args: Any) -> Any:
    """The scenario's trace: the preset against capacity / load (or Mooncake's load param)."""
    capacity = None
    if not scenario.overrides and scenario.load != 1.0:
        capacity = default_capacity_tps() * scenario.load
    return load_trace_spec(
        scenario.preset,
        quick=args.quick,
        cache_dir=args.trace_cache,
        capacity_tps=capacity,
        **scenario.overrides,
    )


def offered_load(trace: Any) -> float:
    """Prompt tokens per second over the trace's span / the shipped profile's capacity."""
    span = max(trace.requests[-1].arrival_s, 1e-9)
    return sum(r.prompt_tokens for r in trace.requests) / span / default_capacity_tps()


def compare(summary: report.Summary, name: str) -> dict[str, Any]:
    """Best non-starving baseline p99 vs Fairway's, for one scenario."""
    starved = {s.policy: s.starved for s in summary.starvation if s.trace_name == name}
    p99 = {p: summary.row(name, p, report.ALL).p99_s for p in POLICIES}
    errors = {p: summary.row(name, p, report.ALL).n_errors for p in POLICIES}
    eligible = [p for p in BASELINES if not starved[p] and not errors[p]]
    best = min(eligible, key=lambda p: (p99[p], BASELINES.index(p))) if eligible else None
    ratio = p99["fairway"] / p99[best] if best is not None else None
    return {
        "p99_s": p99,
        "starved": starved,
        "errors": errors,
        "best_baseline": best,
        "best_p99_s": p99[best] if best else None,
        "fairway_p99_s": p99["fairway"],
        "fairway_starved": starved["fairway"],
        "ratio": ratio,
        "starved_baselines": [p for p in BASELINES if starved[p]],
        "step_p99_s": p99.get(STEP),
        "vs_step": p99["fairway"] / p99[STEP] if p99.get(STEP) else None,
    }


def table(rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| scenario | requests | offered load | KV blocks | best non-starving baseline | "
        f"its p99 (s) | fairway p99 (s) | fairway / best | {STEP} p99 (s) | fairway / {STEP} | "
        "fairway starved | starved baselines |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        best = row["best_baseline"] or "(none)"
        best_p99 = f"{row['best_p99_s']:.2f}" if row["best_p99_s"] is not None else "—"
        ratio = f"{row['ratio']:.2f}" if row["ratio"] is not None else "—"
        lines.append(
            f"| {name} | {row['requests']} | {row['offered_load']:.2f} | {row['kv_blocks']} | "
            f"{best} | {best_p99} | {row['fairway_p99_s']:.2f} | {ratio} | "
            f"{_f(row['step_p99_s'])} | {_f(row['vs_step'])} | "
            f"{'yes' if row['fairway_starved'] else 'no'} | "
            f"{', '.join(row['starved_baselines']) or '—'} |"
        )
    ratios = [r["ratio"] for r in rows.values() if r["ratio"] is not None]
    if ratios:
        import numpy as np

        wins = sum(r <= 1.0 for r in ratios)
        lines.append(
            f"\nFairway / best non-starving baseline: geometric mean "
            f"{float(np.exp(np.mean(np.log(ratios)))):.2f}, max {max(ratios):.2f}; Fairway's p99 "
            f"is at most the best baseline's in {wins} of {len(ratios)} scenarios."
        )
    steps = [r["vs_step"] for r in rows.values() if r["vs_step"] is not None]
    if steps:
        over = [n for n, r in rows.items()
                if r["vs_step"] is not None and r["vs_step"] > STEP_TOLERANCE]
        lines.append(
            f"\nFairway / {STEP}: {min(steps):.2f}-{max(steps):.2f}; goal (no scenario above "
            f"{STEP_TOLERANCE:.2f}): " + ("met." if not over else f"NOT met in {', '.join(over)}.")
        )
    return "\n".join(lines) + "\n"


def _f(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def all_p99_table(rows: dict[str, dict[str, Any]]) -> str:
    lines = ["| scenario | " + " | ".join(POLICIES) + " |", "|---|" + "---|" * len(POLICIES)]
    for name, row in rows.items():
        cells = [f"{row['p99_s'][p]:.2f}{'*' if row['starved'][p] else ''}" for p in POLICIES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n`*`: starvation flag (worst TTFT > 3 x own p99).\n"


def plot(rows: dict[str, dict[str, Any]], path: Path) -> None:
    from matplotlib.figure import Figure

    names = list(rows)
    fig = Figure(figsize=(11, 4.5), layout="tight")
    ax = fig.add_subplot()
    ratios = [rows[n]["ratio"] or 0.0 for n in names]
    colors = ["C2" if r <= 1.0 else "C3" for r in ratios]
    ax.bar(range(len(names)), ratios, color=colors)
    ax.axhline(1.0, color="0.3", lw=0.8, ls="--")
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("Fairway p99 / best non-starving baseline p99")
    ax.set_title("E2: p99 TTFT across scenarios")
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    args = experiment_parser(__doc__.split("\n\n")[0]).parse_args(argv)
    started = time.perf_counter()
    out_dir = new_out_dir(args.out, NAME)
    options = {} if args.profile is None else {"profile": args.profile}
    jobs, traces = [], {}
    for scenario in SCENARIOS:
        trace = build(scenario, args)
        traces[scenario.name] = {
            **trace_info(trace),
            "load": scenario.load,
            "cache_fraction": scenario.cache_fraction,
            "max_num_batched_tokens": scenario.max_num_batched_tokens,
            "offered_load": offered_load(trace),
        }
        for policy in POLICIES:
            jobs.append(
                ReplayJob(
                    scenario.name,
                    trace,
                    policy,
                    {},
                    {**options, **scenario.replay_options()},
                )
            )
    results = run_experiment(jobs, args, out_dir)
    summary = report.summarize(results)
    rows = {s.name: compare(summary, s.name) for s in SCENARIOS}
    for s in SCENARIOS:
        rows[s.name]["requests"] = traces[s.name]["num_requests"]
        rows[s.name]["offered_load"] = traces[s.name]["offered_load"]
        rows[s.name]["kv_blocks"] = next(r.settings["kv_cache"]["num_blocks"] for r in results
                                         if r.trace_name == s.name)
    plot(rows, out_dir / f"{NAME}.png")
    markdown = (
        "p99 TTFT over all requests; best = lowest p99 among the baselines without a "
        "starvation flag. Offered load: prompt tokens per second over the trace's span / the "
        "engine's capacity (no cache); the cache removes part of it. Steps of 2,048 tokens, "
        f"or the budget a name gives (`steps{LONG_CONTEXT_BATCHED_TOKENS}`: the long-context "
        "scenarios).\n\n"
        + table(rows) + "\nAll p99s (s):\n\n" + all_p99_table(rows)
    )
    finish_experiment(
        out_dir, NAME, markdown, {"scenarios": rows, "traces": traces}, results, args, started
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
