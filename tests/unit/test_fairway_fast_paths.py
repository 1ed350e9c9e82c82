"""The fast paths of the Fairway lanes against the plain forms they must equal.

The engine path runs before every step over 1,000s of waiting requests: scores as numpy columns
(`FastLanePolicy.scores`) and the lane's head by a partition of the scores themselves (not of
their negation). Each must give exactly what the plain form gives (bit for bit: the merge
compares these numbers). The plain forms are the reference: `fast_score` in the policy, the
negated selection here.
"""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairway.policies import PrefillingRequest, QueueColumns, get
from fairway.policies.lanes import (
    LEAD_MIN,
    SAMPLE,
    HeadBound,
    fair_lane_head,
    fast_lane_head,
    kth_largest,
    kth_smallest,
    largest_rows,
    smallest_rows,
)
from fairway.profiling.table import from_points


def _ref_top(key: np.ndarray, head: int) -> np.ndarray:
    n = len(key)
    if head >= n:
        return np.arange(n)
    threshold = key[np.argpartition(key, head - 1)[head - 1]]
    return np.flatnonzero(key <= threshold)


def _ref_lane_head(scores: np.ndarray, arrival: np.ndarray, head: int) -> np.ndarray:
    neg = -scores
    top = _ref_top(neg, head)
    return top[np.lexsort((arrival[top], neg[top]))][:head]


