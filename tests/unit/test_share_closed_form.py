"""The closed forms of `fairway.policies.share` against the binary searches they replace.

`water_level`, `cap_limit`, `demand_served` and the hold search ran the scan model (`grants`),
the first two at each try of a binary search over the cap; they now solve f(cap) = budget or room
on the piecewise-linear f directly (`_Served`). `plan_step` ran over `Item` lists, evaluating each
arrangement with `grants` and collecting `Plan`s; it now plans over plain demands (`_plan`). The
searches and that planner are kept here, written from `grants` alone, as the reference: every
result, and every plan, must be the same.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairway.policies import share
from fairway.policies.share import (
    NO_CAP,
    Item,
    cap_limit,
    demand_served,
    grants,
    plan_step,
    water_level,
)


def _ref_demand_served(seq: Sequence[Item], slots: int) -> int:
    return sum(grants(seq, NO_CAP, NO_CAP, slots))


def _ref_water_level(seq: Sequence[Item], budget: int, slots: int, lo: int) -> int:
    hi = max([lo, *(item.demand for item in seq)])
    if sum(grants(seq, hi, budget, slots)) < budget:
        return hi
    if sum(grants(seq, lo, budget, slots)) >= budget:
        return lo
    while hi - lo > 1:  # total(lo) < budget <= total(hi)
        mid = (lo + hi) // 2
        if sum(grants(seq, mid, budget, slots)) >= budget:
            hi = mid
        else:
            lo = mid
    return hi


def _ref_cap_limit(before: Sequence[Item], room: int, slots: int) -> int:
    hi = max([1, *(item.demand for item in before)])
    if _ref_demand_served(before, slots) <= room:
        return NO_CAP
    if sum(grants(before, 1, NO_CAP, slots)) > room:
        return 0
    lo = 1
    while hi - lo > 1:  # taken(lo) <= room < taken(hi)
        mid = (lo + hi) // 2
        if sum(grants(before, mid, NO_CAP, slots)) <= room:
            lo = mid
        else:
            hi = mid
    return lo


def _ref_taken(seq: Sequence[Item], cap: int, slots: int) -> int:
    return sum(grants(seq, cap, NO_CAP, slots))


HUGE = (NO_CAP - 1, NO_CAP, NO_CAP + 7)  # past the "no cap" stand-in: the min()s must still agree
demands = st.one_of(st.integers(0, 5000), st.integers(0, 3), st.sampled_from(HUGE))


@st.composite
def sequences(
    draw: st.DrawFn, max_size: int = 40, waiting: bool | None = None, tag: str = "i"
) -> list[Item]:
    values = draw(st.lists(demands, max_size=max_size))
    return [
        Item(f"{tag}{k}", d, draw(st.booleans()) if waiting is None else waiting)
        for k, d in enumerate(values)
    ]


slots_ = st.integers(-1, 20)
budgets = st.one_of(st.integers(-5, 20000), st.sampled_from(HUGE))


@settings(max_examples=1500, deadline=None)
@given(seq=sequences(), budget=budgets, slots=slots_, lo=st.integers(1, 6000))
@example(seq=[], budget=10, slots=0, lo=7)
@example(seq=[Item("a", 0, True), Item("b", 0, False)], budget=1, slots=-1, lo=1)
@example(seq=[Item("a", 5, False), Item("b", 9, True)], budget=0, slots=0, lo=3)
@example(seq=[Item("a", 3, True), Item("b", 3, True)], budget=6, slots=2, lo=1)
def test_water_level_equals_the_search(seq, budget, slots, lo) -> None:
    assert water_level(seq, budget, slots, lo) == _ref_water_level(seq, budget, slots, lo)


@settings(max_examples=1500, deadline=None)
@given(seq=sequences(), room=budgets, slots=slots_)
@example(seq=[], room=-1, slots=0)
@example(seq=[Item("a", 0, False), Item("b", 7, True)], room=0, slots=-1)
@example(seq=[Item("a", 4, False), Item("b", 4, False)], room=1, slots=0)
@example(seq=[Item("a", 4, False), Item("b", 6, False)], room=9, slots=0)
def test_cap_limit_equals_the_search(seq, room, slots) -> None:
    assert cap_limit(seq, room, slots) == _ref_cap_limit(seq, room, slots)


@settings(max_examples=500, deadline=None)
@given(seq=sequences(), slots=slots_)
def test_demand_served_equals_the_scan(seq, slots) -> None:
    assert demand_served(seq, slots) == _ref_demand_served(seq, slots)


@settings(max_examples=1000, deadline=None)
@given(
    seq=sequences(),
    cap=st.one_of(st.integers(1, 6000), st.sampled_from(HUGE)),
    budget=budgets,
    slots=slots_,
)
def test_scan_total_is_min_of_budget_and_f(seq, cap, budget, slots) -> None:
    """The identity the closed forms rest on: the scan's total is min(budget, f(cap))."""
    served = share._Served.of(seq, slots)
    assert sum(grants(seq, cap, budget, slots)) == max(0, min(budget, served.at(cap)))
    assert min(NO_CAP, served.at(cap)) == _ref_taken(seq, cap, slots)


