"""The prefix probe's batches for a burst against their one-by-one forms, in one process.

A burst of N arrivals (`scheduler_overhead.py`'s workload: `--prefixes` shared 8,192-token
prefixes, cached, and 1-8,193 uncached tokens after them) is registered in the probe's memo and
looked up for the first time, two ways taking turns (`--turns`, the first form alternating):

  * "memos": `PrefixMemo.add` per request against `PrefixMemo.add_many` (what
    `PrefixProbe._register_noted` calls for a burst);
  * "first lookups": `PrefixMemo._first` per hit against `PrefixMemo._first_many` (what the
    pre-pass after a burst runs, `_probe_pending`).

Each turn builds new vLLM Requests (as a burst brings), so a lookup meets objects it has not read
before. Timing is the CPU time of this thread, with the garbage collector off; the table gives
the best and the median over the turns, in ms per N. The two forms must leave the same memos
(tests/integration/test_probe.py holds them equal); this times them.

Run: `python benchmarks/probe_batch.py [--size 1000] [--turns 16]`.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# Runnable as a plain script from a checkout: the repository root and this folder on the path.
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

FORMS = ("one by one", "batch")


def _timed(call: Callable[[], None]) -> float:
    start = time.thread_time()
    call()
    return time.thread_time() - start


def _turn(memo: Any, requests: list[Any], batch: bool) -> tuple[float, float]:
    """Register `requests` in `memo` and look each up once; (seconds registering, looking up).
    The memos are removed afterwards, so every turn starts from the same memo."""
    slots = list(range(len(requests)))
    arrivals = [r.arrival_time for r in requests]
    tokens = [r.num_tokens for r in requests]
    huge = 2**62  # no request is oversized here

    def register() -> None:
        if batch:
            memo.add_many(requests, slots, arrivals, tokens, huge)
        else:
            for request, slot, arrival, n in zip(requests, slots, arrivals, tokens, strict=True):
                memo.add(request, slot, arrival, n, False)

    added = _timed(register)
    hits = sorted(memo._pending, key=lambda hit: hit.arrival)  # the order the pre-pass takes
    memo._pending.clear()

    def look_up() -> None:
        if batch:
            memo._first_many(hits)
        else:
            for hit in hits:
                memo._first(hit)

    looked = _timed(look_up)
    for slot in slots:
        memo.remove(slot)
    return added, looked


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, tuple[float, float]]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000, help="arrivals in the burst")
    parser.add_argument("--turns", type=int, default=16, help="turns of each form")
    parser.add_argument("--prefixes", type=int, default=40, help="shared cached prefixes")
    args = parser.parse_args(argv)
    if args.size < 1 or args.turns < 1 or args.prefixes < 1:
        parser.error("--size, --turns and --prefixes must be >= 1")

    import scheduler_overhead as harness

    from fairway.vllm import offline

    workload = argparse.Namespace(prefixes=args.prefixes, steps=0, tenants=1,
                                  policies=["fairway"])
    work = harness.Workload(offline, workload, args.size)
    sched = work.scheduler("fairway", max_num_seqs=16, budget=harness.PREFILL_BUDGET, fill=False)
    memo = sched.fairway_probe.memo
    if not memo.incremental:
        raise SystemExit("probe_batch: the memo is not incremental here; nothing to time")
    memo.resize(max(len(memo.hits), args.size))
    times: dict[str, dict[str, list[float]]] = {
        part: {form: [] for form in FORMS} for part in ("memos", "first lookups")
    }
    templates = work.templates[: args.size]
    for turn in range(args.turns):
        forms = FORMS if turn % 2 == 0 else FORMS[::-1]
        for form in forms:
            requests = [work.copy(t, f"{form[0]}{turn}-{k}") for k, t in enumerate(templates)]
            gc.collect()
            gc.disable()
            try:
                added, looked = _turn(memo, requests, batch=form == "batch")
            finally:
                gc.enable()
            times["memos"][form].append(added)
            times["first lookups"][form].append(looked)
    summary = {
        part: {form: (min(v) * 1e3, statistics.median(v) * 1e3) for form, v in by_form.items()}
        for part, by_form in times.items()
    }
    print(f"| {args.size:,} arrivals, {args.turns} turns | best ms | median ms |")
    print("|---|---:|---:|")
    for part, by_form in summary.items():
        for form, (best, median) in by_form.items():
            print(f"| {part}, {form} | {best:.3f} | {median:.3f} |")
    return summary


if __name__ == "__main__":
    main()
