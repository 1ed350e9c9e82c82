"""Closed-loop sessions in the virtual replay: a turn enters think_s after its parent's answer."""

from __future__ import annotations

import json

import pytest

from fairway import cli
from fairway.errors import TraceError
from fairway.profiling.table import from_points
from fairway.replay.report import to_json, to_markdown
from fairway.replay.sessions import RECORDED_ARRIVAL_TAG, Releases
from fairway.replay.sim import replay
from fairway.replay.summary import summarize
from fairway.traces.format import Trace, TraceHeader, TraceRequest, write_trace

pytestmark = pytest.mark.integration

OVERHEAD_S = 0.01
PROFILE = from_points(
    [(n, OVERHEAD_S + n / 1e4 + (n / 1e4) ** 2) for n in (128, 1_000, 2_048, 4_096, 8_192)],
    constants={"overhead_s": OVERHEAD_S},
)
DOC = ("doc", 1_000)


def request(rid: str, arrival: float, blocks: list[tuple[str, int]], **tags) -> TraceRequest:
    return TraceRequest(rid, arrival, tuple(blocks), phase="calm", tags=tags)


def make_trace(*reqs: TraceRequest) -> Trace:
    return Trace(TraceHeader("test", 0, None, {}, len(reqs)), reqs)


def by_id(result):
    return {r.request_id: r for r in result.requests}


def session_trace(think_s: float = 1.0) -> Trace:
    """One two-turn session whose second turn was recorded long before its parent's answer."""
    return make_trace(
        request("a", 0.0, [DOC], session="s0", hop=1, parent=None, think_s=0.0),
        request("b", 0.05, [DOC, ("q2", 100)], session="s0", hop=2, parent="a", think_s=think_s),
    )


def test_a_turn_is_released_think_s_after_its_parents_first_token():
    result = replay(session_trace(), "fcfs", profile=PROFILE, num_blocks=1_000)
    got = by_id(result)
    a, b = got["a"], got["b"]
    assert a.error is None and b.error is None
    assert a.first_token_s == pytest.approx(PROFILE.prefill_s(1_000), rel=1e-12)
    assert b.arrival_s == a.first_token_s + 1.0  # exactly, on the virtual clock
    assert b.first_scheduled_s == b.arrival_s  # the idle engine jumps to the release
    assert b.tags[RECORDED_ARRIVAL_TAG] == 0.05 and RECORDED_ARRIVAL_TAG not in a.tags
    assert b.cached_tokens == 992  # the parent's full blocks: the session's context reused
    assert result.settings["arrivals"] == "closed-loop"


def test_open_loop_keeps_the_recorded_arrival():
    result = replay(session_trace(), "fcfs", profile=PROFILE, num_blocks=1_000, open_loop=True)
    b = by_id(result)["b"]
    assert b.arrival_s == 0.05 and RECORDED_ARRIVAL_TAG not in b.tags
    assert b.first_scheduled_s == pytest.approx(PROFILE.prefill_s(1_000))  # after a's step
    assert result.settings["arrivals"] == "open-loop"


def test_a_zero_think_time_releases_at_the_answer_and_chains_go_on():
    trace = make_trace(
        request("a", 0.0, [DOC], session="s0", parent=None, think_s=0.0),
        request("b", 0.0, [DOC, ("q2", 100)], session="s0", parent="a", think_s=0.0),
        request("c", 0.0, [DOC, ("q2", 100), ("q3", 100)], session="s0", parent="b",
                think_s=0.5),
    )
    got = by_id(replay(trace, "fcfs", profile=PROFILE, num_blocks=1_000))
    assert got["b"].arrival_s == got["a"].first_token_s
    assert got["c"].arrival_s == got["b"].first_token_s + 0.5
    assert got["a"].first_token_s < got["b"].first_token_s < got["c"].first_token_s


def test_a_parents_failure_still_releases_the_child():
    # 99 usable blocks of 16 tokens: the 3,000-token parent can never run and fails in the first
    # step, at 0 s (nothing computed, so the clock did not move); the child follows 2 s later.
    trace = make_trace(
        request("big", 0.0, [("y", 3_000)], session="s0", parent=None, think_s=0.0),
        request("child", 0.0, [("z", 500)], session="s0", parent="big", think_s=2.0),
    )
    result = replay(trace, "fairway", profile=PROFILE, num_blocks=100)
    got = by_id(result)
    assert got["big"].error is not None
    assert got["child"].error is None
    assert got["child"].arrival_s == 2.0
    assert got["child"].ttft_s == pytest.approx(PROFILE.prefill_s(500))
    assert len(result.requests) == 2


