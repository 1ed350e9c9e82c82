"""The agent-sessions family: determinism, session structure (parents, growing contexts, the cap,
subagents' own prefix, think times), the load calibration and its shipped presets.

Synthetic: no source data. Shapes are short (a few sessions) except for the calibration."""

from __future__ import annotations

from collections import defaultdict

import pytest

from fairway.errors import TraceError
from fairway.replay.bench import load_trace_spec
from fairway.traces.agent import DEFAULT_SHAPE, AgentSessionsParams, expected_session_work
from fairway.traces.build import (
    AGENT_BUSY_SHAPE,
    LONG_CONTEXT_BATCHED_TOKENS,
    PRESETS,
    build_preset,
    build_trace,
)
from fairway.traces.format import Trace, TraceRequest, load_trace, trace_bytes
from fairway.traces.shapes import get_shape
from fairway.traces.shipped import header_mismatch, shipped_path

FAMILY = "agent-sessions"
SHORT = "calm:0.3:120,busy:0.6:120"
CAPACITY = 4000.0
CAP = 131_072
SYSTEM = ("ag-system-10240", 10240)
SUB_SYSTEM = ("ag-subagent-system-4096", 4096)


@pytest.fixture(scope="module")
def trace() -> Trace:
    return build_trace(FAMILY, 5, SHORT, CAPACITY)


def _by_id(trace: Trace) -> dict[str, tuple[int, TraceRequest]]:
    return {r.request_id: (i, r) for i, r in enumerate(trace.requests)}


def _sessions(trace: Trace) -> dict[str, list[TraceRequest]]:
    out: dict[str, list[TraceRequest]] = defaultdict(list)
    for r in trace.requests:
        out[r.tags["session"]].append(r)
    return out


def test_same_seed_same_bytes_other_seed_other_trace() -> None:
    a = trace_bytes(build_trace(FAMILY, 5, SHORT, CAPACITY))
    assert a == trace_bytes(build_trace(FAMILY, 5, SHORT, CAPACITY))
    assert a != trace_bytes(build_trace(FAMILY, 6, SHORT, CAPACITY))


def test_the_trace_has_sessions_subagents_and_every_trigger(trace: Trace) -> None:
    info = trace.header.info
    assert info["num_sessions"] >= 3 and info["num_subagents"] >= 1
    assert {r.tags["trigger"] for r in trace.requests} == {
        "start", "tool", "user", "task", "subagent"}
    assert all(r.max_tokens == 1 for r in trace.requests)


def test_every_child_follows_an_earlier_parent_and_extends_its_blocks(trace: Trace) -> None:
    by_id = _by_id(trace)
    children = 0
    for i, r in enumerate(trace.requests):
        if r.tags["agent"] == "main" and r.tags["turn"] == 0:
            assert "parent" not in r.tags and "think_s" not in r.tags
            continue
        j, parent = by_id[r.tags["parent"]]
        assert j < i and parent.arrival_s <= r.arrival_s
        if r.tags["trigger"] == "task":  # a subagent's first turn: its own context
            assert parent.tags["agent"] == "main" and r.tags["agent"] == "sub"
            assert r.blocks[0] == SUB_SYSTEM and len(r.blocks) == 2
            assert r.tags["session"].startswith(parent.tags["session"] + "-a")
        else:  # the previous turn of its session, re-sent whole, plus one new block
            assert parent.tags["session"] == r.tags["session"]
            assert parent.tags["turn"] == r.tags["turn"] - 1
            assert r.blocks[: len(parent.blocks)] == parent.blocks
            assert len(r.blocks) == len(parent.blocks) + 1
        children += 1
    assert children > 0.8 * len(trace)


def test_contexts_grow_within_a_session_and_stay_under_the_cap(trace: Trace) -> None:
    longest = 0
    for session, reqs in _sessions(trace).items():
        assert [r.tags["turn"] for r in reqs] == list(range(len(reqs))), session
        lengths = [r.prompt_tokens for r in reqs]
        assert all(b > a for a, b in zip(lengths, lengths[1:], strict=False)), session
        longest = max(longest, lengths[-1])
    assert longest <= CAP
    assert longest > 100_000  # some session grows close to the context


def test_a_lower_cap_ends_sessions_before_it() -> None:
    capped = build_trace(FAMILY, 5, SHORT, CAPACITY, max_prompt_tokens=40_000)
    lengths = [r.prompt_tokens for r in capped.requests]
    assert max(lengths) <= 40_000 < max(r.prompt_tokens for r in build_trace(
        FAMILY, 5, SHORT, CAPACITY).requests)
    assert max(lengths) > 35_000


def test_main_sessions_and_subagents_have_their_own_shared_prefix(trace: Trace) -> None:
    owners: dict[tuple[str, int], set[str]] = defaultdict(set)
    for r in trace.requests:
        first = SYSTEM if r.tags["agent"] == "main" else SUB_SYSTEM
        assert r.blocks[0] == first
        for block in r.blocks[1:]:
            owners[block].add(r.tags["session"])
    # Past the system block, no block belongs to two sessions.
    assert all(len(sessions) == 1 for sessions in owners.values())
    assert SUB_SYSTEM not in owners and SYSTEM not in owners


