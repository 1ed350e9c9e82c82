"""The table step-time model: o + sum(C(end) - C(start)) with C(L) = T(L) - o."""

from __future__ import annotations

import numpy as np
import pytest

from fairway.errors import ProfileError
from fairway.profiling.step_time import TableStepTime, profile_overhead_s
from fairway.profiling.table import default_profile, from_points

# A convex toy table (superlinear, like attention): T(L) = 0.01 + L/1e4 + (L/1e4)^2.
POINTS = [(n, 0.01 + n / 1e4 + (n / 1e4) ** 2) for n in (100, 1_000, 2_000, 4_000, 8_000)]


@pytest.fixture()
def table():
    return from_points(POINTS, constants={"overhead_s": 0.01})


def t_of(n: int) -> float:
    return dict(POINTS)[n]


def test_overhead_from_metadata_or_zero(table):
    assert TableStepTime(table).overhead_s == 0.01
    assert TableStepTime(from_points(POINTS)).overhead_s == 0.0
    assert TableStepTime(table, step_overhead_s=0.002).overhead_s == 0.002
    assert profile_overhead_s(default_profile()) == 0.015


@pytest.mark.parametrize("overhead", [-0.001, 0.5, float("nan")])
def test_overhead_out_of_range_is_refused(table, overhead):
    with pytest.raises(ProfileError, match="step_overhead_s"):
        TableStepTime(table, step_overhead_s=overhead)


@pytest.mark.parametrize("n", [100, 1_000, 2_000, 4_000, 8_000])
@pytest.mark.parametrize("overhead", [None, 0.0, 0.005])
def test_single_whole_prompt_costs_its_table_time(table, n, overhead):
    cost = TableStepTime(table, step_overhead_s=overhead)
    assert cost.step_time_s([(0, n)]) == pytest.approx(t_of(n), rel=1e-12, abs=0)


def test_interpolates_between_points_and_extrapolates_linearly(table):
    cost = TableStepTime(table)
    mid = (t_of(1_000) + t_of(2_000)) / 2
    assert cost.step_time_s([(0, 1_500)]) == pytest.approx(mid, rel=1e-12)
    slope = (t_of(8_000) - t_of(4_000)) / 4_000
    assert cost.step_time_s([(0, 10_000)]) == pytest.approx(t_of(8_000) + 2_000 * slope, rel=1e-12)


def test_below_first_point_work_is_linear_from_zero(table):
    cost = TableStepTime(table)
    assert cost.work_s(0) == 0.0
    assert cost.work_s(50) == pytest.approx((t_of(100) - 0.01) / 2, rel=1e-12)
    assert cost.step_time_s([(0, 50)]) == pytest.approx(0.01 + (t_of(100) - 0.01) / 2, rel=1e-12)


def test_two_requests_share_one_overhead(table):
    cost = TableStepTime(table)
    o = 0.01
    expected = o + (t_of(1_000) - o) + (t_of(100) - o)
    assert cost.step_time_s([(0, 1_000), (0, 100)]) == pytest.approx(expected, rel=1e-12)
    step = cost.step_time_s
    assert step([(0, 1_000), (0, 100)]) < step([(0, 1_000)]) + step([(0, 100)])


def test_chunk_after_cached_prefix_costs_the_difference(table):
    cost = TableStepTime(table)
    # 1,000 new tokens after a 4,000-token cached prefix: o + C(5,000) - C(4,000), and T is
    # linear between the points 4,000 and 8,000, so C(5,000) - C(4,000) = (T(8k) - T(4k)) / 4.
    expected = 0.01 + (t_of(8_000) - t_of(4_000)) / 4
    assert cost.step_time_s([(4_000, 5_000)]) == pytest.approx(expected, rel=1e-12)
    # Superlinear: dearer than the same 1,000 tokens from position 0, cheaper than the whole.
    step = cost.step_time_s
    assert step([(0, 1_000)]) < step([(4_000, 5_000)]) < step([(0, 5_000)])


def test_chunks_add_up_to_the_prompt_plus_one_overhead_per_step(table):
    cost = TableStepTime(table)
    chunks = [(0, 2_000), (2_000, 4_000), (4_000, 5_000)]
    total = sum(cost.step_time_s([(a, b)]) for a, b in chunks)
    assert total == pytest.approx(3 * 0.01 + cost.work_s(5_000), rel=1e-12)
    assert cost.prefill_s(5_000, chunk_tokens=2_000) == pytest.approx(total, rel=1e-12)


def test_monotone_in_every_end_and_antitone_in_every_start(table):
    cost = TableStepTime(table)
    ends = np.arange(0, 20_000, 37)
    work = cost.work_s(ends)
    assert np.all(np.diff(work) >= 0)
    # Marginal cost per token never decreases (a convex table stays convex).
    marginal = np.diff(cost.work_s(np.arange(0, 12_000, 500)))
    assert np.all(np.diff(marginal) >= -1e-15)
    for start in (0, 300, 3_000):
        times = [cost.step_time_s([(start, end)]) for end in range(start + 1, 9_000, 250)]
        assert times == sorted(times)
        later = [cost.step_time_s([(s, 9_000)]) for s in range(start, 8_999, 250)]
        assert later == sorted(later, reverse=True)


def test_empty_step_is_free_and_bad_spans_raise(table):
    cost = TableStepTime(table)
    assert cost.step_time_s([]) == 0.0
    with pytest.raises(ValueError):
        cost.step_time_s([(10, 5)])
    with pytest.raises(ValueError):
        cost.step_time_s([(0, -5)])


def test_shipped_table_reproduces_its_points():
    profile = default_profile()
    cost = TableStepTime(profile)
    for n, t in profile.points:
        assert cost.prefill_s(n) == pytest.approx(t, rel=1e-12)


def test_measured_tables_give_their_one_token_time_capped_at_the_first_point():
    measured = from_points(POINTS, overhead_s=0.004)
    assert TableStepTime(measured).overhead_s == 0.004
    noisy = from_points(POINTS, overhead_s=1.0)  # more than T(100): capped
    assert TableStepTime(noisy).overhead_s == t_of(100)
    assert TableStepTime(noisy).step_time_s([(0, 100)]) == pytest.approx(t_of(100), rel=1e-12)
