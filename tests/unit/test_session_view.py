"""The session view of replay results, on hand-made results (no replay, no vLLM)."""

from __future__ import annotations

import pytest

from fairway.replay.report import to_json, to_markdown
from fairway.replay.results import ReplayResult, RequestResult
from fairway.replay.session_view import end_to_end_s, session_facts, session_hit
from fairway.replay.sessions import Releases, arrivals_setting
from fairway.replay.summary import summarize
from fairway.traces.format import TraceRequest


def turn(rid: str, session: str | None, parent: str | None, arrival: float,
         first_token: float | None, prompt: int, cached: int | None,
         error: str | None = None) -> RequestResult:
    tags = {} if session is None else {"session": session, "parent": parent, "think_s": 1.0}
    return RequestResult(rid, arrival, "calm", prompt, arrival if cached is not None else None,
                         first_token, cached, error, tags)


def sessions_result(policy: str = "fcfs") -> ReplayResult:
    """Three sessions: s0 complete in 10 s (a hit, then a miss), s1 complete in 4 s (a turn of
    unknown cache), s2 incomplete (its second turn failed)."""
    requests = [
        turn("a0", "s0", None, 0.0, 1.0, 1_000, 0),
        turn("a1", "s0", "a0", 2.0, 3.0, 1_200, 992),  # parent 1,000 - 16 = 984 <= 992: hit
        turn("a2", "s0", "a1", 5.0, 10.0, 1_500, 1_100),  # 1,100 < 1,184: miss
        turn("b0", "s1", None, 1.0, 2.0, 500, 0),
        turn("b1", "s1", "b0", 3.0, 5.0, 700, None),  # never reported: unknown
        turn("c0", "s2", None, 2.0, 2.5, 400, 0),
        turn("c1", "s2", "c0", 3.5, None, 600, 384, error="boom"),  # 384 = 400 - 16: a hit
    ]
    return ReplayResult(policy, "t", {}, requests, 1.0, 10.0)


def test_the_session_view_counts_by_hand():
    facts = session_facts(sessions_result().requests)
    assert facts is not None
    assert facts.n_sessions == 3
    assert facts.end_to_end_s == (10.0, 4.0)  # s2 is incomplete
    assert (facts.n_turns_with_parent, facts.n_hits, facts.n_unknown) == (4, 2, 1)
    (stats,) = summarize([sessions_result()]).sessions
    assert (stats.n_sessions, stats.n_complete) == (3, 2)
    assert stats.median_s == pytest.approx(7.0)
    assert stats.p99_s == pytest.approx(4.0 + 0.99 * 6.0)  # numpy's linear method


def test_end_to_end_and_hit_rules():
    a = turn("a", "s", None, 1.0, 2.0, 100, 0)
    b = turn("b", "s", "a", 3.0, 7.5, 200, 84)
    assert end_to_end_s([a, b]) == 6.5
    assert end_to_end_s([a, turn("x", "s", "a", 3.0, None, 200, 0)]) is None
    assert session_hit(b, a) is True  # 84 >= 100 - 16
    assert session_hit(turn("c", "s", "a", 3.0, 4.0, 200, 83), a) is False
    assert session_hit(turn("d", "s", "a", 3.0, 4.0, 200, None), a) is None


def test_the_report_shows_sessions_only_where_there_are_some():
    plain = ReplayResult("fcfs", "plain", {}, [turn("r", None, None, 0.0, 1.0, 100, 0)], 1.0, 1.0)
    summary = summarize([sessions_result("fcfs"), sessions_result("lpm"), plain])
    assert [(s.trace_name, s.policy) for s in summary.sessions] == [("t", "fcfs"), ("t", "lpm")]
    markdown = to_markdown(summary)
    assert markdown.count("### Sessions") == 1
    assert "| fcfs | 3 | 2 | 7000.0 | 9940.0 | 2 / 4 (+1 unknown) |" in markdown
    data = to_json(summary)
    assert data["traces"]["t"]["sessions"][0]["n_hits"] == 2
    assert "sessions" not in data["traces"]["plain"]
    assert "session_hit_definition" in data
    alone = summarize([plain])
    assert "Sessions" not in to_markdown(alone) and "session_hit_definition" not in to_json(alone)


def test_releases_follow_the_parents_answers():
    reqs = [
        TraceRequest("a", 0.0, (("x", 10),)),
        TraceRequest("b", 0.5, (("x", 10), ("y", 5)), tags={"parent": "a", "think_s": 2.0}),
        TraceRequest("c", 1.0, (("z", 10),)),
    ]
    releases = Releases(reqs)
    assert releases.due(0.0) == [0] and releases.next_s() == 1.0
    assert releases.due(1.0) == [2] and releases.next_s() is None  # b waits for a
    releases.resolved(0, 1.25)
    releases.resolved(0, 9.0)  # only the first resolution counts
    assert releases.next_s() == 3.25 and releases.due(3.25) == [1]
    assert releases.release_s == [0.0, 3.25, 1.0]
    opened = Releases(reqs, open_loop=True)
    assert opened.due(1.0) == [0, 1, 2]
    assert arrivals_setting(reqs, False) == "closed-loop"
    assert arrivals_setting(reqs, True) == "open-loop"
    assert arrivals_setting(reqs[:1], False) is None
