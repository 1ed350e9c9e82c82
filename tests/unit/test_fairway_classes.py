"""`fairway` over several tenants or priority levels (`FairwayPolicy._classed`).

Off (one tenant, one level) the classed path must be exactly today's rule: the property test
forces it on one-class queues and compares every decision with the plain path over carried steps.
With classes: levels are strict, tenants are interleaved by their counters in uncached work.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from fairway.policies import PrefillingRequest, QueuedRequest, get
from fairway.policies.fairway import FairwayPolicy
from fairway.policies.queue import QueueColumns, Step, StepBudget
from fairway.policies.shares import tenant_tags


def _queue(rng: random.Random, n: int, tenants: int = 1, levels: int = 1) -> list[QueuedRequest]:
    out = []
    for i in range(n):
        prompt = rng.randint(20, 3_000)
        cached = rng.choice((0, prompt // 2, max(0, prompt - rng.randint(1, 40))))
        out.append(QueuedRequest(
            f"r{i}", rng.uniform(0, 10), prompt, cached, rng.randrange(tenants),
            rng.randrange(levels),
        ))
    return out


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    slots=st.integers(0, 6),
    tokens=st.sampled_from([0, 64, 512, 2_048, 100_000]),
    num_running=st.integers(0, 3),
    scan=st.sampled_from([None, 2, 9, 40]),
    blocks=st.sampled_from([None, 0, 8, 200, 100_000]),
)
def test_the_classed_path_on_one_class_is_the_plain_rule_decision_for_decision(
    seed: int, slots: int, tokens: int, num_running: int, scan: int | None, blocks: int | None,
) -> None:
    rng = random.Random(seed)
    queue = _queue(rng, rng.choice([0, 1, 5, 30, 200]))
    running = tuple(
        PrefillingRequest(f"p{j}", rng.uniform(0, 9), rng.randint(1, 900), 1_000)
        for j in range(num_running)
    )
    plain, classed = get("fairway"), get("fairway")
    assert isinstance(classed, FairwayPolicy)
    cols = QueueColumns.of(queue)
    budget = StepBudget(tokens, slots, free_blocks=blocks)
    for _ in range(3):
        step = Step(10.0, scan, budget, running)
        want = plain.ordering(cols, step)
        if not len(cols) and not running:
            continue
        got = classed._classed(cols, step, whole=False)
        assert got.plan == want.plan
        k = len(queue) if scan is None else min(scan, len(queue))
        assert list(got.order)[:k] == list(want.order)[:k]
        assert sorted(got.order) == list(range(len(queue)))
        assert list(got.lanes or [])[:k] == list(want.lanes or [])[:k]
        prefill = {rid: 40 for rid in want.plan.lanes} if want.plan else {}
        for policy in (plain, classed):
            policy.on_step_end([], sum(prefill.values()), prefill_by_request=prefill)
        assert plain.ledger == classed.ledger


def test_tenant_tags_add_each_tenants_earlier_work_over_its_weight() -> None:
    import numpy as np

    tenant = np.array([0, 1, 0, 1, 0])
    work = np.array([100.0, 50.0, 300.0, 10.0, 5.0])
    served = np.array([0.0, 200.0])
    weights = np.array([1.0, 2.0])
    tags = tenant_tags(np.array([0, 1, 2, 3, 4]), tenant, work, served, weights)
    assert tags.tolist() == [0.0, 200.0, 100.0, 225.0, 400.0]


def test_a_flood_of_hits_from_one_tenant_does_not_bury_the_other_tenants_miss() -> None:
    """Tenant 1 floods cheap hits; tenant 0's one miss is not behind all of them."""
    heavy = [QueuedRequest(f"h{i}", float(i), 6_300, 6_000, tenant=1) for i in range(40)]
    light = [QueuedRequest("miss", 39.5, 3_000, 0, tenant=0)]
    queue = heavy + light
    budget = StepBudget(2_048, 64)
    plain = get("fairway").ordering(QueueColumns.of([
        QueuedRequest(r.request_id, r.arrival, r.prompt_tokens, r.cached_tokens)
        for r in queue
    ]), Step(40.0, None, budget))
    shared = get("fairway").ordering(QueueColumns.of(queue), Step(40.0, None, budget))
    assert list(plain.order).index(40) > 5  # one tenant: the miss waits behind the hits
    assert list(shared.order).index(40) <= 1  # two tenants at 0 served: it goes first or second


