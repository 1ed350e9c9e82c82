"""The cross-step share, proved through vLLM's real Scheduler and AsyncScheduler.

Random request streams (cache hits sharing a prefix, misses up to ~6x the step budget, arrivals
between steps, a few decodes); every step is checked from the SchedulerOutput against the
guarantee stated in `FairwayPolicy`'s docstring and FAIRWAY.md:

* O (the oldest request not done with its prefill, recomputed here from the scheduler's state)
  gets at least min(d_O, floor(P / (1 + w))) prefill tokens in every contested step;
* a contested step is work-conserving up to one cap's rounding (held-back steps excepted);
* an uncontested step is vLLM's own: every prefill gets all it needs, no cap, no reorder;
* the configured threshold, adaptive flag, slot limit and running order are back after each step;
* every request stays in exactly one queue and finishes exactly once.
"""

from __future__ import annotations

import math
import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.integration

BUDGET = 256
PREFIX = list(range(500, 500 + 320))  # 20 blocks of 16, cached by a seed request
WEIGHT = 4.0


def _spy(base):
    class Spy(base):
        """Records the state before each step and what vLLM scheduled."""

        def schedule(self, *args, **kwargs):
            pre = _state(self)
            out = super().schedule(*args, **kwargs)
            post = _state(self)
            post["computed"] = {
                rid: (self.requests[rid].num_computed_tokens, self.requests[rid].num_prompt_tokens)
                for rid in out.num_scheduled_tokens
            }
            self.spy_steps.append((pre, out, self.fairway_policy.last_share, post))
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


arrival = st.tuples(
    st.booleans(),  # hit (shares PREFIX) or miss
    st.integers(16, 6 * BUDGET),  # uncached tokens
    st.sampled_from((1, 1, 1, 3)),  # max_tokens (3: two decode steps)
)
streams = st.lists(st.lists(arrival, max_size=3), min_size=1, max_size=10)


