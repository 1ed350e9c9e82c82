"""fairway-step's engine path (`ordering`) equals its plain-Python rule (`order`).

The scheduler orders only the positions vLLM's scan can reach (`Step.head`); these tests prove
that head equals `order()`'s (ties in scores and arrivals, unprobed h = 0, huge and tiny work),
that the rest is the other rows in row order, and that the lane labels of the head are the full
order's.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairway.policies import UNPLACED_LANE, QueueColumns, QueuedRequest, Step, get
from fairway.profiling.table import from_points

PROFILE = from_points([(512, 0.05), (4096, 0.4), (16384, 2.0)])

# Few distinct values, so that scores and arrivals tie often.
_LENGTHS = st.sampled_from([1, 2, 16, 300, 6000, 6300, 16384, 10**9])
_ARRIVALS = st.sampled_from([0.0, 0.0, 0.5, 1.0, 1.0, 2.5, 3.0])


@st.composite
def queues(draw: st.DrawFn) -> list[QueuedRequest]:
    n = draw(st.integers(0, 24))
    queue = []
    for k in range(n):
        length = draw(_LENGTHS)
        cached = draw(st.sampled_from([0, 0, length // 2, max(length - 1, 0), length]))
        queue.append(QueuedRequest(f"r{k}", draw(_ARRIVALS), length, cached))
    return queue


POLICIES = [
    ("fairway-step", {}),
    ("fairway-step", {"profile": PROFILE}),
    ("fairway-step", {"fast_weight": 1.0}),
    ("fairway-abswait", {}),
    ("fairway-nofair", {"profile": PROFILE}),
]


@settings(max_examples=300, deadline=None)
@given(queue=queues(), which=st.integers(0, len(POLICIES) - 1), now=st.sampled_from([3.0, 7.25]))
def test_the_head_is_the_reference_orders_head_then_row_order(
    queue: list[QueuedRequest], which: int, now: float
) -> None:
    name, params = POLICIES[which]
    policy = get(name, **params)
    full, full_lanes = policy.order_with_lanes(queue, now)
    n = len(queue)
    for head in range(n + 2):
        ordering = policy.ordering(QueueColumns.of(queue), Step(now, head))
        got = np.asarray(ordering.order)
        k = min(head, n)
        assert sorted(got.tolist()) == list(range(n))  # a permutation
        assert got[:k].tolist() == full[:k]
        tail = got[k:].tolist()
        assert tail == sorted(tail)  # the other rows in row order
        assert list(ordering.lanes) == full_lanes[:k] + [UNPLACED_LANE] * (n - k)


@settings(max_examples=100, deadline=None)
@given(queue=queues(), now=st.sampled_from([3.0, 7.25]))
def test_columns_order_equals_views_order(queue: list[QueuedRequest], now: float) -> None:
    policy = get("fairway-step", profile=PROFILE)
    ordering = policy.ordering(QueueColumns.of(queue), Step(now))
    assert (list(ordering.order), ordering.lanes) == policy.order_with_lanes(queue, now)


def test_all_tied_queue_keeps_queue_position() -> None:
    queue = [QueuedRequest(f"r{k}", 1.0, 100, 0) for k in range(10)]
    policy = get("fairway-step")
    order, lanes = policy.order_with_lanes(queue, 2.0)
    assert order == list(range(10))
    ordering = policy.ordering(QueueColumns.of(queue), Step(2.0, 3))
    assert np.asarray(ordering.order).tolist() == list(range(10))
    assert ordering.lanes == lanes[:3] + [UNPLACED_LANE] * 7


def test_worked_example_head_of_two() -> None:
    miss = QueuedRequest("M", arrival=0.0, prompt_tokens=6000, cached_tokens=0)
    hits = [QueuedRequest(f"H{k}", 0.001 * k, 6300, 6000) for k in range(1, 6)]
    queue = [*hits, miss]  # the miss last in the queue, first by arrival
    policy = get("fairway-step")
    got = policy.ordering(QueueColumns.of(queue), Step(0.01, 2))
    assert [queue[i].request_id for i in got.order] == ["H1", "H2", "H3", "H4", "H5", "M"]
    assert got.lanes == ["fast", "fast"] + [UNPLACED_LANE] * 4
    got = policy.ordering(QueueColumns.of(queue), Step(0.01, 6))
    assert [queue[i].request_id for i in got.order] == ["H1", "H2", "H3", "H4", "H5", "M"]
    assert got.lanes == ["fast"] * 5 + ["fair"]


@pytest.mark.parametrize("name", ["lpm", "fcfs", "klpm"])
def test_policies_without_a_head_path_give_the_full_order(name: str) -> None:
    queue = [QueuedRequest(f"r{k}", float(k), 100, 50 * (k % 2)) for k in range(6)]
    full = get(name).order(queue, 10.0)
    got = get(name).ordering(QueueColumns.of(queue), Step(10.0, 1)).order
    assert np.asarray(got).tolist() == list(full)
