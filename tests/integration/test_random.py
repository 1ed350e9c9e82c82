"""Seeded random runs under every registered policy, checking invariants at every step:
the queue handed to vLLM is a permutation of the waiting queue, no request is lost or duplicated,
every request finishes exactly once, and Fairway's bound holds."""

from __future__ import annotations

import random
from collections import Counter, deque

import pytest

import fairway.policies as policies
from fairway.policies import UNPLACED_LANE, arrival_order

pytestmark = pytest.mark.integration

STEPS = 70
BOUNDED = ("fairway-step", "fairway-abswait")  # the paper's per-step work-charge bound


def _spy(base):
    class Spy(base):
        """Records the waiting queue right before and right after Fairway's re-sort."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            reorder = self.fairway_prepass.reorder
            self.fairway_prepass.reorder = lambda: self._spied_reorder(reorder)

        def _spied_reorder(self, reorder):
            before = [r.request_id for r in self.waiting]
            step = reorder()
            after = [r.request_id for r in self.waiting]
            assert Counter(after) == Counter(before), "re-sort must permute the queue"
            assert len(set(after)) == len(after), "no request twice in the queue"
            if step is not None:  # the policy saw exactly what vLLM's own lookup finds now
                mirror = self.fairway_mirror
                views = self.fairway_last_views
                for view in views:
                    fresh = mirror.fresh_cached_tokens(self.requests[view.request_id])
                    assert view.cached_tokens == fresh, view
                # the queue is the order applied (after the preempted requests kept first)
                ordered = [views[i].request_id for i in self.fairway_last_order]
                assert after[step.num_fixed : step.num_fixed + len(ordered)] == ordered
                lanes = self.fairway_last_ordering.lanes or ()
                self.head_orders += UNPLACED_LANE in lanes  # exact in its head only
            self.spy_steps += 1
            return step

    Spy.spy_steps = 0
    Spy.head_orders = 0  # steps whose order was exact in its head only (`Step.head`)
    return Spy


def _check_bound(sched) -> None:
    views, order = sched.fairway_last_views, sched.fairway_last_order
    if len(views) < 2:
        return
    oldest = arrival_order(views)[0]
    lanes = sched.fairway_last_ordering.lanes  # of the same (last ordered) step
    ahead = 0
    for position, i in enumerate(order):
        if i == oldest or lanes[position] == UNPLACED_LANE:
            break  # past the head the queue keeps its order: no lane placed those (an exact head)
        ahead += views[i].remaining
    weight = sched.fairway_policy.fast_weight
    overshoot = max(v.remaining for v in views)
    assert ahead <= views[oldest].remaining / weight + overshoot, (ahead, views[oldest])


def _arrivals(rng, helpers, n0, now, extra=0):
    prefixes = [helpers.tokens(100_000 * (g + 1), 16 * (2 + 5 * g)) for g in range(5)]
    for k in range(rng.choice((0, 0, 1, 1, 2, 4)) + extra):
        n = n0 + k
        prefix = rng.choice(prefixes) if rng.random() < 0.8 else []
        prompt = prefix + helpers.tokens(1_000_000 + 1_000 * n, rng.randint(1, 300))
        yield f"q{n}", prompt, now - rng.random() * 0.2, rng.choice((1, 1, 1, 3))


def _run(offline, helpers, policy, *, seed, async_scheduling=False, burst=0):
    from fairway.vllm.scheduler import FairwayAsyncScheduler, FairwayScheduler

    base = FairwayAsyncScheduler if async_scheduling else FairwayScheduler
    sched = offline.make_offline_scheduler(
        policy,
        num_blocks=300,
        max_num_batched_tokens=192,
        max_num_seqs=8,
        scheduler_cls=_spy(base),
        async_scheduling=async_scheduling,
    )
    rng = random.Random(seed)
    clock = [0.0]
    sched.fairway_clock = lambda: clock[0]
    added: list[str] = []
    finished: list[str] = []
    for step_no in range(STEPS + 400):
        clock[0] = step_no * 0.05
        if step_no < STEPS:
            for request_id, prompt, arrival, max_tokens in _arrivals(
                rng, helpers, len(added), clock[0], burst if step_no == 0 else 0
            ):
                sched.add_request(offline.make_request(request_id, prompt, arrival, max_tokens))
                added.append(request_id)
        elif not sched.has_requests():
            break
        _, engine_outputs = offline.step(sched)
        finished += offline.finished_ids(engine_outputs)
        helpers.check_queues(sched)
        if policy in BOUNDED:
            _check_bound(sched)
    assert not sched.has_requests()
    assert Counter(finished) == Counter(added), "every request finishes exactly once"
    assert sched.fairway_totals.policy_fallbacks == 0
    assert sched.spy_steps > STEPS // 2
    return sched


@pytest.mark.parametrize("policy", policies.names())
def test_random_run_every_policy(offline, helpers, policy):
    _run(offline, helpers, policy, seed=sum(map(ord, policy)))


@pytest.mark.parametrize("moved_by_slices", [8, 64])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_random_run_with_a_long_queue_orders_by_the_head(
    offline, helpers, monkeypatch, async_scheduling, moved_by_slices
):
    """40 requests at the start: the queue outgrows the Fast lane's sorted prefix, so `fairway`
    orders only the scan's head exactly (the rest in row order), and the queue is still exactly
    that order, whether the probe moves the head by list slices (up to `MIN_MOVED` rows in a
    short queue) or rebuilds the queue from the whole order."""
    from fairway.vllm import queue_table

    monkeypatch.setattr(queue_table, "MIN_MOVED", moved_by_slices)
    sched = _run(offline, helpers, "fairway", seed=11, async_scheduling=async_scheduling, burst=40)
    assert sched.head_orders > 0


@pytest.mark.parametrize("policy", ["fairway", "lpm"])
def test_random_run_async_scheduler(offline, helpers, policy):
    _run(offline, helpers, policy, seed=5, async_scheduling=True)


def test_async_scheduler_with_two_steps_in_flight(offline, helpers):
    """The engine's batch-queue pattern: schedule step N+1 before step N's output is processed."""
    from fairway.vllm.offline_vllm import sampled_tokens

    sched = offline.make_offline_scheduler(
        "fairway", async_scheduling=True, num_blocks=400, max_num_batched_tokens=128
    )
    prefix = helpers.tokens(1, 160)
    for i in range(12):
        prompt = (prefix if i % 2 else []) + helpers.tokens(10_000 * (i + 1), 40 + 10 * i)
        sched.add_request(offline.make_request(f"a{i}", prompt, float(i), max_tokens=4))
    in_flight: deque = deque()
    finished: list[str] = []
    for _ in range(500):
        if not sched.has_requests() and not in_flight:
            break
        output = sched.schedule()
        in_flight.append((output, sampled_tokens(sched, output)))
        if len(in_flight) == 2 or output.total_num_scheduled_tokens == 0:
            done, sampled = in_flight.popleft()
            engine_outputs = sched.update_from_output(
                done, offline.fake_model_output(sched, done, sampled=sampled)
            )
            finished += offline.finished_ids(engine_outputs)
        helpers.check_queues(sched)
    assert sorted(finished) == sorted(f"a{i}" for i in range(12))
    assert sched.fairway_totals.policy_fallbacks == 0
