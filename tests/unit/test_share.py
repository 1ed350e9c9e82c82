"""The cross-step share's pure logic: the scan model, water-filling, the plan and the ledgers.

No vLLM: the plan is checked against `grants`, the model of vLLM's scan it is built on (the
integration test `tests/integration/test_share_property.py` checks it against the real Scheduler).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairway.policies import get
from fairway.policies.base import PrefillingRequest, QueuedRequest, StepBudget
from fairway.policies.share import (
    NO_CAP,
    Item,
    ShareLedger,
    cap_limit,
    grants,
    plan_step,
    water_level,
)

B = 2048


def items(*demands: int, waiting: bool = True, tag: str = "x") -> list[Item]:
    return [Item(f"{tag}{k}", d, waiting) for k, d in enumerate(demands)]


def test_grants_follow_vllm_scan_cap_budget_and_slots() -> None:
    seq = [*items(500, 100, waiting=False, tag="r"), *items(300, 300, 300)]
    assert grants(seq, 400, 1000, slots=8) == [400, 100, 300, 200]
    assert grants(seq, NO_CAP, 1000, slots=1) == [500, 100, 300]  # one slot: one admission


def test_water_level_is_the_smallest_cap_that_fills_the_budget() -> None:
    seq = items(5000, 300, 300, 300, 300, 300)
    level = water_level(seq, B, slots=64, lo=409)
    assert level == 548  # the worked example: M 548 + five hits of 300
    assert sum(grants(seq, level, B, 64)) == B
    assert sum(grants(seq, level - 1, B, 64)) < B
    assert water_level(items(10, 20), B, 64, lo=1) == 20  # nothing fills B: the largest demand


def test_cap_limit_is_the_largest_cap_leaving_room() -> None:
    before = items(3000, 3000)
    assert cap_limit(before, 1639, 64) == 819
    assert cap_limit(items(100), 1639, 64) == NO_CAP
    assert cap_limit(items(*[5] * 400), 10, 64) == 0


def test_one_big_hit_goes_before_a_waiting_miss() -> None:
    """Few big Fast requests: O stands last, so the hit gets w/(1+w) of the step."""
    plan = plan_step(Item("M", 32000, True), [], [], items(3000), B, 64, target=409)
    assert not plan.front_first
    assert (plan.front_tokens, plan.fast_tokens) == (409, 1639)


def test_running_hit_goes_before_a_running_miss() -> None:
    plan = plan_step(Item("M", 30000, False), items(3000, waiting=False), [], [], B, 64, 409)
    assert plan.running_first == ("x0",)
    assert (plan.front_tokens, plan.fast_tokens) == (409, 1639)


def test_running_prefills_ahead_of_a_waiting_miss_are_held_back() -> None:
    running = items(*[3000] * 8, waiting=False)
    plan = plan_step(Item("M", 13000, True), running, [], [], B, 64, target=409)
    assert plan.front_tokens >= 409 and plan.total == B
    assert plan.hold == {f"x{k}" for k in range(8 - len(plan.hold), 8)}  # the newest ones
    assert 0 < len(plan.hold) < 8


demands = st.integers(1, 4 * B)


@settings(max_examples=300, deadline=None)
@given(
    front=demands,
    front_waiting=st.booleans(),
    running=st.lists(demands, max_size=6),
    waiting=st.lists(demands, max_size=8),
    ahead=st.lists(demands, max_size=2),
    budget=st.integers(16, B),
    weight=st.sampled_from((1.0, 2.0, 4.0, 16.0)),
    deficit=st.integers(0, 600),
)
def test_plan_gives_o_its_target_and_conserves_work(
    front, front_waiting, running, waiting, ahead, budget, weight, deficit
) -> None:
    o = Item("O", front, front_waiting)
    run = items(*running, waiting=False, tag="r")
    wait = items(*waiting, tag="w")
    head = items(*ahead, tag="a")
    floor = math.floor(budget / (1 + weight))
    target = min(front, min(budget, floor + deficit))
    plan = plan_step(o, run, head, wait, budget, 64, target)
    demand = front + sum(running) + sum(waiting) + sum(ahead)
    held = sum(d for d, it in zip(running, run, strict=True) if it.request_id in plan.hold)
    if not ahead:  # requests vLLM serves before the order (preempted, at the head): exception
        assert plan.front_tokens >= target
    assert plan.total <= budget
    if not plan.hold:
        assert plan.total >= min(budget, demand) - plan.cap
    else:
        assert front_waiting  # holding back happens only while O waits
        assert plan.total >= min(budget, demand - held) - plan.cap


def test_policy_uncontested_step_changes_nothing() -> None:
    policy = get("fairway")
    queue = [QueuedRequest("M", 0.0, 600, 0), QueuedRequest("H", 1.0, 900, 600)]
    share = policy.step_share(queue, (), StepBudget(B, 64), now=2.0)
    assert share.cap is None and share.front_id == "M" and list(share.waiting_order) == [0, 1]


def test_policy_front_is_the_oldest_running_or_waiting() -> None:
    policy = get("fairway")
    queue = [QueuedRequest("W", 5.0, 9000, 0)]
    running = (PrefillingRequest("R", 1.0, 9000),)
    share = policy.step_share(queue, running, StepBudget(B, 64), now=6.0)
    assert share.front_id == "R" and policy.last_lanes == ["fast"]
    share = policy.step_share(queue, (PrefillingRequest("R", 7.0, 9000),), StepBudget(B, 64), 8.0)
    assert share.front_id == "W" and policy.last_lanes == ["fair"]


def test_ledger_deficit_raises_the_entitlement_and_resets_off_contest() -> None:
    policy = get("fairway")
    queue = [QueuedRequest("M", 0.0, 9000, 0), QueuedRequest("H", 1.0, 9000, 6000)]
    share = policy.step_share(queue, (), StepBudget(B, 64), now=2.0)
    assert share.target == 409
    policy.on_step_end(["H"], 2048, prefill_by_request={"H": 2048})  # M's blocks did not fit
    assert policy.ledger.fair_deficit == 409
    share = policy.step_share(queue, (), StepBudget(B, 64), now=2.1)
    assert share.target == 818
    policy.on_step_end(["M", "H"], 2048, prefill_by_request={"M": 818, "H": 1230})
    assert policy.ledger.fair_deficit == 0
    policy.step_share(queue[:1], (), StepBudget(B, 64), now=2.2)  # one lane: no contest
    policy.on_step_end(["M"], 2048, prefill_by_request={"M": 2048})
    assert (policy.ledger.fair_tokens, policy.ledger.contest_steps) == (0, 0)


def test_ledger_floor_is_never_lowered_by_fast_deficit() -> None:
    ledger = ShareLedger(fair_deficit=0, fast_deficit=500)
    assert ledger.entitlement(409, B) == 409
    ledger = ShareLedger(fair_deficit=700, fast_deficit=200)
    assert ledger.entitlement(409, B) == 909
    assert ShareLedger(fair_deficit=5000).entitlement(409, B) == B


def test_order_alone_puts_the_oldest_first_then_the_fast_lane() -> None:
    queue = [
        QueuedRequest("H1", 1.0, 6300, 6000),
        QueuedRequest("M", 0.0, 6000, 0),
        QueuedRequest("H2", 1.1, 6300, 6000),
    ]
    assert get("fairway").order(queue, now=1.2) == [1, 0, 2]


@settings(max_examples=300, deadline=None)
@given(
    front=demands,
    running=st.lists(demands, max_size=8),
    waiting=st.lists(demands, max_size=8),
    ahead=st.lists(demands, max_size=2),
    budget=st.integers(16, B),
    target=st.integers(0, B),
)
def test_hold_is_the_fewest_newest_prefills_that_leave_o_its_target(
    front, running, waiting, ahead, budget, target
) -> None:
    """One fewer held back and the requests before O (O first, cap at the water level) would take
    more than budget - target; with those held back they take at most that."""
    o, run = Item("O", front, True), items(*running, waiting=False, tag="r")
    head, wait = items(*ahead, tag="a"), items(*waiting, tag="w")
    target = min(target, front, budget)
    lo, room = max(1, target), budget - target

    def fits(hold: int) -> bool:
        before = [*run[: len(run) - hold], *head]
        level = water_level([*before, o, *wait], budget, 64, lo)
        return sum(grants(before, level, NO_CAP, 64)) <= room

    hold = len(plan_step(o, run, head, wait, budget, 64, target).hold)
    assert hold == 0 or not fits(hold - 1)
    assert hold == len(run) or fits(hold)


@pytest.mark.parametrize("front_waits", [True, False])
def test_idle_step_leaves_the_policy_as_a_plan_without_slots_or_prefills_does(front_waits):
    """The scheduler calls `idle_step()` instead of planning a step where no slot is free and
    no running request is in prefill; the policy must end up in the same state either way."""
    queue = [QueuedRequest("old", 0.0, 6_000, 0), QueuedRequest("hit", 1.0, 6_300, 6_000)]
    if not front_waits:
        queue = queue[1:]
    planned, idle = get("fairway"), get("fairway")
    for policy in (planned, idle):
        policy.ledger.record(400, 100, 1_600, 1_000, 2_048)  # a contest with both deficits
        assert policy.ledger.contest_steps == 1
    planned.step_share(queue, (), StepBudget(2_048, 0), 5.0)
    idle.idle_step()
    assert idle.ledger == planned.ledger and idle.ledger.contest_steps == 0
    assert idle._pending is planned._pending is None


def test_plan_step_refuses_items_out_of_their_role() -> None:
    """The scan's order is fixed by role (running, then ahead, then waiting): a running item
    that waits, or a waiting one that does not, is a caller's error, not a silent plan."""
    o = Item("O", 5000, False)
    with pytest.raises(ValueError, match="running items must not wait"):
        plan_step(o, items(300), [], [], B, 8, 409)
    with pytest.raises(ValueError, match="ahead and waiting items must"):
        plan_step(o, [], [], items(300, waiting=False), B, 8, 409)
