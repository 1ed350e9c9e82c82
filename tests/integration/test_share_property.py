"""`fairway`'s carried work charges, proved through vLLM's real Scheduler and AsyncScheduler.

Random request streams (cache hits sharing a prefix, misses of many step budgets, arrivals
between steps, a few decodes), at a 256-token step with prompts up to 6x the step and at an
8,192-token step with prompts up to 128k tokens; every step is checked from the SchedulerOutput
and the policy's ledgers against the guarantee stated in `FairwayPolicy`'s docstring and
docs/design.md:

* the Fair front is the oldest running prefill while one is partly done, else the oldest
  waiting request (started first, finished first);
* in a contested step the lagging lane places first (D = fast - fair <= 0: Fast), except that
  the Fast lane passes over what it cannot finish in the step (so with D <= 0 the Fair lane
  places first only when every candidate needs more than the step);
* after a contested step at most one prefill is partly done that was not before it, and it is
  the one the Fair lane placed last;
* the ledgers stay within one chunk: D <= 0 before a step gives D' <= w P after it, D > 0 gives
  D' >= -P (P the step's prefill budget), and w x (Fast tokens) - (Fair tokens) is the ledgers'
  gap minus the paper's start gap (the charges are the tokens vLLM scheduled);
* the Fair front gets prefill tokens within ceil(max(0, -D) / (w P)) + 1 contested steps of
  becoming the front;
* on the first contested step after an uncontested one, with no running prefill, the waiting
  order's placed head equals `fairway-step`'s merge of the same queue with the Fast lane passing
  over what it cannot finish in the step;
* an uncontested step is vLLM's own: no cap, nothing held;
* the configured threshold, adaptive flag, slot limit and running order are back after each step;
* every request stays in exactly one queue and finishes exactly once.
"""

from __future__ import annotations

import math
import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from fairway.policies import UNPLACED_LANE, get
from fairway.policies.base import arrival_order
from fairway.policies.lanes import fast_lane_order, merge

pytestmark = pytest.mark.integration

PREFIX = list(range(500, 500 + 320))  # 20 blocks of 16, cached by a warm-up request
WEIGHT = 4.0
#: (step budget, largest uncached tokens of a request, KV blocks)
SHORT = (256, 6 * 256, 4_000)
LONG = (8_192, 130_000, 40_000)  # + the prefix and 3 output tokens: within 131,072


def _spy(base):
    class Spy(base):
        """Records the state before each step, what vLLM scheduled and the policy's ledgers."""

        def schedule(self, *args, **kwargs):
            pre = _state(self)
            out = super().schedule(*args, **kwargs)
            post = _state(self)
            policy = self.fairway_policy
            ledger = policy.ledger
            views = self.fairway_last_views
            ordering = self.fairway_last_ordering
            record = {
                "share": self.fairway_last_plan,
                "ledger": (ledger.fast, ledger.fair, ledger.steps, ledger.active, ledger.start_gap,
                           ledger.fast_tokens, ledger.fair_tokens),
                "lanes": list(ordering.lanes or []) if ordering is not None else [],
                "views": views,
                "order": self.fairway_last_order if views else [],
                "now": self.fairway_clock(),
            }
            self.spy_steps.append((pre, out, record, post))
            return out

    return Spy


def _state(sched):
    prefilling = {
        r.request_id: (r.arrival_time, r.num_tokens - r.num_computed_tokens)
        for r in sched.running
        if r.is_prefill_chunk and r.num_tokens > r.num_computed_tokens
    }
    waiting = {r.request_id: r.arrival_time for r in sched.waiting}
    return {
        "prefilling": prefilling,
        "waiting": waiting,
        "running": [r.request_id for r in sched.running],
        "threshold": sched.scheduler_config.long_prefill_token_threshold,
        "adaptive": sched.adaptive_long_prefill_threshold,
        "active": sched.max_num_active_reqs,
    }


def _streams(largest: int):
    arrival = st.tuples(
        st.booleans(),  # hit (shares PREFIX) or miss
        st.integers(16, largest),  # uncached tokens
        st.sampled_from((1, 1, 1, 3)),  # max_tokens (3: two decode steps)
    )
    return st.lists(st.lists(arrival, max_size=3), min_size=1, max_size=10)


