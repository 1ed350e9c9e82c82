"""FairwayStepPolicy (`fairway-step`, the paper's rule): the worked example, the lane scores, the
work-charge bound and its ablations."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairway.errors import FairwayConfigError
from fairway.policies import QueuedRequest, get
from fairway.policies.fairway_step import FairwayStepPolicy
from fairway.profiling.table import from_points

STEP_BUDGET = 2048


def admit(queue: list[QueuedRequest], order: list[int], budget: int) -> list[tuple[str, int]]:
    """vLLM's admission in a given order: whole requests while they fit, then one chunk."""
    scheduled = []
    for i in order:
        if budget <= 0:
            break
        tokens = min(queue[i].remaining, budget)
        scheduled.append((queue[i].request_id, tokens))
        budget -= tokens
    return scheduled


def worked_example() -> list[QueuedRequest]:
    miss = QueuedRequest("M", arrival=0.0, prompt_tokens=6000, cached_tokens=0)
    hits = [
        QueuedRequest(f"H{k}", arrival=0.001 * k, prompt_tokens=6300, cached_tokens=6000)
        for k in range(1, 6)
    ]
    return [miss, *hits]


def test_worked_example_orders_hits_then_miss() -> None:
    queue = worked_example()
    policy = get("fairway-step")
    order, lanes = policy.order_with_lanes(queue, now=0.01)
    assert [queue[i].request_id for i in order] == ["H1", "H2", "H3", "H4", "H5", "M"]
    assert lanes == ["fast"] * 5 + ["fair"]


def test_worked_example_work_ahead_of_miss_is_a_quarter_and_m_gets_548() -> None:
    queue = worked_example()
    order = get("fairway-step").order(queue, now=0.01)
    ahead = sum(queue[i].remaining for i in order[: order.index(0)])
    assert ahead == 1500 == queue[0].remaining // 4
    assert admit(queue, order, STEP_BUDGET) == [
        ("H1", 300), ("H2", 300), ("H3", 300), ("H4", 300), ("H5", 300), ("M", 548)
    ]


def test_sixth_hit_goes_after_the_miss() -> None:
    queue = [*worked_example(), QueuedRequest("H6", 0.006, 6300, 6000)]
    order = get("fairway-step").order(queue, now=0.01)
    assert [queue[i].request_id for i in order] == ["H1", "H2", "H3", "H4", "H5", "M", "H6"]


def test_equal_cache_shorter_remaining_goes_first() -> None:
    """A/B example: same cached prefix, A has 300 left and B 3,000: A has the higher score."""
    a = QueuedRequest("A", arrival=0.0, prompt_tokens=3300, cached_tokens=3000)
    b = QueuedRequest("B", arrival=0.0, prompt_tokens=6000, cached_tokens=3000)
    policy = FairwayStepPolicy(fair_lane=False)
    assert policy.fast_score(a, 0.0) == pytest.approx(10.0)
    assert policy.fast_score(b, 0.0) == pytest.approx(1.0)
    assert policy.order([b, a], now=0.0) == [1, 0]


def test_relative_wait_term_uses_each_requests_patience() -> None:
    """Both waited 2 s; patience 1 s (short) vs 4 s (long): second terms 2 and 0.5."""
    profile = from_points([(1000, 0.2), (8000, 4 / 3)])  # 3 x T(8000) = 4 s; 3 x T(1000) < floor
    policy = FairwayStepPolicy(profile=profile)
    short = QueuedRequest("short", arrival=0.0, prompt_tokens=1000, cached_tokens=0)
    long = QueuedRequest("long", arrival=0.0, prompt_tokens=8000, cached_tokens=0)
    assert policy.patience_s(1000) == pytest.approx(1.0)
    assert policy.patience_s(8000) == pytest.approx(4.0)
    assert policy.fast_score(short, now=2.0) == pytest.approx(2.0)
    assert policy.fast_score(long, now=2.0) == pytest.approx(0.5)


def test_absolute_wait_ablation_ignores_prompt_length() -> None:
    profile = from_points([(1000, 0.2), (8000, 4 / 3)])
    policy = get("fairway-abswait", profile=profile)
    long = QueuedRequest("long", arrival=0.0, prompt_tokens=8000, cached_tokens=0)
    assert policy.fast_score(long, now=2.0) == pytest.approx(2.0)  # 2 s / 1 s floor


