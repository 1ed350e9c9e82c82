"""Priority levels and tenants through vLLM's real Scheduler and AsyncScheduler.

Random streams of hits and misses from three tenants at two priority levels, under
`--scheduling-policy priority` and Fairway's `tenants` option; every step is checked from the
SchedulerOutput and the policy's counters:

* levels are strict: a waiting request of a lower level (higher value) gets tokens in a step only
  if every waiting request of a higher level got some (vLLM's admission stops at the first that
  does not fit, so one that fits is never passed over for a lower level);
* the tenants' counters (uncached tokens scheduled over weight) of the tenants with work at the
  top level before and after a step stay within the bound of docs/design.md: the largest minus
  the smallest is at most (C + 2 P) / w_min + the largest change of one counter in the step (P
  the step's prefill budget, C = `tenant_credit_steps` x P the credit);
* every request stays in exactly one queue and finishes exactly once; no step falls back.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.integration

PREFIX = list(range(500, 500 + 320))
TENANTS = {"a": 1.0, "b": 2.0, "c": 1.0}
BUDGET = 256


def _spy(base):
    class Spy(base):
        def schedule(self, *args, **kwargs):
            waiting = {r.request_id: r.priority for r in self.waiting}
            codes = {None: 0, **{name: k + 1 for k, name in enumerate(TENANTS)}}
            top = min(waiting.values(), default=0)
            running = [r for r in self.running if r.num_computed_tokens < r.num_prompt_tokens]
            top = min([top, *(r.priority for r in running)])
            self.spy_top.append({
                codes[(r.sampling_params.extra_args or {}).get("tenant")]
                for r in [*self.waiting, *running] if r.priority == top
            })
            counters_before = self.fairway_policy.tenant_counters()
            out = super().schedule(*args, **kwargs)
            self.spy_steps.append((waiting, dict(out.num_scheduled_tokens), counters_before,
                                   self.fairway_last_plan))
            return out

    return Spy


def _stream():
    arrival = st.tuples(
        st.booleans(),  # hit or miss
        st.integers(16, 4 * BUDGET),  # uncached tokens
        st.sampled_from(["a", "b", "c", None]),
        st.sampled_from([0, 0, 1]),
    )
    return st.lists(st.lists(arrival, max_size=4), min_size=1, max_size=12)


def _run(offline, helpers, stream, async_scheduling):
    from fairway.vllm.scheduler import FairwayAsyncScheduler, FairwayScheduler

    base = FairwayAsyncScheduler if async_scheduling else FairwayScheduler
    sched = offline.make_offline_scheduler(
        "fairway", num_blocks=4_000, max_num_batched_tokens=BUDGET, max_num_seqs=64,
        scheduler_cls=_spy(base), async_scheduling=async_scheduling,
        fairway_options={"tenants": TENANTS}, scheduling_policy="priority",
    )
    clock = [0.0]
    sched.fairway_clock = lambda: clock[0]
    sched.spy_steps = []
    sched.spy_top = []
    sched.add_request(offline.make_request("warm", PREFIX, 0.0))
    offline.run_until_idle(sched)
    sched.spy_steps.clear()
    sched.spy_top.clear()
    added, finished = [], []
    step_no = 0
    while step_no < len(stream) or sched.has_requests():
        step_no += 1
        clock[0] = step_no * 0.05
        for k, (hit, size, tenant, priority) in enumerate(
            stream[step_no - 1] if step_no <= len(stream) else []
        ):
            rid = f"r{step_no}-{k}"
            suffix = helpers.tokens(1_000_000 * (step_no * 5 + k + 1), size)
            sched.add_request(offline.make_request(
                rid, (PREFIX + suffix) if hit else suffix, clock[0], 1,
                priority=priority, tenant=tenant,
            ))
            added.append(rid)
        _, outputs = offline.step(sched)
        finished += offline.finished_ids(outputs)
        helpers.check_queues(sched)
        assert step_no < 2_000, "the stream must drain"
    assert Counter(finished) == Counter(added), "every request finishes exactly once"
    assert sched.fairway_totals.policy_fallbacks == 0
    return sched


def _check(sched) -> int:
    """The two properties over every recorded step; returns the contested steps seen."""
    weights = [1.0, *TENANTS.values()]
    credit = sched.fairway_policy.tenant_credit_steps * BUDGET
    bound = (credit + 2 * BUDGET) / min(weights)
    contested = 0
    steps = sched.spy_steps
    for k, (waiting, scheduled, before, _plan) in enumerate(steps):
        got = {rid for rid in waiting if scheduled.get(rid, 0) > 0}
        for rid in got:
            higher = [other for other, p in waiting.items() if p < waiting[rid]]
            assert all(other in got for other in higher), (
                f"step {k}: {rid} (priority {waiting[rid]}) got tokens while a higher level "
                f"waited without: {[o for o in higher if o not in got]}"
            )
        after = steps[k + 1][2] if k + 1 < len(steps) else {}
        # tenants with work at the top level before and after the step (levels are strict: a
        # tenant's share is among the requests it competes with)
        top = sched.spy_top[k] & (sched.spy_top[k + 1] if k + 1 < len(steps) else set())
        both = sorted(set(before) & set(after) & top)
        if len(both) >= 2:
            contested += 1
            moved = max(abs(after[c] - before[c]) for c in both)
            spread = max(after[c] for c in both) - min(after[c] for c in both)
            assert spread <= bound + moved, (
                f"step {k}: tenant counters {after} spread {spread} > {bound} + {moved}"
            )
    return contested


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@settings(
    max_examples=int(os.environ.get("TEST_FAIRWAY_SHARE_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_levels_are_strict_and_tenant_counters_stay_within_the_bound(
    offline, helpers, async_scheduling, data
):
    sched = _run(offline, helpers, data.draw(_stream()), async_scheduling)
    _check(sched)


def test_a_fixed_two_tenant_backlog_is_checked(offline, helpers):
    """A fixed stream with both tenants backlogged for many steps, so the check is not vacuous."""
    stream = [[(False, 4 * BUDGET, "a", 0), (True, 200, "b", 0)] for _ in range(6)]
    stream += [[(True, 60, "b", 1), (False, 3 * BUDGET, "c", 0)] for _ in range(4)]
    sched = _run(offline, helpers, stream, False)
    assert _check(sched) >= 5