def _ref_plan_step(
    front: Item,
    running: Sequence[Item],
    ahead: Sequence[Item],
    waiting: Sequence[Item],
    budget: int,
    slots: int,
    target: int,
) -> share.Plan:
    """The planner as it was: every arrangement's `Plan` from `grants`, the best by `Plan.key`."""
    lo, room = max(1, target), budget - target

    def evaluate(seq: list[Item], at: int, cap: int, **kw: object) -> share.Plan:
        given = grants(seq, cap, budget, slots)
        mine = given[at] if at < len(given) else 0
        return share.Plan(cap=cap, front_tokens=mine, fast_tokens=sum(given) - mine, **kw)

    def fits(hold: int) -> bool:
        before = [*running[: len(running) - hold], *ahead]
        level = _ref_water_level([*before, front, *waiting], budget, slots, lo)
        return _ref_taken(before, level, slots) <= room

    plans = []
    if not front.waiting:
        after = [*ahead, *waiting]
        level = _ref_water_level([front, *running, *after], budget, slots, lo)
        taken, k_max = 0, 0
        for k in range(1, len(running) + 1):
            taken += min(running[k - 1].demand, level)
            if taken > room:
                break
            k_max = k
        for k in sorted({0, k_max}):
            before = list(running[:k])
            seq = [*before, front, *running[k:], *after]
            caps = {level}
            if k and (top := _ref_cap_limit(before, room, slots)) >= level:
                caps.add(min(top, NO_CAP))
            first = tuple(item.request_id for item in before)
            plans += [evaluate(seq, k, c, running_first=first) for c in caps]
    else:
        hold, bad = (0, 0) if fits(0) else (len(running), 0)  # the fewest held that fit
        while hold - bad > 1:
            mid = (bad + hold) // 2
            hold, bad = (mid, bad) if fits(mid) else (hold, mid)
        kept = list(running[: len(running) - hold])
        held = frozenset(item.request_id for item in running[len(running) - hold :])
        for front_first in (True, False):
            before = [*kept, *ahead] + ([] if front_first else list(waiting))
            seq = [*before, front, *(waiting if front_first else [])]
            caps = {_ref_water_level(seq, budget, slots, lo)}
            if (top := _ref_cap_limit(before, room, slots)) >= lo:
                caps.add(top)
            plans += [
                evaluate(seq, len(before), c, front_first=front_first, hold=held) for c in caps
            ]
    return max(plans, key=lambda plan: plan.key(target))


@settings(max_examples=1000, deadline=None)
@given(
    front=st.integers(0, 20000),
    front_waiting=st.booleans(),
    running=sequences(max_size=8, waiting=False, tag="r"),
    ahead=sequences(max_size=2, waiting=True, tag="a"),
    waiting=sequences(max_size=30, waiting=True, tag="w"),
    budget=st.integers(0, 20000),
    slots=slots_,
    target=st.integers(0, 20000),
)
def test_plan_step_equals_the_plan_from_the_searches(
    front, front_waiting, running, ahead, waiting, budget, slots, target
) -> None:
    o = Item("O", front, front_waiting)
    target = min(target, front, budget)
    args = (o, running, ahead, waiting, budget, slots, target)
    assert plan_step(*args) == _ref_plan_step(*args)
