"""E1, SEC spikes: both dynamic SEC traces under every policy; how many of the six targets each
meets.

    python benchmarks/e1_sec_spikes.py [--out DIR] [--quick] [--workers N] [--ray ADDRESS]

Traces `sec-a` and `sec-b` (presets: calm 120 s at 0.5x capacity, burst 90 s at 0.9x, spike 60 s at
2x, calm 90 s at 0.5x; seeds 1 and 2) replayed on the virtual clock through vLLM's real scheduler
under every registered policy, KV cache = 0.3 x each trace's reusable content. Targets per phase
(calm, burst, spike): median <= 1.1 x LPM's, p99 <= 1.1 x FCFS's (`fairway.replay.targets`).
This is `fairway bench` with its defaults, plus the summary table and a figure. Writes the full
bench report (report.md/json, plots, one JSON per replay) and e1.md / e1.json / e1.png.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairway.replay.bench import (  # noqa: E402
    DEFAULT_TRACES,
    BenchConfig,
    experiment_parser,
    finish_experiment,
    run_bench,
)
from fairway.replay.results import ReplayResult  # noqa: E402
from fairway.replay.summary import Summary, summarize  # noqa: E402
from fairway.replay.targets import TARGET_PHASES, six_targets  # noqa: E402

NAME = "e1"


def targets_table(summary: Summary) -> tuple[str, dict]:
    """Policy x trace: targets met (of 6), which ones failed, and the total."""
    per_trace = {t: six_targets(summary, t)["policies"] for t in summary.traces}
    policies = summary.policies[summary.traces[0]]
    lines = [
        "| policy | " + " | ".join(f"{t} met" for t in summary.traces) + " | total | failed |",
        "|---|" + "---|" * (len(summary.traces) + 2),
    ]
    data = {}
    for policy in policies:
        cells, failed, total = [], [], 0
        for t in summary.traces:
            entry = per_trace[t][policy]
            total += entry["met"]
            cells.append(f"{entry['met']}/{entry['total']}")
            failed += [f"{t}:{k}" for k, v in entry["targets"].items() if v["status"] != "pass"]
        n_max = 6 * len(summary.traces)
        lines.append(
            f"| {policy} | {' | '.join(cells)} | {total}/{n_max} | {', '.join(failed) or '—'} |"
        )
        data[policy] = {
            "met": {t: per_trace[t][policy]["met"] for t in summary.traces},
            "total": total,
            "failed": failed,
        }
    return "\n".join(lines) + "\n", data


def cached_share(result: ReplayResult) -> float:
    """Prompt tokens served from the prefix cache / all prompt tokens (at admission)."""
    total = sum(r.prompt_tokens for r in result.requests)
    return sum(r.cached_tokens or 0 for r in result.requests) / total if total else 0.0


def p99_table(summary: Summary, results: list[ReplayResult]) -> str:
    """Per trace and phase: each policy's median / p99 (s), to see the margins behind pass/fail,
    and the share of prompt tokens its cache served."""
    shares = {(r.trace_name, r.policy): cached_share(r) for r in results}
    lines = []
    for t in summary.traces:
        phases = [p for p in summary.phases[t] if p in TARGET_PHASES]
        lines += [
            f"\n**{t}**: median / p99 TTFT (s) per phase; cached: share of prompt tokens "
            "served from the prefix cache\n",
            "| policy | " + " | ".join(phases) + " | starved | cached |",
            "|---|" + "---|" * (len(phases) + 2),
        ]
        starved = {s.policy: s.starved for s in summary.starvation if s.trace_name == t}
        for policy in summary.policies[t]:
            cells = []
            for phase in phases:
                row = summary.row(t, policy, phase)
                cells.append(f"{row.median_s:.2f} / {row.p99_s:.2f}" if row and row.n else "—")
            lines.append(
                f"| {policy} | {' | '.join(cells)} | {'yes' if starved.get(policy) else 'no'} "
                f"| {shares[(t, policy)]:.3f} |"
            )
    return "\n".join(lines) + "\n"


def plot(data: dict, traces: list[str], path: Path) -> None:
    from matplotlib.figure import Figure

    policies = list(data)
    fig = Figure(figsize=(10, 4), layout="tight")
    ax = fig.add_subplot()
    width = 0.8 / len(traces)
    for k, t in enumerate(traces):
        xs = [i + (k - (len(traces) - 1) / 2) * width for i in range(len(policies))]
        ax.bar(xs, [data[p]["met"][t] for p in policies], width, label=t)
    ax.set_xticks(range(len(policies)), policies, rotation=30, ha="right")
    ax.set_ylim(0, 6.3)
    ax.axhline(6, color="0.5", lw=0.8, ls="--")
    ax.set_ylabel("targets met (of 6)")
    ax.set_title("E1: SEC spike traces, six targets per trace")
    ax.legend()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    args = experiment_parser(__doc__.split("\n\n")[0]).parse_args(argv)
    started = time.perf_counter()
    config = BenchConfig(
        traces=DEFAULT_TRACES,
        profile=args.profile,
        out=args.out or _default_out(),
        workers=args.workers,
        ray=args.ray,
        quick=args.quick,
        trace_cache=args.trace_cache,
        progress=not args.no_progress,
    )
    outcome = run_bench(config)
    summary = summarize(outcome.results)
    table, data = targets_table(summary)
    plot(data, summary.traces, outcome.out_dir / f"{NAME}.png")
    markdown = (
        "Targets met per policy (median <= 1.1 x lpm, p99 <= 1.1 x fcfs, in calm / burst / "
        "spike):\n\n" + table + p99_table(summary, outcome.results)
    )
    traces = {r.trace_name: r for r in outcome.results}
    finish_experiment(
        outcome.out_dir,
        NAME,
        markdown,
        {
            "targets": data,
            "traces": {name: _trace_of(r) for name, r in traces.items()},
        },
        outcome.results,
        args,
        started,
    )
    return 0


def _trace_of(result) -> dict:
    return result.settings["trace"]


def _default_out() -> str:
    import datetime

    return f"results/{NAME}-{datetime.datetime.now():%Y%m%d-%H%M%S}"


if __name__ == "__main__":
    sys.exit(main())
