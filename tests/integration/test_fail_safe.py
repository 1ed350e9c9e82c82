"""Fault injection: whatever fails in the pre-pass, schedule() returns, nothing is lost or
duplicated in the waiting queue, vLLM's order is kept for that step and the fallback is counted."""

from __future__ import annotations

import logging

import pytest

from fairway.policies import Ordering

pytestmark = pytest.mark.integration


def _queue(offline, helpers, policy="fairway-step", **kwargs):
    kwargs.setdefault("num_blocks", 500)
    kwargs.setdefault("max_num_batched_tokens", 64)
    sched = offline.make_offline_scheduler(policy, **kwargs)
    for i in range(6):  # newest first in arrival time, so any real ordering changes the deque
        sched.add_request(offline.make_request(f"r{i}", helpers.tokens(1_000 * i, 100), 10.0 - i))
    return sched


def _boom(*args, **kwargs):
    raise RuntimeError("injected failure")


@pytest.mark.parametrize(
    "inject",
    ["policy_raises", "probe_raises", "not_a_permutation", "duplicate_index", "float_index"],
)
def test_failures_fall_back_to_vllm_order(offline, helpers, caplog, inject):
    sched = _queue(offline, helpers)
    if inject == "policy_raises":
        sched.fairway_policy.order = _boom
    elif inject == "probe_raises":
        sched.fairway_mirror.snapshot = _boom
    elif inject == "not_a_permutation":
        sched.fairway_policy.order = lambda queue, now: list(range(len(queue) - 1))
    elif inject == "duplicate_index":
        sched.fairway_policy.order = lambda queue, now: [0] * len(queue)
    else:
        sched.fairway_policy.order = lambda queue, now: [float(i) for i in range(len(queue))]
    injected = vars(sched.fairway_policy).get("order")
    if injected is not None:  # the scheduler calls fairway-step's engine path, `ordering`
        sched.fairway_policy.ordering = lambda cols, step: Ordering(injected(cols, step.now))
    caplog.set_level(logging.WARNING, logger="fairway")
    vllm_order = helpers.queue_ids(sched)
    out1, _ = offline.step(sched)
    out2, _ = offline.step(sched)
    assert list(out1.num_scheduled_tokens) == vllm_order[:1]  # FCFS head got the 64 tokens
    assert sched.fairway_totals.policy_fallbacks == 2
    assert sched.fairway_totals.steps_ordered == 0
    warnings = [r for r in caplog.records if "vLLM's order is kept" in r.getMessage()]
    assert len(warnings) == 1, "logged once per exception type"
    assert "injected failure" not in warnings[0].getMessage()  # details only in the traceback
    helpers.check_queues(sched)
    assert out2.num_scheduled_tokens
    # It keeps serving: everything finishes.
    offline.run_until_idle(sched)
    assert not sched.requests


def test_a_failed_ordering_leaves_no_last_order(offline, helpers):
    """The last order describes the last step that ordered: after a step whose policy raised,
    there is none (it is dropped before the policy runs), and the next ordered step has one."""
    sched = _queue(offline, helpers)
    offline.step(sched)
    assert sched.fairway_last_views and sched.fairway_last_ordering is not None
    ordering = sched.fairway_policy.ordering
    sched.fairway_policy.ordering = _boom
    offline.step(sched)
    assert sched.fairway_totals.policy_fallbacks == 1
    assert sched.fairway_last_views == [] and sched.fairway_last_ordering is None
    assert sched.fairway_last_order == []
    sched.fairway_policy.ordering = ordering
    waiting = helpers.queue_ids(sched)
    offline.step(sched)
    assert {v.request_id for v in sched.fairway_last_views} == set(waiting)
    assert sched.fairway_last_ordering is not None


def test_on_step_end_failure_is_contained(offline, helpers):
    sched = _queue(offline, helpers)
    sched.fairway_policy.on_step_end = _boom
    offline.run_until_idle(sched)
    assert not sched.requests
    assert sched.fairway_totals.policy_fallbacks > 0


def test_abort_between_steps(offline, helpers):
    from vllm.v1.request import RequestStatus

    sched = _queue(offline, helpers)
    offline.step(sched)
    waiting = helpers.queue_ids(sched)
    sched.finish_requests(waiting[:2], RequestStatus.FINISHED_ABORTED)
    helpers.check_queues(sched)
    offline.step(sched)
    helpers.check_queues(sched)
    assert sched.fairway_totals.policy_fallbacks == 0
    for request_id in waiting[:2]:
        assert request_id not in {v.request_id for v in sched.fairway_last_views}
    offline.run_until_idle(sched)
    assert not sched.requests


def test_memo_of_aborted_requests_is_trimmed(offline, helpers):
    from vllm.v1.request import RequestStatus

    sched = offline.make_offline_scheduler(
        "lpm", num_blocks=2_000, max_num_batched_tokens=16, max_num_seqs=16
    )
    for i in range(150):
        sched.add_request(offline.make_request(f"a{i}", helpers.tokens(100 * i, 40), float(i)))
    offline.step(sched)
    assert len(sched.fairway_mirror) >= 149
    sched.finish_requests([f"a{i}" for i in range(1, 150)], RequestStatus.FINISHED_ABORTED)
    offline.step(sched)
    assert len(sched.fairway_mirror) <= 64


@pytest.mark.parametrize("reorder_preempted", [False, True])
def test_preemption(offline, helpers, reorder_preempted):
    """Decoding requests outgrow a tiny cache: vLLM preempts; the queue stays consistent."""
    sched = offline.make_offline_scheduler(
        "fairway",
        num_blocks=24,
        max_num_batched_tokens=256,
        max_num_seqs=8,
        fairway_options={"reorder_preempted": reorder_preempted},
    )
    for i in range(4):
        sched.add_request(
            offline.make_request(f"d{i}", helpers.tokens(1_000 * i, 60), float(i), max_tokens=120)
        )
    preempted_seen = 0
    for step_no in range(400):
        if not sched.has_requests():
            break
        if step_no % 20 == 5:  # new arrivals behind the preempted ones
            sched.add_request(
                offline.make_request(f"n{step_no}", helpers.tokens(90_000 + step_no, 30), 50.0)
            )
        waiting = list(sched.waiting)
        preempted = [r.request_id for r in waiting if r.num_preemptions > 0]
        preempted_seen += bool(preempted)
        offline.step(sched)
        helpers.check_queues(sched)
        if preempted and not reorder_preempted:
            # vLLM's rule kept: the preempted requests headed the queue we handed to vLLM.
            head = [r.request_id for r in waiting[: len(preempted)]]
            assert head == preempted
    assert preempted_seen, "the scenario must preempt"
    assert not sched.has_requests()
    assert sched.fairway_totals.policy_fallbacks == 0
