"""Cost of the decision trace: one engine step with the trace off vs on (every step / every 10th).

Setup per queue size N (same for every arm, built in the same process): `max_num_seqs` decoding
requests fill every running slot, so no step admits anything and every arm does the same base work;
N waiting requests (a cached 1,024-token prefix + their own suffix, or a miss) are re-ordered every
step. A measured step is `schedule()` + `update_from_output()` (both carry a hook). The arms take
turns in blocks of steps (`--rounds`), so machine noise hits all of them alike. vLLM's `log_stats`
is on in every arm (the hit/miss histograms are then on too), so the difference is the trace alone.
Whole-step medians on a shared machine differ by a few % between identical arms (the "off
(control)" arm shows it), so the hooks' own time is also measured directly: the mean time per
step spent in the observer's two hooks, which is where the trace runs.

Run: `python benchmarks/decision_trace_cost.py [--sizes 100 1000] [--steps 30] [--rounds 4]
[--running 16] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ARMS = {"off": None, "every 10": 10, "every 1": 1, "off (control)": None}


def build(offline: Any, n: int, every: int | None, out_dir: Path, running: int) -> Any:
    options = {} if every is None else {
        "decision_trace": str(out_dir / f"trace-{n}-{every}.jsonl"), "decision_trace_every": every}
    sched = offline.make_offline_scheduler(
        "fairway", num_blocks=4_096 + n * 4, max_num_batched_tokens=4_096, max_num_seqs=running,
        fairway_options=options)
    prefix = list(range(100, 1_124))
    sched.add_request(offline.make_request("seed", prefix, 0.0))
    offline.run_until_idle(sched)
    for i in range(running):
        sched.add_request(offline.make_request(f"dec{i}", [7, 8, 9, i] * 4, 0.0,
                                               max_tokens=1_000_000))
    offline.step(sched)
    for i in range(n):
        own = list(range(10_000 + 64 * i, 10_000 + 64 * i + 64))
        prompt = prefix + own if i % 2 else own * 8
        sched.add_request(offline.make_request(f"w{i}", prompt, 0.001 * i))
    offline.step(sched)  # the first (cold) probe of every waiting request
    return sched


def time_hooks(sched: Any) -> list[float]:
    """Wrap the observer's hooks to record their time (seconds, one entry per step)."""
    observer = sched.fairway_observer
    spent: list[float] = []
    inner_schedule, inner_update = observer.after_schedule, observer.after_update

    def after_schedule(output: Any, placed: Any) -> None:
        start = time.perf_counter()
        inner_schedule(output, placed)
        spent.append(time.perf_counter() - start)

    def after_update(result: Any = None) -> None:
        start = time.perf_counter()
        inner_update(result)
        spent[-1] += time.perf_counter() - start

    observer.after_schedule, observer.after_update = after_schedule, after_update
    return spent


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000])
    parser.add_argument("--steps", type=int, default=30, help="measured steps per arm and round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--running", type=int, default=16)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    from fairway.vllm import offline

    rows = []
    with tempfile.TemporaryDirectory(prefix="fairway-trace-cost-") as tmp:
        for n in args.sizes:
            scheds = {arm: build(offline, n, every, Path(tmp), args.running)
                      for arm, every in ARMS.items()}
            samples: dict[str, list[float]] = {arm: [] for arm in ARMS}
            hooks = {arm: time_hooks(sched) for arm, sched in scheds.items()}
            for _ in range(args.rounds):
                for arm, sched in scheds.items():
                    for _ in range(args.steps):
                        start = time.perf_counter()
                        offline.step(sched)
                        samples[arm].append(time.perf_counter() - start)
            base = statistics.median(samples["off"])
            for arm in ARMS:
                median = statistics.median(samples[arm])
                hook_ms = statistics.fmean(hooks[arm]) * 1e3
                hook_median_ms = statistics.median(hooks[arm]) * 1e3
                records = scheds[arm].fairway_observer.trace
                rows.append({"waiting": n, "arm": arm, "median_step_ms": median * 1e3,
                             "vs_off": median / base, "hooks_mean_ms": hook_ms,
                             "hooks_median_ms": hook_median_ms,
                             "records": records.records if records is not None else 0})
    lines = ["| waiting | decision trace | median step (ms) | vs off | hooks per step, median / "
             "mean (ms) |", "|---|---|---|---|---|"]
    lines += [f"| {r['waiting']} | {r['arm']} | {r['median_step_ms']:.2f} | {r['vs_off']:.2f} | "
              f"{r['hooks_median_ms']:.3f} / {r['hooks_mean_ms']:.3f} |" for r in rows]
    print("\n".join(lines))
    result = {"rows": rows, "args": vars(args), "python": sys.version.split()[0]}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
