"""Time Fairway adds to vLLM's `schedule()`: FairwayScheduler vs vLLM's own Scheduler.

Setup per queue size N (same for every arm, built in the same process):
  * a warm prefix cache: G shared prefixes of 8,192 tokens computed by seed requests;
  * `max_num_seqs` decoding requests that fill every running slot, so no step admits anything
    new and every arm does the same base work (one decode token per running request);
  * N waiting requests of 8k-16k tokens: one of the cached prefixes + an uncached suffix. The
    same Request objects are added to every arm (they are never admitted, so never mutated).
Each measured step calls `schedule()` (timed) and `update_from_output()` (not timed); the arms
take turns in blocks of steps (`--rounds`), so machine noise hits all of them alike. The first
Fairway step probes every request from scratch ("cold"); later steps re-verify memoized hits.

Run: `python benchmarks/scheduler_overhead.py [--sizes 100 1000 5000] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PREFIX_TOKENS = 8_192
SUFFIX_MAX = 8_192
BLOCK_SIZE = 16


@dataclass
class ArmResult:
    """Timings of one arm at one queue size (milliseconds)."""

    arm: str
    waiting: int
    median_ms: float
    p90_ms: float
    cold_ms: float
    policy_order_ms: float | None = None
    samples_ms: list[float] = field(default_factory=list, repr=False)


def _timed_policy(sched: Any) -> list[float]:
    """Wrap the policy's order() to record its own time (to split probe/view from policy cost)."""
    times: list[float] = []
    policy = sched.fairway_policy
    inner: Callable[..., list[int]] = policy.order

    def order(queue: Sequence[Any], now: float) -> list[int]:
        start = time.thread_time()
        try:
            return inner(queue, now)
        finally:
            times.append(time.thread_time() - start)

    policy.order = order
    return times


