"""The virtual-clock replay: vLLM's real Scheduler, timed by the cost model, on small traces."""

from __future__ import annotations

import random
import time

import pytest

from fairway.profiling.step_time import TableStepTime
from fairway.profiling.table import from_points
from fairway.replay.engine_sizing import size_cache
from fairway.replay.sim import replay
from fairway.replay.sim_loop import ReplayHooks, VirtualClock
from fairway.traces.format import Trace, TraceHeader, TraceRequest

pytestmark = pytest.mark.integration

OVERHEAD_S = 0.01  # the toy table's per-step time
PROFILE = from_points(
    [(n, OVERHEAD_S + n / 1e4 + (n / 1e4) ** 2) for n in (128, 1_000, 2_048, 4_096, 8_192)],
    constants={"overhead_s": OVERHEAD_S},
)


def make_trace(*requests: tuple[str, float, list[tuple[str, int]]]) -> Trace:
    """A trace from (request_id, arrival_s, blocks); phases are all 'calm'."""
    reqs = tuple(
        TraceRequest(rid, arrival, tuple(blocks), phase="calm") for rid, arrival, blocks in requests
    )
    header = TraceHeader(family="test", seed=0, shape=None, params={}, num_requests=len(reqs))
    return Trace(header, reqs)


def by_id(result):
    return {r.request_id: r for r in result.requests}


def t_of(n: int) -> float:
    return PROFILE.prefill_s(n)


@pytest.mark.parametrize("length", [128, 1_000, 2_048])
def test_one_request_on_an_idle_engine_takes_its_table_time(length):
    trace = make_trace(("a", 5.0, [("x", length)]))
    result = replay(trace, "fcfs", profile=PROFILE, num_blocks=1_000)
    (r,) = result.requests
    assert r.error is None
    assert r.first_scheduled_s == 5.0  # the idle clock jumps to the arrival
    assert r.cached_tokens == 0
    assert r.ttft_s == pytest.approx(t_of(length), rel=1e-12)
    assert result.simulated_s == pytest.approx(5.0 + t_of(length), rel=1e-12)


def test_a_prompt_longer_than_a_step_pays_the_overhead_once_per_chunk():
    trace = make_trace(("a", 0.0, [("x", 5_000)]))
    (r,) = replay(trace, "fcfs", profile=PROFILE, num_blocks=1_000).requests
    # Three chunks (2,048 + 2,048 + 904): 3 o + C(5,000), with C = T - o.
    assert r.ttft_s == pytest.approx(3 * OVERHEAD_S + (t_of(5_000) - OVERHEAD_S), rel=1e-12)
    assert r.ttft_s == pytest.approx(TableStepTime(PROFILE).prefill_s(5_000, chunk_tokens=2_048))


def test_two_misses_arriving_together_run_one_after_the_other_under_fcfs():
    # 2,048 tokens each: one prompt fills the step budget, so the second waits a whole step.
    trace = make_trace(("a", 1.0, [("x", 2_048)]), ("b", 1.0, [("y", 2_048)]))
    result = by_id(replay(trace, "fcfs", profile=PROFILE, num_blocks=1_000))
    assert result["a"].ttft_s == pytest.approx(t_of(2_048), rel=1e-12)
    assert result["b"].first_scheduled_s == pytest.approx(1.0 + t_of(2_048), rel=1e-12)
    assert result["b"].ttft_s == pytest.approx(2 * t_of(2_048), rel=1e-12)


def test_a_cached_prefix_is_free_and_reported():
    trace = make_trace(("a", 0.0, [("doc", 2_000)]), ("b", 10.0, [("doc", 2_000), ("q", 48)]))
    result = by_id(replay(trace, "fcfs", profile=PROFILE, num_blocks=1_000))
    cost = TableStepTime(PROFILE)
    assert result["b"].cached_tokens == 2_000
    assert result["b"].ttft_s == pytest.approx(OVERHEAD_S + cost.work_s(2_048) - cost.work_s(2_000))


# --- the worked example's shape: hits first under cache-aware policies, the miss first under FCFS


def worked_example() -> Trace:
    prefix = [("doc", 6_000)]
    return make_trace(
        ("S", 0.0, prefix),  # computes and caches the prefix long before the others arrive
        ("M", 20.0, [("miss", 6_000)]),
        *((f"H{i}", 20.0, [*prefix, (f"q{i}", 300)]) for i in range(1, 6)),
    )


@pytest.mark.parametrize(
    ("policy", "first_step"),
    [
        ("fcfs", ["M"]),
        ("lpm", ["H1", "H2", "H3", "H4", "H5", "M"]),
        ("fairway", ["H1", "H2", "H3", "H4", "H5", "M"]),
    ],
)
def test_admission_follows_the_policy_order(policy, first_step):
    state: dict = {"steps": []}

    def on_start(scheduler):
        state["scheduler"] = scheduler

    def on_step(step):
        order = [
            v.request_id
            for v in (
                state["scheduler"].fairway_last_views[i]
                for i in state["scheduler"].fairway_last_order
            )
        ]
        state["steps"].append((step.start_s, list(step.spans), order))

    result = by_id(
        replay(
            worked_example(),
            policy,
            profile=PROFILE,
            num_blocks=3_000,
            hooks=ReplayHooks(on_start, on_step),
        )
    )
    start, admitted, order = next(s for s in state["steps"] if s[0] >= 20.0)
    assert start == 20.0
    assert admitted == first_step
    assert order[: len(admitted)] == admitted  # vLLM admitted in the policy's order
    hits = [result[f"H{i}"] for i in range(1, 6)]
    assert all(h.cached_tokens == 6_000 for h in hits)
    if policy == "fcfs":
        assert all(h.first_token_s > result["M"].first_token_s for h in hits)
    else:
        assert all(h.first_token_s < result["M"].first_token_s for h in hits)


