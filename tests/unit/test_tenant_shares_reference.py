"""`fairway` with tenants and levels: the engine path against the same rule over whole lanes.

Two policy objects see the same evolving queue of several tenants (weights 1, 2 and 0.5) and
priority levels over carried steps: one through `ordering()` (the scan's head; each share class's
lanes read only while its waiting work is below the step's tokens), the other through `decide()`
(every class's whole lanes). What the step serves must be equal, prefill token for prefill token:
the served plan (cap, held prefills, running order of those served), the tokens each request gets,
and after the step the lanes' ledgers and the tenants' counters.
"""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from fairway.policies import Ordering, PrefillingRequest, QueuedRequest, get
from fairway.policies.fairway import FairwayPolicy
from fairway.policies.queue import QueueColumns, Step, StepBudget
from fairway.policies.split import grants

WEIGHTS = (1.0, 2.0, 0.5)


def _request(rng: random.Random, i: int, now: float, levels: int) -> QueuedRequest:
    prompt = rng.randint(20, 5_000)
    cached = rng.choice((0, prompt // 2, max(0, prompt - rng.randint(1, 40)), prompt))
    return QueuedRequest(f"r{i}", now - rng.uniform(0, 8), prompt, cached,
                         tenant=rng.randrange(len(WEIGHTS)), priority=rng.randrange(levels))


def _served(decided: Ordering, waiting: list[QueuedRequest], running: list[PrefillingRequest],
            tokens: int, free: int) -> dict[str, int]:
    """The prefill tokens the step gives each request under this decision: the running prefills
    not held (capped), then the first `free` waiting requests of the order, in turn."""
    plan = decided.plan
    assert plan is not None
    keys = [-(j + 1) for j in range(len(running))] + [int(i) for i in decided.order][:free]
    work = {-(j + 1): p.remaining for j, p in enumerate(running)}
    work.update({int(i): waiting[int(i)].remaining for i in decided.order})
    prefill: dict[str, int] = {}
    for key, amount in zip(keys, grants(keys, work, tokens, free), strict=True):
        rid = running[-key - 1].request_id if key < 0 else waiting[key].request_id
        if amount and rid not in plan.hold:
            prefill[rid] = min(amount, plan.cap or amount) if key < 0 else amount
    return prefill


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    size=st.sampled_from([2, 6, 20, 60]),
    tokens=st.sampled_from([256, 2_048, 8_192]),
    slots=st.sampled_from([1, 2, 4, 8, 24]),
    levels=st.sampled_from([1, 2]),
    extra_scan=st.integers(0, 10),
)
def test_the_engine_path_serves_as_the_whole_lanes_with_tenants(
    seed: int, size: int, tokens: int, slots: int, levels: int, extra_scan: int
) -> None:
    rng = random.Random(seed)
    engine, rule = get("fairway"), get("fairway")
    assert isinstance(engine, FairwayPolicy) and isinstance(rule, FairwayPolicy)
    now, next_id = 10.0, size
    waiting = [_request(rng, i, now, levels) for i in range(size)]
    running: list[PrefillingRequest] = []
    for _ in range(6):  # carried steps
        free = slots if rng.random() < 0.8 else 0
        budget = StepBudget(tokens, free)
        head = None if rng.random() < 0.3 else free + extra_scan
        got = engine.ordering(QueueColumns.of(waiting),
                              Step(now, head, budget, tuple(running), WEIGHTS))
        want = rule.decide(waiting, Step(now, None, budget, tuple(running), WEIGHTS))
        assert got.plan is not None and want.plan is not None
        assert (got.plan.cap, got.plan.hold, got.plan.front_id, got.plan.contested) == (
            want.plan.cap, want.plan.hold, want.plan.front_id, want.plan.contested)
        prefill = _served(want, waiting, running, tokens, free)
        assert _served(got, waiting, running, tokens, free) == prefill
        started = [r.request_id for r in waiting if r.request_id in prefill]
        for policy in (engine, rule):
            policy.on_step_end(started, sum(prefill.values()), prefill_by_request=prefill)
        assert dataclasses.astuple(engine.ledger) == dataclasses.astuple(rule.ledger)
        assert engine.tenant_counters() == rule.tenant_counters()

        still: list[PrefillingRequest] = []
        for p in running:
            left = p.remaining - prefill.get(p.request_id, 0)
            if left > 0:
                still.append(dataclasses.replace(p, remaining=left))
        kept = []
        for r in waiting:
            if r.request_id in prefill:
                left = r.remaining - prefill[r.request_id]
                if left > 0:
                    still.append(PrefillingRequest(r.request_id, r.arrival, left,
                                                   r.prompt_tokens, r.tenant, r.priority))
            else:
                kept.append(r)
        running, waiting = still, kept
        for _ in range(rng.randint(0, 4)):
            waiting.append(_request(rng, next_id, now, levels))
            next_id += 1
        now += rng.choice([0.05, 0.5, 2.0])