def _at_sample(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`values` with the rows the bound's sample reads (every n // SAMPLE-th from the first,
    `fairway.policies.lanes._bounds`) set to the smallest and largest values."""
    sampled = values[:: max(1, len(values) // SAMPLE)]
    sampled[:] = rng.choice([-1.0, 5.0], len(sampled)) * rng.random(len(sampled))
    return values


def _bits(values: object) -> bytes:
    return np.asarray(values, dtype=np.float64).tobytes()


prefills = st.lists(
    st.builds(
        lambda i, arrival, remaining, computed: PrefillingRequest(
            f"p{i}", arrival, remaining, remaining + computed
        ),
        st.integers(0, 99),
        st.one_of(st.floats(0, 100, allow_nan=False), st.integers(0, 100)),
        st.integers(1, 40_000),
        st.integers(0, 40_000),
    ),
    max_size=12,
)


@settings(max_examples=400, deadline=None)
@given(
    prefilling=prefills,
    now=st.one_of(st.floats(0, 120, allow_nan=False), st.integers(0, 120)),
    profiled=st.booleans(),
    floor=st.sampled_from([0.25, 1.0, 3.0]),
)
@example(prefilling=[PrefillingRequest("p", 5.0, 1, 1)], now=5.0, profiled=False, floor=1.0)
def test_column_scores_equal_the_scalar_rule(prefilling, now, profiled, floor) -> None:
    """numpy's elementwise float64 results are the scalar rule's (`fast_score`), for running
    prefills (computed tokens as the cached part) as for waiting requests; T(L) from the
    profile."""
    profile = from_points([(1000, 0.2), (8000, 4 / 3), (32000, 9.0)]) if profiled else None
    for name in ("fairway", "fairway-step", "fairway-abswait"):
        policy = get(name, profile=profile, patience_floor_s=floor)
        views = [p.view() for p in prefilling]
        got = policy.scores(QueueColumns.of(views), now) if views else []
        want = [policy.fast_score(view, now) for view in views]
        assert _bits(got) == _bits(want)
        if prefilling:  # the running prefills' scores without their views' columns
            assert _bits(policy.running_scores(prefilling, now)) == _bits(want)


keys = st.lists(st.sampled_from([0.0, -0.0, 0.5, 1.0, 1.0 + 2**-52, 3.0, 7.25, 1e9]), max_size=60)


@settings(max_examples=500, deadline=None)
@given(scores=keys, arrival_ties=st.booleans(), head=st.integers(0, 64), data=st.data())
def test_lane_head_equals_the_negated_selection(scores, arrival_ties, head, data) -> None:
    """The partition of the scores for their highest keeps the rows the partition of their
    negation for its lowest kept, in the same lane order, ties and signed zeros included."""
    s = np.array(scores, dtype=np.float64)
    times = st.sampled_from([0.0, 1.0]) if arrival_ties else st.floats(0, 10, allow_nan=False)
    arrival = np.array(data.draw(st.lists(times, min_size=len(s), max_size=len(s))), np.float64)
    assert fast_lane_head(s, arrival, head).tolist() == _ref_lane_head(s, arrival, head).tolist()
    assert smallest_rows(s, head).tolist() == _ref_top(s, head).tolist()


def _plain_kth(values: np.ndarray, k: int) -> float:
    part = values.copy()
    part.partition(k)
    return float(part[k])


def _shaped(shape: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """n values of a queue column, in one of `SHAPES`."""
    return {
        "random": lambda: rng.random(n),
        "ascending": lambda: np.sort(rng.random(n)),
        "descending": lambda: np.sort(rng.random(n))[::-1].copy(),
        "ties": lambda: rng.choice([0.0, -0.0, 0.5, 1.0], n),
        "nan": lambda: rng.choice([0.0, 1.0, 2.0, np.nan], n),
        "inf": lambda: rng.choice([-np.inf, 0.0, 3.0, np.inf], n),
        # the last step's head moved to the front: its smallest and largest values first
        "front": lambda: np.concatenate([[-1.0, 2.0] * 20, rng.random(n)])[:n],
        # the smallest and largest values just where the sample reads: it bounds too few
        "sampled": lambda: _at_sample(rng.random(n) + 1.0, rng),
    }[shape]()


SHAPES = ["random", "ascending", "descending", "ties", "nan", "inf", "front", "sampled"]


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 3_000), shape=st.sampled_from(SHAPES),
       data=st.data())
def test_the_bound_keeps_the_kth_value(seed, n, shape, data) -> None:
    """`kth_smallest` / `kth_largest` partition only the values within a bound taken from the
    first rows or a sample (queues over `LEAD_MIN`): the same value as partitioning them all,
    whatever the order of the rows, ties, signed zeros, infinities and NaN (sorted last)
    included."""
    values = _shaped(shape, n, np.random.default_rng(seed))
    k = data.draw(st.integers(0, n - 1), label="k")
    got, want = kth_smallest(values, k), _plain_kth(values, k)
    assert got == want or (np.isnan(got) and np.isnan(want))
    got, want = kth_largest(values, k + 1), _plain_kth(values, n - k - 1)
    assert got == want or (np.isnan(got) and np.isnan(want))


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 3_000), shape=st.sampled_from(SHAPES),
       data=st.data())
def test_the_bounded_rows_are_the_rows_of_the_kth_value(seed, n, shape, data) -> None:
    """`smallest_rows` / `largest_rows` (the lanes' heads) keep, from the values within a bound,
    exactly the rows at or past the k-th value of all of them, in row order: whatever the order
    of the rows (the bound from the first rows, or from a sample), ties, infinities and NaN."""
    values = _shaped(shape, n, np.random.default_rng(seed))
    head = data.draw(st.one_of(st.integers(1, min(n - 1, 80)), st.integers(1, n - 1)),
                     label="head")
    smallest = np.flatnonzero(values <= _plain_kth(values, head - 1))
    assert smallest_rows(values, head).tolist() == smallest.tolist()
    largest = np.flatnonzero(values >= _plain_kth(values, n - head))
    assert largest_rows(values, head).tolist() == largest.tolist()


def test_the_bound_is_taken_on_a_long_queue() -> None:
    """On a long queue the last partition, the one that finds the value, runs over a few values,
    not all of them (the bound is in use, not only correct): on a queue whose first rows hold
    its smallest (largest) values (the bound from the first rows), and on a shuffled one (the
    bound from a sample); the partitions that find the bounds read at most 2 x SAMPLE values."""
    seen: list[int] = []

    class Spy(np.ndarray):
        def partition(self, kth, *args, **kwargs):  # type: ignore[override]
            seen.append(len(self))
            return super().partition(kth, *args, **kwargs)

    def last_partition(select, values: np.ndarray, k: int) -> tuple[float, int]:
        seen.clear()
        got = select(values.view(Spy), k)
        assert seen and max(seen[:-1], default=0) <= 2 * SAMPLE
        return got, seen[-1]

    rest = np.full(5_000, 100.0)
    assert len(rest) > LEAD_MIN
    oldest_first = np.concatenate([np.arange(40.0), rest])
    assert last_partition(kth_smallest, oldest_first, 9) == (9.0, 10)
    best_first = np.concatenate([np.arange(1_000.0, 1_040.0), rest])
    assert last_partition(kth_largest, best_first, 10) == (1_030.0, 30)
    shuffled = np.random.default_rng(7).permutation(10_000).astype(np.float64)
    got, read = last_partition(kth_smallest, shuffled, 19)
    assert got == 19.0 and 20 <= read <= len(shuffled) // 16
    got, read = last_partition(kth_largest, shuffled, 20)
    assert got == 9_980.0 and 20 <= read <= len(shuffled) // 16


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 1_500), shape=st.sampled_from(SHAPES),
       steps=st.integers(1, 12), data=st.data())
def test_a_kept_bound_finds_the_same_lane_heads(seed, n, shape, steps, data) -> None:
    """Lane heads found through `HeadBound`s kept from step to step are the heads selected
    afresh, while the queue changes between steps as the engine changes it: the heads leave,
    requests arrive (older or younger than any waiting), every score rises with its wait, a hit
    grows or shrinks; ties, infinities and NaN included (the bound is a filter only)."""
    rng = np.random.default_rng(seed)
    scores = _shaped(shape, n, rng)
    arrival = _shaped(shape, n, rng)
    fair_bound, fast_bound = HeadBound(), HeadBound()
    for _ in range(steps):
        head = data.draw(st.integers(0, len(scores) + 2), label="head")
        fair = fair_lane_head(arrival, head, fair_bound)
        fast = fast_lane_head(scores, arrival, head, fast_bound)
        assert fair.tolist() == fair_lane_head(arrival, head).tolist()
        assert fast.tolist() == fast_lane_head(scores, arrival, head).tolist()
        change = data.draw(st.sampled_from(["admit", "arrive", "wait", "hit", "shuffle"]))
        keep = np.ones(len(scores), dtype=bool)
        if change == "admit":  # a few of either head leave
            keep[np.concatenate([fair[:3], fast[:3]])] = False
        scores, arrival = scores[keep], arrival[keep]
        if change == "arrive":
            k = data.draw(st.integers(1, 40), label="arrivals")
            scores = np.concatenate([scores, _shaped(shape, k, rng)])
            arrival = np.concatenate([arrival, _shaped(shape, k, rng) * 2 - 0.5])
        elif change == "wait":
            scores = scores + rng.random(len(scores))
        elif change == "hit" and len(scores):
            scores = scores.copy()
            scores[rng.integers(len(scores))] = rng.choice([-1.0, 0.5, 4.0, np.nan])
        elif change == "shuffle":
            order = rng.permutation(len(scores))
            scores, arrival = scores[order], arrival[order]
        if not len(scores):
            break