# --- invariants on a random trace


def random_trace(seed: int, n: int = 60) -> Trace:
    rng = random.Random(seed)
    requests, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(2.0)
        doc = rng.randrange(6)
        blocks = [("sys", 200), (f"doc{doc}", 1_000 + 300 * doc), (f"q{i}", rng.randrange(20, 400))]
        requests.append((f"r{i}", round(t, 6), blocks[rng.randrange(2) :]))
    return make_trace(*requests)


def test_clock_moves_forward_and_every_request_is_answered():
    steps = []
    trace = random_trace(1)
    result = replay(
        trace, "fairway", profile=PROFILE, num_blocks=400, hooks=ReplayHooks(on_step=steps.append)
    )
    assert steps
    for prev, step in zip(steps, steps[1:], strict=False):
        assert step.start_s >= prev.end_s
    assert all(s.end_s > s.start_s for s in steps)
    assert [r.request_id for r in result.requests] == [r.request_id for r in trace.requests]
    for r in result.requests:
        assert r.error is None
        assert r.arrival_s <= r.first_scheduled_s < r.first_token_s <= result.simulated_s
        assert 0 <= r.cached_tokens < r.prompt_tokens
    assert result.settings["kv_cache"]["num_blocks"] == 400
    assert result.settings["engine"]["policy_fallbacks"] == 0


def test_same_inputs_give_the_same_result():
    trace = random_trace(2)
    a = replay(trace, "klpm-4", profile=PROFILE, num_blocks=300)
    b = replay(trace, "klpm-4", profile=PROFILE, num_blocks=300)
    assert [r.to_dict() for r in a.requests] == [r.to_dict() for r in b.requests]
    assert a.settings == b.settings


def test_a_request_that_can_never_fit_is_recorded_as_an_error_not_lost():
    # 99 usable blocks of 16 tokens = 1,584 tokens: the 3,000-token prompt can never run.
    trace = make_trace(
        ("a", 0.0, [("x", 500)]), ("big", 0.5, [("y", 3_000)]), ("c", 1.0, [("z", 500)])
    )
    result = by_id(replay(trace, "fairway", profile=PROFILE, num_blocks=100))
    assert set(result) == {"a", "big", "c"}
    assert result["big"].error is not None and result["big"].ttft_s is None
    assert result["a"].error is None and result["c"].error is None


def test_the_policy_sees_the_virtual_clock():
    seen: list[float] = []
    step_starts: list[float] = []

    def on_start(scheduler):
        policy = scheduler.fairway_policy
        ordering = policy.ordering  # what the scheduler asks, not the reference `order`

        def spy(queue, step):
            seen.append(step.now)
            return ordering(queue, step)

        policy.ordering = spy

    trace = random_trace(3, n=30)
    result = replay(
        trace,
        "fairway",
        profile=PROFILE,
        num_blocks=400,
        hooks=ReplayHooks(on_start, lambda s: step_starts.append(s.start_s)),
    )
    assert seen, "the policy was never asked"
    assert seen == sorted(seen)
    assert set(seen) <= set(step_starts)  # `now` is the start of the step being ordered
    assert max(seen) <= result.simulated_s < time.time() - 1e9  # not wall-clock time


def test_tenant_and_priority_reach_the_engine_and_the_results():
    reqs = (
        TraceRequest("a", 0.0, (("x", 300),), tenant="team-a", priority=2),
        TraceRequest("b", 0.0, (("y", 300),)),
    )
    trace = Trace(TraceHeader("test", 0, None, {}, 2), reqs)
    engine: dict[str, tuple[int, object]] = {}

    def on_start(scheduler):
        add = scheduler.add_request

        def spy(request):
            engine[request.request_id] = (request.priority, request.sampling_params.extra_args)
            return add(request)

        scheduler.add_request = spy

    result = replay(trace, "fcfs", profile=PROFILE, num_blocks=400,
                    hooks=ReplayHooks(on_start, None))
    assert engine == {"a": (2, {"tenant": "team-a"}), "b": (0, None)}
    assert [(r.tenant, r.priority, r.error) for r in result.requests] == [
        ("team-a", 2, None), (None, 0, None)]


def test_virtual_clock_refuses_to_go_back():
    clock = VirtualClock(5.0)
    clock.advance(1.0)
    assert clock() == 6.0
    with pytest.raises(ValueError):
        clock.jump_to(5.5)
    with pytest.raises(ValueError):
        clock.advance(-0.1)


def test_cache_is_sized_from_reusable_content_with_a_floor():
    trace = random_trace(4)
    sizing = size_cache(trace, cache_fraction=0.3)
    assert sizing.source in ("fraction", "floor")
    assert sizing.num_blocks == max(sizing.fraction_blocks, sizing.floor_blocks)
    big = size_cache(trace, cache_fraction=50.0)
    assert big.source == "fraction" and big.num_blocks > sizing.num_blocks
    assert size_cache(trace, num_blocks=123).num_blocks == 123