def test_nofair_ablation_is_the_fast_lane_alone() -> None:
    queue = [*worked_example(), *(QueuedRequest(f"X{k}", 0.01, 6300, 6000) for k in range(6))]
    policy = get("fairway-nofair")
    order, lanes = policy.order_with_lanes(queue, now=0.02)
    assert order[-1] == 0  # the miss waits behind every hit
    assert set(lanes) == {"fast"}


def test_waiting_long_enough_lifts_a_miss_into_the_fast_lane() -> None:
    miss = QueuedRequest("M", arrival=0.0, prompt_tokens=6000, cached_tokens=0)
    hit = QueuedRequest("H", arrival=100.0, prompt_tokens=6300, cached_tokens=6000)
    policy = FairwayStepPolicy(fair_lane=False)  # patience = 1 s floor without a profile
    assert policy.order([miss, hit], now=100.0) == [0, 1]  # 100 > 20 + 0


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"fast_weight": 0}, "fast_weight"),
        ({"fast_weight": -1}, "fast_weight"),
        ({"patience_multiplier": float("nan")}, "patience_multiplier"),
        ({"patience_floor_s": float("inf")}, "patience_floor_s"),
        ({"wait_mode": "seconds"}, "wait_mode"),
        ({"fair_lane": "yes"}, "fair_lane"),
        ({"profile": 3}, "profile"),
        ({"fast_wieght": 4}, "fast_wieght"),
    ],
)
def test_bad_options_name_the_parameter(params: dict, needle: str) -> None:
    with pytest.raises(FairwayConfigError, match=needle):
        get("fairway-step", **params)


def test_defaults_are_frozen_paper_values() -> None:
    policy = get("fairway-step")
    assert (policy.fast_weight, policy.patience_multiplier, policy.patience_floor_s) == (4, 3, 1.0)
    assert policy.params()["wait_mode"] == "relative"


queues = st.lists(
    st.builds(
        lambda i, arrival, prompt, frac: QueuedRequest(
            f"r{i}", arrival, prompt, int(prompt * frac)
        ),
        st.integers(0, 10**6),
        st.floats(0, 100, allow_nan=False),
        st.integers(0, 20000),
        st.floats(0, 1),
    ),
    min_size=1,
    max_size=60,
).map(lambda rs: [QueuedRequest(f"q{k}", r.arrival, r.prompt_tokens, r.cached_tokens)
                  for k, r in enumerate(rs)])


@settings(max_examples=300, deadline=None)
@given(queue=queues, now=st.floats(0, 200), weight=st.sampled_from([1, 2, 4, 8]))
def test_bound_on_work_ahead_of_the_oldest(queue, now, weight) -> None:
    policy = FairwayStepPolicy(fast_weight=weight)
    order = policy.order(queue, now)
    assert sorted(order) == list(range(len(queue)))
    oldest = min(range(len(queue)), key=lambda i: (queue[i].arrival, i))
    ahead = sum(queue[i].remaining for i in order[: order.index(oldest)])
    max_single = max(r.remaining for r in queue)
    assert ahead <= queue[oldest].remaining / weight + max_single


@settings(max_examples=200, deadline=None)
@given(queue=queues, now=st.floats(0, 200))
def test_scores_are_finite(queue, now) -> None:
    policy = get("fairway-step", profile="a6000-llama3.1-8b-estimate")
    assert all(math.isfinite(policy.fast_score(r, now)) for r in queue)


def test_edge_cases_zero_length_and_fully_cached() -> None:
    queue = [
        QueuedRequest("empty", 0.0, 0, 0),
        QueuedRequest("full", 0.0, 512, 512),
        QueuedRequest("miss", 0.0, 512, 0),
    ]
    policy = get("fairway-step")
    assert sorted(policy.order(queue, 1.0)) == [0, 1, 2]
    assert policy.fast_score(queue[1], 1.0) == pytest.approx(512 + 1.0)
    assert policy.order(queue[:1], 0.0) == [0]
    assert policy.order([], 0.0) == []
