"""The calls of `fairway`'s step that issue 30's fifth pass shortened, each in its form before and
after, timed alone (best of `--repeat` x `--number` calls, `timeit`).

- `fair_lane_head` over shuffled arrivals (the harness's backlog), 20 rows: the lane-head bound
  from the queue's first rows only (`lanes.SAMPLE = 1`: no sample) against both bounds;
- the running prefills' Fast scores: columns of their views and `scores` against
  `FastLanePolicy.running_scores` (three prefills);
- their place in the Fast lane: a numpy count over the lane's rows per prefill (the form before,
  kept here) against `_with_running`'s binary search (19 rows, three prefills);
- `check_order` of a 12-row head: the built `head_order` checked whole against a `HeadOrder`.

The numbers in fairway/'s speed comments and docs/results.md ("Fewer numpy calls per step") come
from this script. Run: `python benchmarks/call_costs.py [--sizes 1000 10000]`.
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

# Runnable as a plain script from a checkout: the repository root on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if TYPE_CHECKING:
    from fairway.policies import PrefillingRequest


def _counted_running(fast_rows: np.ndarray, scores: np.ndarray, arrival: np.ndarray,
                     run_scores: list[float], running: Sequence[PrefillingRequest]) -> list[int]:
    """`_with_running`'s form before: a numpy count of the rows ahead of each prefill."""
    rows = fast_rows.tolist()
    neg, arr = -scores[fast_rows], arrival[fast_rows]
    keyed = sorted((-s, r.arrival, j) for j, (s, r) in enumerate(zip(run_scores, running,
                                                                      strict=True)))
    out: list[int] = []
    start = 0
    for key_score, key_arrival, j in keyed:
        ahead = int(np.count_nonzero((neg < key_score) | ((neg == key_score)
                                                          & (arr < key_arrival))))
        if ahead > start:
            out.extend(rows[start:ahead])
            start = ahead
        out.append(-(j + 1))
    out.extend(rows[start:])
    return out


def _best_us(call: Callable[[], object], number: int, repeat: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6


def main(argv: Sequence[str] | None = None) -> list[tuple[str, int, float, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--number", type=int, default=2_000, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=5, help="timings per form (best kept)")
    args = parser.parse_args(argv)
    if min(args.sizes) < 40 or args.number < 1 or args.repeat < 1:
        parser.error("--sizes must be >= 40, --number and --repeat >= 1")

    from fairway.policies import PrefillingRequest, QueueColumns, get, lanes
    from fairway.policies.fairway import _with_running
    from fairway.policies.queue import HeadOrder, check_order, head_order

    rng = np.random.default_rng(0)
    policy = get("fairway")
    running = [PrefillingRequest(f"p{i}", float(i), 4_000 + i, 12_000) for i in range(3)]
    rows: list[tuple[str, int, float, float]] = []

    def time_pair(name: str, size: int, before: Callable[[], object],
                  after: Callable[[], object]) -> None:
        rows.append((name, size, _best_us(before, args.number, args.repeat),
                     _best_us(after, args.number, args.repeat)))

    def first_rows_only(arrival: np.ndarray) -> np.ndarray:
        sample, lanes.SAMPLE = lanes.SAMPLE, 1
        try:
            return lanes.fair_lane_head(arrival, 20)
        finally:
            lanes.SAMPLE = sample

    for size in args.sizes:
        arrival = rng.permutation(size).astype(np.float64)
        assert first_rows_only(arrival).tolist() == lanes.fair_lane_head(arrival, 20).tolist()
        time_pair("fair_lane_head, 20 rows of shuffled arrivals", size,
                  lambda arrival=arrival: first_rows_only(arrival),
                  lambda arrival=arrival: lanes.fair_lane_head(arrival, 20))
        head = rng.choice(size, 12, replace=False).tolist()
        time_pair("check_order of a 12-row head", size,
                  lambda head=head, size=size: check_order(head_order(head, size), size),
                  lambda head=head, size=size: check_order(HeadOrder(head, size), size))
    time_pair("running prefills' scores (3)", 3,
              lambda: policy.scores(QueueColumns.of([p.view() for p in running]), 100.0).tolist(),
              lambda: policy.running_scores(running, 100.0))
    scores, arrival = rng.random(1_000) * 3, rng.random(1_000) * 100
    fast_rows = np.argsort(-scores)[:19]
    run_scores = policy.running_scores(running, 100.0)
    assert (_counted_running(fast_rows, scores, arrival, run_scores, running)
            == _with_running(fast_rows, scores, arrival, run_scores, running))
    time_pair("running prefills' places in the Fast lane (19 rows, 3)", 19,
              lambda: _counted_running(fast_rows, scores, arrival, run_scores, running),
              lambda: _with_running(fast_rows, scores, arrival, run_scores, running))

    print(f"| call (best of {args.repeat} x {args.number}) | size | before us | after us |")
    print("|---|---:|---:|---:|")
    for name, size, before, after in rows:
        print(f"| {name} | {size:,} | {before:.1f} | {after:.1f} |")
    return rows


if __name__ == "__main__":
    main()