def test_levels_are_strict_and_each_level_is_ordered_by_its_lanes() -> None:
    """Every row of a level comes before every row of a lower one; inside a level the Fair
    lane's placements are in arrival order and the Fast lane's in score order."""
    rng = random.Random(3)
    queue = _queue(rng, 60, levels=3)
    policy = get("fairway")
    assert isinstance(policy, FairwayPolicy)
    got = policy.ordering(QueueColumns.of(queue), Step(10.0, None, StepBudget(2_048, 8)))
    levels = [queue[i].priority for i in got.order]
    assert levels == sorted(levels)
    assert got.lanes is not None
    for level in range(3):
        for lane in ("fair", "fast"):
            rows = [i for i, placed in zip(got.order, got.lanes, strict=True)
                    if queue[i].priority == level and placed == lane]
            if lane == "fair":
                keys = [queue[i].arrival for i in rows]
            else:
                keys = [-policy.fast_score(queue[i], 10.0) for i in rows]
            assert keys == sorted(keys)
        assert any(queue[i].priority == level for i in got.order)


def test_counters_are_charged_in_contested_steps_only() -> None:
    """A step that cannot serve everyone charges each tenant its tokens over its weight; one
    that serves everyone all it asked for charges nothing."""
    policy = get("fairway")
    assert isinstance(policy, FairwayPolicy)
    queue = [QueuedRequest(f"a{i}", float(i), 3_000, 0, tenant=1) for i in range(3)] + [
        QueuedRequest(f"b{i}", float(i) + 0.5, 3_000, 0, tenant=2) for i in range(3)
    ]
    step = Step(5.0, None, StepBudget(2_048, 8), tenant_weights=(1.0, 1.0, 2.0))
    policy.ordering(QueueColumns.of(queue), step)
    before = policy.tenant_counters()
    policy.on_step_end([], 2_048, prefill_by_request={"a0": 1_024, "b0": 1_024})
    after = policy.tenant_counters()
    # counters are shown relative to the lowest: tenant 1 gained 1,024, tenant 2 1,024 / 2
    assert (after[1] - after[2]) - (before[1] - before[2]) == 1_024.0 - 512.0
    small = [QueuedRequest("a9", 9.0, 100, 0, tenant=1), QueuedRequest("b9", 9.0, 100, 0, tenant=2)]
    policy.ordering(QueueColumns.of(small), step)
    policy.on_step_end([], 200, prefill_by_request={"a9": 100, "b9": 100})
    assert policy.tenant_counters() == after


def test_a_returning_tenant_gets_at_most_its_credit() -> None:
    """Back after a pause, a tenant starts no further behind the lowest of those that stayed
    than its credit (`tenant_credit_steps` step budgets), and no lower than it was."""
    policy = get("fairway", tenant_credit_steps=1.0)
    assert isinstance(policy, FairwayPolicy)
    step = Step(5.0, None, StepBudget(2_048, 8))
    two = [
        QueuedRequest("a0", 0.0, 9_000, 0, tenant=1),
        QueuedRequest("b0", 0.1, 9_000, 0, tenant=2),
    ]
    policy.ordering(QueueColumns.of(two), step)
    for _ in range(3):  # tenant 1 alone for three steps: it gets everything
        policy.on_step_end([], 2_048, prefill_by_request={"a0": 2_048})
        policy.ordering(QueueColumns.of(two[:1]), step)
    policy.on_step_end([], 2_048, prefill_by_request={"a0": 2_048})
    policy.ordering(QueueColumns.of(two), step)
    counters = policy.tenant_counters()
    assert counters[1] - counters[2] == 2_048.0  # 4 steps behind, lifted to one step's credit
    policy = get("fairway", tenant_credit_steps=0.0)
    policy.ordering(QueueColumns.of(two), step)
    policy.on_step_end([], 2_048, prefill_by_request={"a0": 2_048})
    policy.ordering(QueueColumns.of(two[:1]), step)
    policy.on_step_end([], 2_048, prefill_by_request={"a0": 2_048})
    policy.ordering(QueueColumns.of(two), step)
    counters = policy.tenant_counters()
    assert counters[1] == counters[2]  # no credit: VTC's lift


def test_a_bad_credit_is_refused() -> None:
    import pytest

    from fairway.errors import FairwayConfigError

    for bad in (-1, float("inf"), "x", True):
        with pytest.raises(FairwayConfigError, match="tenant_credit_steps"):
            get("fairway", tenant_credit_steps=bad)