def _run(offline, helpers, stream, async_scheduling):
    from fairway.vllm.scheduler import FairwayAsyncScheduler, FairwayScheduler

    base = FairwayAsyncScheduler if async_scheduling else FairwayScheduler
    sched = offline.make_offline_scheduler(
        "fairway",
        num_blocks=4_000,
        max_num_batched_tokens=BUDGET,
        max_num_seqs=64,
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
            suffix = helpers.tokens(10_000 * (step_no * 4 + k + 1), size)
            prompt = (PREFIX + suffix) if hit else suffix
            sched.add_request(offline.make_request(rid, prompt, clock[0], max_tokens))
            added.append(rid)
        _, engine_outputs = offline.step(sched)
        finished += offline.finished_ids(engine_outputs)
        helpers.check_queues(sched)
        assert step_no < 500, "the stream must drain"
    assert Counter(finished) == Counter(added), "every request finishes exactly once"
    assert sched.fairway_totals.policy_fallbacks == 0
    return sched


def _check_steps(sched, async_scheduling) -> int:
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
    for pre, out, share, post in sched.spy_steps:
        # The engine never sees Fairway's temporary settings outside schedule().
        assert (post["threshold"], post["adaptive"], post["active"]) == (
            pre["threshold"], pre["adaptive"], pre["active"],
        )  # fmt: skip
        kept = [rid for rid in post["running"] if rid in pre["running"]]
        assert kept == [rid for rid in pre["running"] if rid in post["running"]]
        scheduled = out.num_scheduled_tokens
        prefill = {
            rid: n
            for rid, n in scheduled.items()
            if rid in pre["prefilling"] or rid in pre["waiting"]
        }
        decode = sum(n for rid, n in scheduled.items() if rid not in prefill)
        candidates = {**pre["waiting"], **{k: a for k, (a, _) in pre["prefilling"].items()}}
        if not candidates:
            continue
        # O, recomputed: the oldest by arrival (running prefills first on a tie).
        oldest = min(candidates.values())
        fronts = [k for k in pre["prefilling"] if candidates[k] == oldest] or [
            k for k in pre["waiting"] if candidates[k] == oldest
        ]
        assert share is not None and share.front_id in fronts
        p = BUDGET - decode
        assert share.budget <= p  # decode tokens are estimated, never under
        floor = math.floor(share.budget / (1 + WEIGHT))
        assert share.floor == floor
        got = prefill.get(share.front_id, 0)
        need = _real_demand(post, share, got)
        # The guarantee, in every step (uncontested steps give O all it needs, or all of P).
        assert got >= min(need, floor), (got, need, floor, share, dict(scheduled))
        others = [rid for rid in candidates if rid != share.front_id]
        if share.cap is None:
            if others:  # everything fits: vLLM's own step, every prefill gets all it needs
                for rid in candidates:
                    computed, prompt = post["computed"][rid]
                    assert computed >= prompt, (rid, dict(scheduled), pre)
            continue
        contested += 1
        assert share.target >= min(share.front_demand, floor)
        assert got >= min(need, share.target), (got, need, share, dict(scheduled))
        total = sum(prefill.values())
        if not share.hold:  # work conservation up to one cap's rounding
            assert total >= share.budget - share.cap, (total, share, dict(scheduled))
    return contested


def _real_demand(post, share, got) -> int:
    """O's remaining tokens as vLLM saw them at the step (its own prefix lookup at admission)."""
    if got == 0:
        return share.front_demand
    computed, prompt = post["computed"][share.front_id]
    return min(share.front_demand, prompt - (computed - got))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@settings(
    max_examples=int(os.environ.get("FAIRWAY_SHARE_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(stream=streams)
def test_share_guarantee_every_step(offline, helpers, async_scheduling, stream):
    sched = _run(offline, helpers, stream, async_scheduling)
    _check_steps(sched, async_scheduling)


def test_long_miss_running_does_not_block_hits(offline, helpers):
    """Failure 2 of the seed: a 32k-token miss that started is no longer served first with the
    whole budget; hits arriving behind it get the Fast lane's share of every step."""
    sched = offline.make_offline_scheduler(
        "fairway", num_blocks=6_000, max_num_batched_tokens=2_048, max_num_seqs=64
    )
    sched.fairway_clock = lambda: 1.2  # short waits: the hits' cache benefit decides
    sched.add_request(offline.make_request("seed", PREFIX, 0.0))
    offline.run_until_idle(sched)
    sched.add_request(offline.make_request("M", helpers.tokens(100_000, 32_000), 1.0))
    out, _ = offline.step(sched)
    assert dict(out.num_scheduled_tokens) == {"M": 2_048}  # alone: the whole step
    for i in range(40):
        prompt = PREFIX + helpers.tokens(200_000 + 1_000 * i, 100)
        sched.add_request(offline.make_request(f"H{i}", prompt, 1.1))
    out, _ = offline.step(sched)
    tokens = dict(out.num_scheduled_tokens)
    assert tokens["M"] == 409  # floor(2048 / 5)
    assert sum(n for rid, n in tokens.items() if rid != "M") == 2_048 - 409
    out, _ = offline.step(sched)
    tokens = dict(out.num_scheduled_tokens)
    assert tokens["M"] == 409 and sum(tokens.values()) == 2_048
    helpers.check_queues(sched)


@pytest.mark.parametrize("inject", ["step_share_raises", "apply_raises", "schedule_raises"])
def test_share_failures_keep_vllms_step(offline, helpers, monkeypatch, inject):
    """A failing share never stops the engine: vLLM's own step (order, threshold, running list),
    counted as a fallback; an exception inside vLLM's schedule() still restores the settings."""
    from fairway.vllm import share

    sched = offline.make_offline_scheduler("fairway", num_blocks=500, max_num_batched_tokens=64)
    for i in range(6):  # newest first in arrival time
        sched.add_request(offline.make_request(f"r{i}", helpers.tokens(1_000 * i, 100), 10.0 - i))
    sched.fairway_clock = lambda: 11.0
    vllm_order = helpers.queue_ids(sched)
    if inject == "step_share_raises":
        monkeypatch.setattr(sched.fairway_policy, "step_share", _boom)
    elif inject == "apply_raises":
        monkeypatch.setattr(share, "apply", _boom)
    else:
        out, _ = offline.step(sched)  # r5 (oldest) gets its floor, the share is applied
        assert sched.fairway_policy.last_share.cap is not None
        base = type(sched).__mro__[2]  # vLLM's Scheduler under the mixin
        monkeypatch.setattr(base, "schedule", _boom)
        with pytest.raises(RuntimeError, match="injected"):
            sched.schedule()
        assert sched.scheduler_config.long_prefill_token_threshold == 0
        assert sched.max_num_active_reqs == 64
        return
    out, _ = offline.step(sched)
    # step_share failed: vLLM's FCFS order; apply failed: Fairway's order (oldest first) with
    # vLLM's own split. Either way one request takes the whole 64-token budget (no cap).
    head = vllm_order[0] if inject == "step_share_raises" else "r5"
    assert dict(out.num_scheduled_tokens) == {head: 64}
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
    assert sched.fairway_policy.last_share.cap is not None
    assert out.num_scheduled_tokens["M"] >= 409 and sum(out.num_scheduled_tokens.values()) == 2_048
    assert sched.scheduler_config.long_prefill_token_threshold == 1_024
    assert sched.adaptive_long_prefill_threshold is True
    offline.run_until_idle(sched)
    assert not sched.requests