@pytest.mark.parametrize(
    ("parent", "think", "message"),
    [
        ("nobody", 1.0, "not an earlier request"),
        ("c", 1.0, "not an earlier request"),  # a later request
        ("b", 1.0, "not an earlier request"),  # itself
        ("a", -1.0, "think"),
        ("a", "soon", "think"),
        ("a", None, "think"),
        ("a", True, "think"),
    ],
)
def test_a_bad_session_is_a_trace_error(parent, think, message):
    trace = make_trace(
        request("a", 0.0, [("x", 100)]),
        request("b", 0.0, [("y", 100)], parent=parent, think_s=think),
        request("c", 0.0, [("z", 100)]),
    )
    with pytest.raises(TraceError, match=message):
        replay(trace, "fcfs", profile=PROFILE, num_blocks=100)
    with pytest.raises(TraceError, match=message):
        Releases(trace.requests)
    Releases(trace.requests, open_loop=True)  # open loop ignores parents


def test_a_trace_without_parents_replays_identically_with_either_flag():
    trace = make_trace(*(
        request(f"r{i}", 0.1 * i, [("shared", 400), (f"own{i}", 50 + 40 * i)])
        for i in range(12)
    ))
    closed = replay(trace, "fairway", profile=PROFILE, num_blocks=200)
    opened = replay(trace, "fairway", profile=PROFILE, num_blocks=200, open_loop=True)
    assert [r.to_dict() for r in closed.requests] == [r.to_dict() for r in opened.requests]
    assert closed.settings == opened.settings and "arrivals" not in closed.settings
    assert [r.arrival_s for r in closed.requests] == [r.arrival_s for r in trace.requests]
    assert summarize([closed]).sessions == []


def test_the_session_view_of_a_replay():
    # Two sessions: s0 (a -> b, b reuses a) and s1 (one turn), all on an idle engine.
    trace = make_trace(
        request("a", 0.0, [DOC], session="s0", parent=None, think_s=0.0),
        request("b", 0.0, [DOC, ("q2", 100)], session="s0", parent="a", think_s=1.0),
        request("c", 30.0, [("other", 500)], session="s1", parent=None, think_s=0.0),
    )
    result = replay(trace, "fcfs", profile=PROFILE, num_blocks=1_000)
    got = by_id(result)
    summary = summarize([result])
    (stats,) = summary.sessions
    s0 = got["b"].first_token_s - got["a"].arrival_s
    s1 = got["c"].ttft_s
    assert (stats.n_sessions, stats.n_complete) == (2, 2)
    assert stats.median_s == pytest.approx((s0 + s1) / 2)
    assert (stats.n_turns_with_parent, stats.n_hits, stats.n_unknown) == (1, 1, 0)
    assert "### Sessions" in to_markdown(summary)
    assert to_json(summary)["traces"][result.trace_name]["sessions"][0]["n_hits"] == 1


@pytest.mark.parametrize(("flags", "arrivals"), [((), "closed-loop"), (("--open-loop",),
                                                                      "open-loop")])
def test_fairway_bench_replays_sessions_closed_loop_unless_told(tmp_path, flags, arrivals):
    path = write_trace(session_trace(), tmp_path / "sessions.jsonl")
    out = tmp_path / "out"
    assert cli.main(["bench", "--trace", str(path), "--policy", "fcfs", "--num-blocks", "1000",
                     "--workers", "0", "--out", str(out), "--no-progress", *flags]) == 0
    (replay_file,) = (out / "replays").glob("*.json")
    data = json.loads(replay_file.read_text())
    assert data["settings"]["arrivals"] == arrivals
    child = data["requests"][1]
    assert (child["arrival_s"] == 0.05) == (arrivals == "open-loop")
    report = json.loads((out / "report.json").read_text())
    (stats,) = report["traces"]["sessions"]["sessions"]
    assert (stats["n_sessions"], stats["n_turns_with_parent"]) == (1, 1)
    assert "### Sessions" in (out / "report.md").read_text()
