"""`vllm-window`: vLLM 0.34's cache-aware admission window, by hand examples and properties."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairway.errors import FairwayConfigError
from fairway.policies import QueueColumns, QueuedRequest, Step, get
from fairway.policies.base import arrival_order
from fairway.policies.queue import check_permutation
from fairway.policies.vllm_window import VLLMWindowPolicy


def req(rid: str, arrival: float, cached: int, plain: bool = True) -> QueuedRequest:
    return QueuedRequest(rid, float(arrival), 128, cached, plain=plain)


def ids(queue: Sequence[QueuedRequest], order: Sequence[int]) -> list[str]:
    return [queue[i].request_id for i in order]


def columns_order(
    policy: VLLMWindowPolicy, queue: list[QueuedRequest], usage: float | None, ahead: int = 0
) -> list[int]:
    ordering = policy.ordering(QueueColumns.of(queue), Step(0.0, kv_usage=usage, num_ahead=ahead))
    return check_permutation(ordering.order, len(queue)).tolist()


# --- registry and parameters ------------------------------------------------------------------


def test_registered_with_its_flags_and_defaults() -> None:
    policy = get("vllm-window")
    assert type(policy) is VLLMWindowPolicy and policy.name == "vllm-window"
    assert policy.params() == {"window": 64, "threshold": 0.5}
    assert VLLMWindowPolicy.needs_cache_hits and VLLMWindowPolicy.reads_plain
    assert VLLMWindowPolicy.orders_every_step and not VLLMWindowPolicy.stateful
    assert get("vllm-window", window=4, threshold=0).params() == {"window": 4, "threshold": 0}


@pytest.mark.parametrize(
    ("params", "parameter"),
    [
        ({"window": -1}, "window"),
        ({"window": 2.0}, "window"),
        ({"window": True}, "window"),
        ({"window": "8"}, "window"),
        ({"threshold": -0.1}, "threshold"),
        ({"threshold": 1.5}, "threshold"),
        ({"threshold": math.nan}, "threshold"),
        ({"threshold": math.inf}, "threshold"),
        ({"threshold": "0.5"}, "threshold"),
        ({"threshold": False}, "threshold"),
    ],
)
def test_bad_value_is_named(params: dict[str, object], parameter: str) -> None:
    with pytest.raises(FairwayConfigError, match=rf"vllm-window.*\b{parameter} must"):
        get("vllm-window", **params)


# --- hand examples ------------------------------------------------------------------------------


def test_deeper_hits_first_within_the_window_only() -> None:
    queue = [req("a", 0, 0), req("b", 1, 32), req("c", 2, 64), req("d", 3, 96)]
    policy = VLLMWindowPolicy(window=3)
    assert ids(queue, policy.order(queue, 0.0)) == ["c", "b", "a", "d"]
    assert ids(queue, columns_order(policy, queue, 0.9)) == ["c", "b", "a", "d"]


def test_below_the_threshold_the_order_is_kept() -> None:
    queue = [req("a", 0, 0), req("b", 1, 96)]
    policy = VLLMWindowPolicy(window=4, threshold=0.5)
    assert columns_order(policy, queue, 0.49) == [0, 1]
    assert columns_order(policy, queue, 0.5) == [1, 0]  # at the threshold it acts
    assert columns_order(VLLMWindowPolicy(window=4, threshold=0.0), queue, 0.0) == [1, 0]
    assert columns_order(policy, queue, None) == [1, 0]  # unknown: a full cache


def test_positions_of_requests_that_are_not_plain_stay() -> None:
    queue = [req("cold", 0, 0), req("blocked", 1, 112, plain=False), req("warm", 2, 96),
             req("started", 3, 64, plain=False), req("warmer", 4, 112), req("tail", 5, 112)]
    policy = VLLMWindowPolicy(window=5, threshold=0.0)
    expected = ["warmer", "blocked", "warm", "started", "cold", "tail"]
    assert ids(queue, policy.order(queue, 0.0)) == expected
    assert ids(queue, columns_order(policy, queue, 0.7)) == expected


def test_requests_ahead_of_the_rows_take_window_positions() -> None:
    queue = [req("a", 0, 0), req("b", 1, 16), req("c", 2, 96)]
    policy = VLLMWindowPolicy(window=3, threshold=0.0)
    assert columns_order(policy, queue, 1.0, ahead=0) == [2, 1, 0]
    assert columns_order(policy, queue, 1.0, ahead=1) == [1, 0, 2]
    assert columns_order(policy, queue, 1.0, ahead=3) == [0, 1, 2]
    assert policy.reference(queue, 1.0, 1) == [1, 0, 2]


def test_equal_hits_keep_queue_position_not_arrival() -> None:
    """vLLM breaks ties by the position in its deque, which an earlier re-sort may have set
    against arrival order; the rows are the deque's order."""
    queue = [req("younger", 5, 64), req("older", 1, 64), req("cold", 0, 0)]
    policy = VLLMWindowPolicy(window=8, threshold=0.0)
    assert ids(queue, columns_order(policy, queue, 1.0)) == ["younger", "older", "cold"]
    # and below the threshold the deque's order stays: arrival order is not restored
    assert ids(queue, columns_order(VLLMWindowPolicy(threshold=0.9), queue, 0.1)) == [
        "younger", "older", "cold",
    ]