def test_think_times_and_the_open_loop_arrival_estimate(trace: Trace) -> None:
    by_id = _by_id(trace)
    for r in trace.requests:
        if "parent" not in r.tags:
            continue
        think = r.tags["think_s"]
        assert isinstance(think, float) and think >= 0
        _, parent = by_id[r.tags["parent"]]
        # The parent's own (last) block is its uncached work, estimated at the capacity.
        estimate = parent.arrival_s + parent.blocks[-1][1] / CAPACITY + think
        assert r.arrival_s == pytest.approx(estimate, abs=1e-5), r.request_id
    user = [r.tags["think_s"] for r in trace.requests if r.tags["trigger"] == "user"]
    tool = [r.tags["think_s"] for r in trace.requests if r.tags["trigger"] == "tool"]
    assert sorted(user)[len(user) // 2] > sorted(tool)[len(tool) // 2]  # humans are slower


def test_the_main_turn_after_a_subagent_waits_for_its_answer(trace: Trace) -> None:
    sessions = _sessions(trace)
    for r in trace.requests:
        if r.tags["trigger"] != "subagent":
            continue
        spawner = sessions[r.tags["session"]][r.tags["turn"] - 1]
        subagents = [reqs for name, reqs in sessions.items()
                     if reqs[0].tags.get("parent") == spawner.request_id]
        assert len(subagents) == 1
        assert r.arrival_s > subagents[0][-1].arrival_s


@pytest.mark.parametrize(("basis", "shape"), [
    ("ideal", "steady:2:2500,busy:4:2500"),
    ("prompt", "steady:40:2500,busy:80:2500"),  # a session's prompts hold ~20x its own tokens
])
def test_the_session_rate_matches_the_shapes_load(basis: str, shape: str) -> None:
    # ~800-1,000 sessions: the realised work is within 5% of load x capacity x duration (a
    # session's work is heavy-tailed; this seed realises 0.99 and 0.98).
    long = build_trace(FAMILY, 3, shape, CAPACITY, work_basis=basis, max_requests=100_000)
    seen: set[tuple[str, int]] = set()
    work = prompt = 0
    for r in long.requests:
        prompt += r.prompt_tokens
        for block in r.blocks:
            if block not in seen:
                seen.add(block)
                work += block[1]
    work -= SYSTEM[1] + SUB_SYSTEM[1]  # shared once per trace; a session's work leaves them out
    offered = work if basis == "ideal" else prompt
    nominal = sum(p.load * p.duration_s for p in get_shape(shape).phases) * CAPACITY
    assert long.header.info["num_sessions"] > 700
    assert offered == pytest.approx(nominal, rel=0.05)
    params = AgentSessionsParams(work_basis=basis)
    assert long.header.info["work_per_session_tokens"] == pytest.approx(
        expected_session_work(params), abs=1e-3)


def test_the_prompt_basis_starts_fewer_sessions() -> None:
    ideal = build_trace(FAMILY, 5, SHORT, CAPACITY)
    prompt = build_trace(FAMILY, 5, SHORT, CAPACITY, work_basis="prompt")
    assert prompt.header.info["num_sessions"] < ideal.header.info["num_sessions"]


@pytest.mark.parametrize(
    "params",
    [{"turns": 0}, {"answer_sigma": -1}, {"user_turn_share": 1.5}, {"decode_tps": 0},
     {"subagent_turns_min": 5, "subagent_turns_max": 4}, {"max_prompt_tokens": 10240},
     {"work_basis": "tokens"}],
)
def test_bad_parameters_are_trace_errors(params: dict[str, object]) -> None:
    with pytest.raises(TraceError):
        build_trace(FAMILY, 5, SHORT, CAPACITY, **params)


def test_max_requests_is_enforced() -> None:
    with pytest.raises(TraceError, match="max_requests"):
        build_trace(FAMILY, 5, SHORT, CAPACITY, max_requests=20)


# ---------------------------------------------------------------------------------- presets


def test_the_presets_are_one_workload_at_two_session_rates() -> None:
    moderate, busy = PRESETS["agent-sessions"], PRESETS["agent-sessions-busy"]
    assert moderate["family"] == busy["family"] == FAMILY
    assert moderate["shape"] == DEFAULT_SHAPE and busy["shape"] == AGENT_BUSY_SHAPE
    assert moderate["params"] == busy["params"] == {}
    pairs = zip(get_shape(DEFAULT_SHAPE).phases, get_shape(AGENT_BUSY_SHAPE).phases, strict=True)
    for low, high in pairs:
        assert (low.name, low.duration_s) == (high.name, high.duration_s)
        assert high.load == pytest.approx(1.4 * low.load)
    for spec in (moderate, busy):
        assert f"--max-num-batched-tokens {LONG_CONTEXT_BATCHED_TOKENS}" in spec["description"]


@pytest.mark.parametrize("name", ["agent-sessions", "agent-sessions-busy"])
def test_the_presets_ship_load_without_data_and_equal_a_build(name: str) -> None:
    shipped = load_trace(shipped_path(name))
    assert header_mismatch(shipped, name) == []
    assert load_trace_spec(name) == shipped  # tests/conftest.py: no data directory
    assert trace_bytes(build_preset(name)) == trace_bytes(shipped)
    assert 300 <= len(shipped) <= 2000
    assert max(r.prompt_tokens for r in shipped.requests) <= CAP
    assert shipped.header.info["num_sessions"] >= 10


def test_the_busy_preset_offers_more_sessions_and_requests() -> None:
    moderate = load_trace(shipped_path("agent-sessions"))
    busy = load_trace(shipped_path("agent-sessions-busy"))
    ratio = busy.header.info["num_sessions"] / moderate.header.info["num_sessions"]
    assert 1.2 <= ratio <= 1.6 and len(busy) > len(moderate)