def _run(offline, helpers, stream, async_scheduling, setting):
    from fairway.vllm.scheduler import FairwayAsyncScheduler, FairwayScheduler

    budget, _, blocks = setting
    base = FairwayAsyncScheduler if async_scheduling else FairwayScheduler
    sched = offline.make_offline_scheduler(
        "fairway",
        num_blocks=blocks,
        max_num_batched_tokens=budget,
        max_num_seqs=64,
        max_model_len=131_072,
        scheduler_cls=_spy(base),
        async_scheduling=async_scheduling,
    )
    clock = [0.0]
    sched.fairway_clock = lambda: clock[0]
    sched.spy_steps = []
    sched.add_request(offline.make_request("seed", PREFIX, 0.0))
    offline.run_until_idle(sched)
    sched.spy_steps.clear()
    sched.spy_lanes_before = sum(sched.fairway_totals.lane_prefill_tokens.values())
    added, finished = [], []
    step_no = 0
    while step_no < len(stream) or sched.has_requests():
        step_no += 1
        clock[0] = step_no * 0.05
        for k, (hit, size, max_tokens) in enumerate(
            stream[step_no - 1] if step_no <= len(stream) else []
        ):
            rid = f"r{step_no}-{k}"
            suffix = helpers.tokens(1_000_000 * (step_no * 4 + k + 1), size)
            prompt = (PREFIX + suffix) if hit else suffix
            sched.add_request(offline.make_request(rid, prompt, clock[0], max_tokens))
            added.append(rid)
        _, engine_outputs = offline.step(sched)
        finished += offline.finished_ids(engine_outputs)
        helpers.check_queues(sched)
        assert step_no < 2_000, "the stream must drain"
    assert Counter(finished) == Counter(added), "every request finishes exactly once"
    assert sched.fairway_totals.policy_fallbacks == 0
    return sched


def _check_steps(sched, budget: int) -> int:
    """Check every recorded step; returns the number of contested steps."""
    contested = 0
    counted = sum(sched.fairway_totals.lane_prefill_tokens.values()) - sched.spy_lanes_before
    prefilled = sum(
        n
        for pre, out, _, _ in sched.spy_steps
        for rid, n in out.num_scheduled_tokens.items()
        if rid in pre["prefilling"] or rid in pre["waiting"]
    )
    assert counted == prefilled, "every scheduled prefill token is counted once (async too)"
    gap = None  # D after the last step, while a contest lasts
    front, front_waits, front_bound, front_held = None, 0, 0, False
    for pre, out, record, post in sched.spy_steps:
        # The engine never sees Fairway's temporary settings outside schedule().
        assert (post["threshold"], post["adaptive"], post["active"]) == (
            pre["threshold"], pre["adaptive"], pre["active"],
        )  # fmt: skip
        kept = [rid for rid in post["running"] if rid in pre["running"]]
        assert kept == [rid for rid in pre["running"] if rid in post["running"]]
        share = record["share"]
        candidates = {**pre["waiting"], **{k: a for k, (a, _) in pre["prefilling"].items()}}
        if not candidates or share is None:
            gap = None
            continue
        assert share.front_id in candidates
        started = {k: a for k, (a, _) in pre["prefilling"].items()}
        # started first, finished first: the oldest running prefill, else the oldest request
        assert candidates[share.front_id] == min((started or candidates).values())
        scheduled = out.num_scheduled_tokens
        if not share.contested:
            assert share.cap is None and not share.hold  # vLLM's own step
            gap, front = None, None
            continue
        contested += 1
        fast, fair, steps, active, start_gap, fast_tokens, fair_tokens = record["ledger"]
        assert active and steps >= 1
        before = start_gap if steps == 1 else gap
        assert before is not None, "a contest continues only after a contested step"
        after = fast - fair
        p = share.budget
        assert p <= budget
        first_lane = next(iter(share.lanes.values()))
        if before > 0:
            assert first_lane == "fair", (before, share.lanes)
        work = {v.request_id: v.remaining for v in record["views"]
                if v.request_id in pre["waiting"]}
        work.update({rid: rem for rid, (_, rem) in pre["prefilling"].items()})
        if before <= 0 and first_lane != "fast":  # the Fast lane passed over everything
            assert min(work.values()) > p, (before, share.lanes, p)  # none fits the step
        # at most one new partial prefill, the Fair lane's last placement
        fresh = [rid for rid, n in scheduled.items()
                 if rid in pre["waiting"] and rid in post["prefilling"]]
        assert len(fresh) <= 1, fresh
        if fresh:
            # or vLLM's one per-request cap could not split the step as planned: a running
            # prefill was held (its grant was below the work of a request placed before it) and
            # vLLM gave its tokens to the next requests in the queue
            # (or the Fair front's cap raised after it was held: a cap below P split the step)
            assert share.lanes.get(fresh[0]) == "fair" or share.hold or share.cap < p, (
                fresh, share.lanes, share)
        # the charges are the tokens vLLM scheduled, lane by lane
        assert math.isclose(WEIGHT * fast_tokens - fair_tokens, after - start_gap, abs_tol=1e-6)
        # one chunk either way
        if before <= 0:
            assert after <= max(before, WEIGHT * p) + 1e-6, (before, after, p)
        else:
            assert after >= min(before, -p) - 1e-6, (before, after, p)
        # the Fair front's wait, in contested steps, from when it became the front
        if share.front_id != front:
            front, front_waits, front_held = share.front_id, 0, False
            front_bound = math.ceil(max(0.0, -before) / (WEIGHT * max(1, p))) + 1
        # held although the step had tokens left for it on paper: it would have been capped
        # below the work of a request placed before it; held instead, never two steps in a row
        ahead = 0
        for rid in share.lanes:
            if rid == front:
                break
            ahead += work.get(rid, 0)
        held = front in share.hold and ahead < p
        assert not (held and front_held), front
        front_held = held
        if scheduled.get(front, 0) == 0:
            front_waits += 1
            front_bound += held  # a held step is not one of the bound's
            assert front_waits <= front_bound, (front, front_waits, front_bound, before, p)
        else:
            front_waits = 0
        if steps == 1 and not pre["prefilling"]:
            _check_seed_order(record)
        gap = after
    return contested