def test_window_zero_and_short_queues_keep_the_order() -> None:
    queue = [req("a", 0, 0), req("b", 1, 96)]
    assert columns_order(VLLMWindowPolicy(window=0, threshold=0.0), queue, 1.0) == [0, 1]
    assert columns_order(VLLMWindowPolicy(window=1, threshold=0.0), queue, 1.0) == [0, 1]
    assert columns_order(VLLMWindowPolicy(threshold=0.0), queue[:1], 1.0) == [0]
    assert columns_order(VLLMWindowPolicy(threshold=0.0), [], 1.0) == []


def test_plain_flags_round_trip_through_the_columns() -> None:
    queue = [req("a", 0, 0), req("b", 1, 32, plain=False)]
    cols = QueueColumns.of(queue)
    assert cols.views() == queue
    assert cols.plain_of([1, 0]).tolist() == [False, True]
    every = QueueColumns.of([req("a", 0, 0)])
    assert every.plain_source is None and every.plain_of([0]).tolist() == [True]


# --- properties -----------------------------------------------------------------------------------


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[QueuedRequest], int, float, float | None, int]:
    """A queue (rows in some deque order; hits from a few values so that ties are common, some
    requests not plain), a window, a threshold, a usage (maybe unknown) and the rows ahead."""
    n = draw(st.integers(0, 30))
    queue = [
        QueuedRequest(
            f"r{i}", draw(st.floats(0, 100, allow_nan=False)), 256,
            draw(st.sampled_from([0, 16, 64, 128, 255])), plain=draw(st.booleans() | st.just(True)),
        )
        for i in range(n)
    ]
    if draw(st.booleans()):  # a queue nobody re-sorted yet: arrival order
        queue.sort(key=lambda r: r.arrival)
    window = draw(st.integers(0, 40))
    threshold = draw(st.sampled_from([0.0, 0.5, 1.0]) | st.floats(0, 1))
    usage = draw(st.none() | st.sampled_from([0.0, 0.5, 1.0]) | st.floats(0, 1))
    ahead = draw(st.integers(0, 4))
    return queue, window, threshold, usage, ahead


@settings(max_examples=300, deadline=None)
@given(case=cases())
def test_rule_properties(case: tuple[list[QueuedRequest], int, float, float | None, int]) -> None:
    queue, window, threshold, usage, ahead = case
    policy = VLLMWindowPolicy(window=window, threshold=threshold)
    order = columns_order(policy, queue, usage, ahead)
    n = len(queue)
    assert sorted(order) == list(range(n))  # a permutation
    assert order == policy.reference(queue, usage, ahead)  # the columns path is the rule
    if usage is not None and usage < threshold:
        assert order == list(range(n))  # the queue's order: FCFS where the rows arrive so
        if [r.arrival for r in queue] == sorted(r.arrival for r in queue):
            assert order == arrival_order(queue)
        return
    width = min(n, max(window - ahead, 0))
    for position in range(n):  # past the window, and requests not plain, keep their position
        if position >= width or not queue[position].plain:
            assert order[position] == position
    slots = [p for p in range(width) if queue[p].plain]
    placed = [order[p] for p in slots]
    assert sorted(placed) == slots  # the plain slots hold the same plain requests
    keys = [(-queue[i].cached_tokens, i) for i in placed]
    assert keys == sorted(keys)  # by h descending, the earlier queue position first


@settings(max_examples=100, deadline=None)
@given(case=cases())
def test_order_is_the_rule_with_the_window_applied(
    case: tuple[list[QueuedRequest], int, float, float | None, int],
) -> None:
    queue, window, threshold, _, _ = case
    policy = VLLMWindowPolicy(window=window, threshold=threshold)
    assert policy.order(queue, 0.0) == policy.reference(queue, None, 0)
    assert policy.order(queue, 0.0) == columns_order(policy, queue, None)


def test_only_the_window_rows_are_read() -> None:
    """The plain flags are read for the window's rows only (each a read of the engine's request)."""
    asked: list[list[int]] = []
    queue = [req(f"r{i}", i, 16 * (i % 4)) for i in range(100)]
    cols = QueueColumns.of(queue)

    def source(rows: np.ndarray) -> np.ndarray:
        asked.append(rows.tolist())
        return np.ones(len(rows), dtype=bool)

    cols.plain_source = source
    VLLMWindowPolicy(window=8, threshold=0.0).ordering(cols, Step(0.0, kv_usage=1.0))
    assert asked == [list(range(8))]