def _build_arm(offline: Any, arm: str, args: argparse.Namespace, prefixes: list[list[int]]) -> Any:
    num_blocks = len(prefixes) * (PREFIX_TOKENS // BLOCK_SIZE) + args.running * 8 + 4_096
    sched = offline.make_offline_scheduler(
        None if arm == "vllm" else arm,
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        max_num_batched_tokens=16_384,
        max_num_seqs=args.running,
        max_model_len=PREFIX_TOKENS + SUFFIX_MAX + 64,
    )
    for g, prefix in enumerate(prefixes):  # warm the cache
        sched.add_request(offline.make_request(f"seed{g}", prefix, 0.0, block_size=BLOCK_SIZE))
    offline.run_until_idle(sched)
    for i in range(args.running):  # fill every running slot with long decodes
        prompt = [7, 8, 9, i] * 4
        sched.add_request(offline.make_request(f"dec{i}", prompt, 0.0, max_tokens=1_000_000))
    offline.step(sched)
    assert len(sched.running) == args.running
    return sched


def _waiting_requests(
    offline: Any, n: int, prefixes: list[list[int]], pool: list[int], seed: int
) -> list[Any]:
    import random

    rng = random.Random(seed)
    now = time.time()
    requests = []
    for i in range(n):
        prefix = prefixes[i % len(prefixes)]
        suffix_len = rng.randint(0, SUFFIX_MAX)
        start = rng.randint(0, len(pool) - SUFFIX_MAX - 1)
        # the first suffix token makes each request unique, the rest is shared int objects
        suffix = [10_000_000 + i, *pool[start : start + suffix_len]]
        arrival = now - rng.uniform(0.0, 30.0)
        requests.append(
            offline.make_request(f"w{i}", prefix + suffix, arrival, block_size=BLOCK_SIZE)
        )
    return requests


def _timed_step(offline: Any, sched: Any, samples: list[float]) -> None:
    """Time `schedule()` only; answer the step with a fake model output (untimed).

    CPU time of this thread (`time.thread_time`), not wall time: on a shared machine a 3 ms
    step is often descheduled for a whole time slice, which would swamp what is measured.
    """
    start = time.thread_time()
    out = sched.schedule()
    samples.append(time.thread_time() - start)
    sched.update_from_output(out, offline.fake_model_output(sched, out))
    assert not out.scheduled_new_reqs, "a measured step must not admit anything"


def run_size(offline: Any, n: int, args: argparse.Namespace) -> list[ArmResult]:
    """Measure every arm at queue size `n`."""
    pool = list(range(1_000_000, 1_000_000 + 4 * SUFFIX_MAX))
    prefixes = [
        list(range(100_000 * (g + 1), 100_000 * (g + 1) + PREFIX_TOKENS))
        for g in range(args.prefixes)
    ]
    arms = ["vllm", *args.policies]
    scheds = {arm: _build_arm(offline, arm, args, prefixes) for arm in arms}
    waiting = _waiting_requests(offline, n, prefixes, pool, seed=n)
    order_times = {arm: _timed_policy(s) for arm, s in scheds.items() if arm != "vllm"}
    for sched in scheds.values():
        offline.add_requests(sched, waiting)
    samples: dict[str, list[float]] = {arm: [] for arm in arms}
    gc.collect()
    gc.disable()  # a collection inside one arm's timing would be charged to that arm only
    try:
        for arm in arms:  # the cold first step: full lookups for every waiting request
            _timed_step(offline, scheds[arm], samples[arm])
        # Arms take turns in blocks of steps: machine noise hits all of them alike, while each
        # arm's data stays as warm in the CPU caches as in a server running one scheduler.
        for _ in range(args.rounds):
            for arm in arms:
                for _ in range(args.steps // args.rounds):
                    _timed_step(offline, scheds[arm], samples[arm])
    finally:
        gc.enable()
    results = []
    for arm in arms:
        cold, warm = samples[arm][0], samples[arm][1:]
        policy_ms = None
        if arm in order_times:
            policy_ms = statistics.median(order_times[arm][1:]) * 1e3
            assert scheds[arm].fairway_totals.policy_fallbacks == 0
        results.append(
            ArmResult(
                arm=arm,
                waiting=n,
                median_ms=statistics.median(warm) * 1e3,
                p90_ms=statistics.quantiles(warm, n=10)[-1] * 1e3,
                cold_ms=cold * 1e3,
                policy_order_ms=policy_ms,
                samples_ms=[s * 1e3 for s in warm],
            )
        )
    return results


def markdown(results: list[ArmResult]) -> str:
    """The table: per size and arm, median step, added time over vLLM and ratio."""
    base = {r.waiting: r.median_ms for r in results if r.arm == "vllm"}
    lines = [
        "| waiting | scheduler | median schedule() ms (CPU) | p90 ms | added ms | ratio | "
        "of which policy.order ms | cold first step ms |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        added = r.median_ms - base[r.waiting]
        arm = "vLLM Scheduler" if r.arm == "vllm" else f"Fairway ({r.arm})"
        policy = f"{r.policy_order_ms:.3f}" if r.policy_order_ms is not None else "-"
        lines.append(
            f"| {r.waiting:,} | {arm} | {r.median_ms:.3f} | {r.p90_ms:.3f} | "
            f"{added if r.arm != 'vllm' else 0:+.3f} | {r.median_ms / base[r.waiting]:.2f} | "
            f"{policy} | {r.cold_ms:.1f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000, 5_000])
    parser.add_argument("--policies", nargs="+", default=["fairway", "lpm"])
    parser.add_argument("--steps", type=int, default=40, help="measured steps per arm")
    parser.add_argument("--rounds", type=int, default=4, help="turns each arm takes")
    parser.add_argument("--running", type=int, default=16, help="decoding requests (max_num_seqs)")
    parser.add_argument("--prefixes", type=int, default=40, help="shared cached prefixes")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)

    from fairway.vllm import offline

    results: list[ArmResult] = []
    for n in args.sizes:
        print(f"measuring {n} waiting requests ...", file=sys.stderr, flush=True)
        results += run_size(offline, n, args)
    table = markdown(results)
    print(table)
    report = {
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "block_size": BLOCK_SIZE,
        "prompt_tokens": [PREFIX_TOKENS, PREFIX_TOKENS + SUFFIX_MAX],
        "results": [asdict(r) for r in results],
        "markdown": table,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
