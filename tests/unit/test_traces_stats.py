"""`trace stats` numbers on a hand-made trace, computed by hand below."""

from __future__ import annotations

import pytest

from fairway.traces.format import PhaseWindow, Trace, TraceHeader, make_request
from fairway.traces.stats import format_stats, ideal_hits, trace_stats


def _hand_trace() -> Trace:
    # capacity 100 tokens/s; windows: calm [0, 10), spike [10, 20).
    reqs = (
        make_request("r1", 0.0, [("A", 10), ("B", 5)], phase="calm"),
        make_request("r2", 1.0, [("A", 10), ("B", 5), ("C", 5)], phase="calm"),
        make_request("r3", 2.0, [("A", 10), ("D", 20)], phase="calm"),
        make_request("r4", 12.0, [("A", 10), ("B", 5)], phase="spike"),
        make_request("r5", 15.0, [("E", 40)], phase="spike"),
        # Same ids as r1 in another order: B is not a prefix anyone had, so no hit.
        make_request("r6", 25.0, [("B", 5), ("A", 10)], phase="spike"),
    )
    header = TraceHeader(
        "hand", 0, "calm:0.5:10,spike:2:10", {}, len(reqs), capacity_tps=100.0,
        phases=(PhaseWindow("calm", 0.0, 10.0, 0.5), PhaseWindow("spike", 10.0, 20.0, 2.0)),
    )
    return Trace(header, reqs)


def test_ideal_hits_by_hand() -> None:
    # r2 hits A+B, r3 hits A, r4 hits all of A+B, r6 nothing (B first).
    assert ideal_hits(_hand_trace().requests) == [0, 15, 10, 15, 0, 0]


def test_trace_stats_by_hand() -> None:
    s = trace_stats(_hand_trace(), window_s=10.0)
    assert s.num_requests == 6
    assert s.span_s == 25.0
    assert s.prompt_tokens_total == 135  # 15 + 20 + 30 + 15 + 40 + 15
    # Sorted lengths 15 15 15 20 30 40, linear interpolation: p10 at rank 0.5, p50 at 2.5,
    # p90 at 4.5, p99 at 4.95.
    assert s.prompt_percentiles == {"p10": 15.0, "p50": 17.5, "p90": 35.0, "p99": 39.5,
                                    "max": 40.0}
    assert s.ideal_hit_tokens == 40
    assert s.ideal_hit_ratio == pytest.approx(40 / 135)
    # Reused prefix nodes: A (by r2, r3, r4) and A>B (by r2, r4): 10 + 5 tokens.
    assert (s.reusable_tokens, s.reusable_blocks) == (15, 2)
    assert s.distinct_blocks == 5
    # Work = max(L - hit, 1): 15, 5, 20, 1, 40, 15. Window [0,10): 20/5 = 4; [10,20): 40/1;
    # [20,30) has one request and is skipped.
    assert s.work_spread.num_windows == 2
    assert s.work_spread.median == pytest.approx(22.0)
    assert s.work_spread.max == pytest.approx(40.0)

    calm, spike = s.phases
    assert (calm.phase, calm.num_requests, spike.phase, spike.num_requests) == (
        "calm", 3, "spike", 3)
    assert calm.prompt_tokens == 65 and calm.work_tokens == 40
    assert calm.ideal_hit_ratio == pytest.approx(25 / 65)
    # calm covers 10 s: 65 / 10 / 100 and 40 / 10 / 100.
    assert calm.offered_load_prompt == pytest.approx(0.065)
    assert calm.offered_load_ideal == pytest.approx(0.04)
    assert (calm.work_spread.median, calm.work_spread.max) == (4.0, 4.0)
    # spike is the last window, stretched to the last arrival: 15 s; prompt 70, work 56.
    assert spike.offered_load_prompt == pytest.approx(70 / 15 / 100)
    assert spike.offered_load_ideal == pytest.approx(56 / 15 / 100)
    assert (spike.work_spread.median, spike.work_spread.max, spike.work_spread.num_windows) == (
        40.0, 40.0, 1)


def test_window_size_changes_grouping() -> None:
    s = trace_stats(_hand_trace(), window_s=30.0)
    # One window holding all six requests: 40 / 1.
    assert (s.work_spread.median, s.work_spread.max, s.work_spread.num_windows) == (40.0, 40.0, 1)


def test_format_and_json() -> None:
    s = trace_stats(_hand_trace())
    text = format_stats(s)
    assert "requests: 6" in text
    assert "ideal prefix-hit ratio (infinite cache): 0.296" in text
    assert "p50 18" in text  # 17.5 rounds half to even
    assert s.to_json()["work_spread"]["max"] == 40.0