def _check_seed_order(record) -> None:
    """The placed head of the first contested step is `fairway-step`'s order of the queue."""
    views, order, lanes = record["views"], record["order"], record["lanes"]
    placed = [i for i, lane in zip(order, lanes, strict=True) if lane != UNPLACED_LANE]
    step = get("fairway-step", fast_weight=WEIGHT)
    fast = fast_lane_order(step.fast_scores(views, record["now"]), views)
    per_step, _, _ = merge(fast, arrival_order(views), [v.remaining for v in views], WEIGHT,
                       step_tokens=record["share"].budget, fit=True)
    assert placed == per_step[: len(placed)]


@pytest.mark.parametrize("setting", [SHORT, LONG], ids=["256-step", "8k-step-128k-prompts"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@settings(
    max_examples=int(os.environ.get("TEST_FAIRWAY_SHARE_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_carried_charges_guarantee_every_step(offline, helpers, async_scheduling, setting, data):
    stream = data.draw(_streams(setting[1]))
    sched = _run(offline, helpers, stream, async_scheduling, setting)
    target(float(_check_steps(sched, setting[0])))  # steer towards contested streams


@pytest.mark.parametrize("setting", [SHORT, LONG], ids=["256-step", "8k-step-128k-prompts"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_long_miss_among_hits_is_checked_in_contested_steps(
    offline, helpers, async_scheduling, setting
):
    """A fixed stream (a long miss, then hits and misses) gives both schedulers contested steps,
    so the random test's checks are not vacuous there."""
    largest = setting[1]
    stream = [[(False, largest, 1)], [(True, 100, 1)] * 3, [(True, 300, 3), (False, 700, 1)],
              [(True, 50, 1)] * 3, [(False, largest // 2, 1), (True, 20, 1)]]
    sched = _run(offline, helpers, stream, async_scheduling, setting)
    assert _check_steps(sched, setting[0]) >= 3


def test_long_miss_running_does_not_block_hits(offline, helpers):
    """A 32k-token miss that runs alone gets whole steps; hits arriving behind it go first (the
    paper's start: M's work is the Fair ledger) and then get the Fast lane's share of every step,
    M the Fair lane's: no step gives M everything while hits wait, none starves M."""
    sched = offline.make_offline_scheduler(
        "fairway", num_blocks=6_000, max_num_batched_tokens=2_048, max_num_seqs=256
    )
    clock = [1.0]
    sched.fairway_clock = lambda: clock[0]
    sched.add_request(offline.make_request("seed", PREFIX, 0.0))
    offline.run_until_idle(sched)
    sched.add_request(offline.make_request("M", helpers.tokens(100_000, 32_000), 1.0))
    out, _ = offline.step(sched)
    assert dict(out.num_scheduled_tokens) == {"M": 2_048}  # alone: the whole step
    assert not sched.fairway_last_plan.contested
    hit_tokens = miss_tokens = 0
    for step in range(12):  # 40 hits of 100 new tokens arrive every step: overload
        clock[0] = 1.1 + 0.1 * step
        for i in range(40):
            prompt = PREFIX + helpers.tokens(200_000 + 1_000 * (40 * step + i), 100)
            sched.add_request(offline.make_request(f"H{step}-{i}", prompt, clock[0]))
        out, _ = offline.step(sched)
        tokens = dict(out.num_scheduled_tokens)
        assert sum(tokens.values()) == 2_048
        assert tokens.get("M", 0) < 2_048  # never the whole step while hits wait
        hit_tokens += sum(n for rid, n in tokens.items() if rid != "M")
        miss_tokens += tokens.get("M", 0)
    ledger = sched.fairway_policy.ledger
    # M's 29,952 remaining tokens were the Fair ledger's start: the hits first got a quarter of
    # that (7,488 tokens), then the lanes share: M 4/5 of each step, within one chunk.
    assert ledger.active and ledger.steps == 12
    assert ledger.fast_tokens + ledger.fair_tokens == hit_tokens + miss_tokens
    assert ledger.fast_tokens <= hit_tokens  # M is the Fair lane's (a few hits may be too)
    assert abs(WEIGHT * ledger.fast_tokens - ledger.fair_tokens
               - (ledger.gap - ledger.start_gap)) < 1e-6
    assert miss_tokens >= 4 * (12 * 2_048 - 7_488) / 5 - 2_048
    assert hit_tokens >= 7_488
    helpers.check_queues(sched)


@pytest.mark.parametrize("inject", ["ordering_raises", "apply_raises", "schedule_raises"])
def test_share_failures_keep_vllms_step(offline, helpers, monkeypatch, inject):
    """A failing share never stops the engine: vLLM's own step (order, threshold, running list),
    counted as a fallback; an exception inside vLLM's schedule() still restores the settings."""
    from fairway.vllm import step_plan

    sched = offline.make_offline_scheduler("fairway", num_blocks=500, max_num_batched_tokens=64)
    sched.add_request(offline.make_request("seed", PREFIX, 0.0))
    offline.run_until_idle(sched)  # r0's prefix is cached: r0 has the best score
    for i in range(6):  # newest first in arrival time
        prompt = PREFIX + helpers.tokens(1_000, 16) if i == 0 else helpers.tokens(1_000 * i, 100)
        sched.add_request(offline.make_request(f"r{i}", prompt, 10.0 - i))
    sched.fairway_clock = lambda: 11.0
    vllm_order = helpers.queue_ids(sched)
    if inject == "ordering_raises":
        monkeypatch.setattr(sched.fairway_policy, "ordering", _boom)
    elif inject == "apply_raises":
        monkeypatch.setattr(step_plan, "apply", _boom)
    else:
        out, _ = offline.step(sched)  # contested (r5 the oldest, r0 the best hit): applied
        assert sched.fairway_last_plan.cap is not None
        base = type(sched).__mro__[2]  # vLLM's Scheduler under the mixin
        monkeypatch.setattr(base, "schedule", _boom)
        with pytest.raises(RuntimeError, match="injected"):
            sched.schedule()
        assert sched.scheduler_config.long_prefill_token_threshold == 0
        assert sched.max_num_active_reqs == 64
        return
    out, _ = offline.step(sched)
    # ordering failed: vLLM's FCFS order; apply failed: Fairway's order with vLLM's own
    # split (no cap: the second request takes the rest of the 64-token budget).
    assert vllm_order[:2] == ["r0", "r1"]  # the order they came in
    second = "r1" if inject == "ordering_raises" else "r5"  # the paper's merge: r0, then r5
    assert dict(out.num_scheduled_tokens) == {"r0": 16, second: 48}
    assert sched.fairway_totals.policy_fallbacks >= 1
    assert sched.scheduler_config.long_prefill_token_threshold == 0
    helpers.check_queues(sched)
    monkeypatch.undo()
    offline.run_until_idle(sched)
    assert not sched.requests


def _boom(*args, **kwargs):
    raise RuntimeError("injected failure")


def test_configured_and_adaptive_threshold_are_restored(offline, helpers):
    """vLLM's own threshold (here 1,024, adaptive) governs uncontested steps and comes back after
    every contested one; during a contested step Fairway's cap replaces it (adaptive suspended)."""
    sched = offline.make_offline_scheduler(
        "fairway",
        num_blocks=6_000,
        max_num_batched_tokens=2_048,
        long_prefill_token_threshold=1_024,
        long_prefill_token_threshold_adaptive=True,
    )
    sched.fairway_clock = lambda: 1.2
    sched.add_request(offline.make_request("seed", PREFIX, 0.0))
    offline.run_until_idle(sched)
    sched.add_request(offline.make_request("M", helpers.tokens(100_000, 32_000), 1.0))
    for i in range(40):
        prompt = PREFIX + helpers.tokens(200_000 + 1_000 * i, 100)
        sched.add_request(offline.make_request(f"H{i}", prompt, 1.1))
    out, _ = offline.step(sched)
    assert sched.fairway_last_plan.contested
    assert sched.fairway_last_plan.cap is not None
    assert sum(out.num_scheduled_tokens.values()) == 2_048  # the hits first, no 1,024 chunks
    assert sched.scheduler_config.long_prefill_token_threshold == 1_024
    assert sched.adaptive_long_prefill_threshold is True
    offline.run_until_idle(sched)
    assert not sched.requests
