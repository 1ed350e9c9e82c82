"""`fairway`'s engine path (`ordering` over columns) against its plain-Python rule (`decide`).

Two policy objects see the same evolving queue over carried steps: one is asked through
`ordering()` (the scan's head, numpy columns, the first entries of each lane), the other through
`decide()` (the same rule given the whole lanes, sorted in plain Python). Every decision must be
equal: the order, each position's lane, the plan (front, cap, running order, held prefills,
budget, contest, charges), the ledgers, and the state the next step reads.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fairway.policies import UNPLACED_LANE, PrefillingRequest, QueuedRequest, get
from fairway.policies.fairway import FairwayPolicy
from fairway.policies.queue import QueueColumns, Step, StepBudget, StepPlan
from fairway.policies.split import grants


def _state(policy: FairwayPolicy) -> tuple:
    """What a later step of the rule reads."""
    return (dataclasses.astuple(policy.ledger), policy._lane_to_book, policy._front_held,
            policy._held, policy._hold_none)


def _served(plan: StepPlan) -> StepPlan:
    """The plan as vLLM's step sees it: the held prefills leave the running list, so their
    place in the running order is not read (nor the charges past the scan's head)."""
    order = tuple(rid for rid in plan.running_order if rid not in plan.hold)
    return dataclasses.replace(plan, lanes={}, running_order=order)


def _request(rng: random.Random, i: int, now: float, levels: int, ties: bool) -> QueuedRequest:
    prompt = rng.randint(20, 5_000)
    cached = rng.choice((0, prompt // 2, max(0, prompt - rng.randint(1, 40)), prompt))
    arrival = float(rng.randint(0, 2)) if ties else now - rng.uniform(0, 8)
    return QueuedRequest(f"r{i}", arrival, prompt, cached, priority=rng.randrange(levels))


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    size=st.sampled_from([1, 4, 12, 40, 120]),
    tokens=st.sampled_from([0, 256, 2_048, 8_192]),
    slots=st.sampled_from([0, 1, 2, 3, 4, 5, 8, 12, 24]),
    blocks=st.sampled_from([None, 4, 64, 100_000]),
    levels=st.sampled_from([1, 1, 2]),
    tier=st.booleans(),
    ties=st.booleans(),
    extra_scan=st.integers(0, 20),
)
def test_the_engine_path_equals_the_rule_decision_for_decision(
    seed: int, size: int, tokens: int, slots: int, blocks: int | None, levels: int,
    tier: bool, ties: bool, extra_scan: int,
) -> None:
    """The engine is told how far vLLM's scan reaches (`Step.head`) half the time: it orders
    that head only, and the head, the plan and the ledgers must still be the rule's."""
    rng = random.Random(seed)
    engine, rule = get("fairway"), get("fairway")
    assert isinstance(engine, FairwayPolicy) and isinstance(rule, FairwayPolicy)
    now, next_id = 10.0, size
    waiting = [_request(rng, i, now, levels, ties) for i in range(size)]
    running: list[PrefillingRequest] = []
    for _ in range(6):  # carried steps: prefills start, run on, finish; requests arrive
        loading = [i for i, r in enumerate(waiting)
                   if tier and r.cached_tokens and rng.random() < 0.3]
        cols = QueueColumns.of(waiting)
        if tier:
            marks = np.zeros(len(waiting), dtype=np.int64)
            marks[loading] = 16
            cols.tier_tokens = marks
        free = slots if rng.random() < 0.7 else 0  # now and then no slot is free
        budget = StepBudget(tokens, free, free_blocks=blocks)
        head = None if rng.random() < 0.5 else free + extra_scan
        got = engine.ordering(cols, Step(now, head, budget, tuple(running)))
        want = rule.decide(waiting, Step(now, None, budget, tuple(running)), loading)

        n = len(waiting)
        k = n if head is None else min(n, head)
        assert sorted(int(i) for i in got.order) == list(range(n))
        assert [int(i) for i in got.order][:k] == list(want.order)[:k]
        assert got.lanes is not None and want.lanes is not None
        assert list(got.lanes)[:k] == list(want.lanes)[:k]
        assert all(lane == UNPLACED_LANE or lane == want.lanes[i]
                   for i, lane in enumerate(got.lanes))
        if head is None:
            assert got.plan == want.plan
        else:  # a prefix of the lanes: the same step, the placements past the head unknown
            assert got.plan is not None and want.plan is not None
            assert _served(got.plan) == _served(want.plan)
            assert all(want.plan.lanes[rid] == lane for rid, lane in got.plan.lanes.items())
        assert _state(engine)[0] == _state(rule)[0]

        # The engine's step, roughly: tokens to the held-back-free running prefills and the
        # first waiting requests of the order, as the plan's grants give them.
        plan = want.plan
        assert plan is not None
        prefill: dict[str, int] = {}
        keys = [-(j + 1) for j in range(len(running))] + [int(i) for i in want.order][:free]
        work = {-(j + 1): p.remaining for j, p in enumerate(running)}
        work.update({int(i): waiting[int(i)].remaining for i in want.order})
        given_out = grants(keys, work, tokens, free, None, None, 16, set(loading))
        for key, amount in zip(keys, given_out, strict=True):
            rid = running[-key - 1].request_id if key < 0 else waiting[key].request_id
            if amount and rid not in plan.hold:
                prefill[rid] = min(amount, plan.cap or amount) if key < 0 else amount
        started = [waiting[key].request_id for key in keys if key >= 0 and
                   waiting[key].request_id in prefill]
        for policy in (engine, rule):
            policy.on_step_end(started, sum(prefill.values()), prefill_by_request=prefill)
        assert _state(engine) == _state(rule)

        # the queue moves on
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
            waiting.append(_request(rng, next_id, now, levels, ties))
            next_id += 1
        now += rng.choice([0.05, 0.5, 2.0])


def test_the_worked_example_is_the_rules_first_contested_step() -> None:
    """Five hits of 300 uncached tokens and an older 6,000-token miss M, 2,048-token step: H1..H5
    (1,500 tokens = M / 4) first, then M, which the budget runs out on (548 tokens)."""
    miss = QueuedRequest("M", 0.0, 6_000, 0)
    hits = [QueuedRequest(f"H{i}", 1.0, 6_300, 6_000) for i in range(1, 6)]
    policy = get("fairway")
    assert isinstance(policy, FairwayPolicy)
    decided = policy.decide([miss, *hits], Step(10.0, None, StepBudget(2_048, 8)))
    assert list(decided.order) == [1, 2, 3, 4, 5, 0]
    assert decided.lanes == ["fast"] * 5 + ["fair"]
    assert decided.plan is not None and decided.plan.contested
    assert decided.plan.front_id == "M"
    assert policy.ledger.fast == 4 * 300 and policy.ledger.fair == 6_000
    assert policy.order([miss, *hits], 10.0) == [1, 2, 3, 4, 5, 0]  # the paper's merge too


def _passing_queue() -> list[QueuedRequest]:
    """A 2,048-token step whose Fast lane starts a hit H (40 tokens to compute) and then passes
    over the older miss F (2,020 > the 2,008 tokens left) and 30 recent misses of 2,100+ tokens;
    the newest request, a miss of 1,000 tokens, fits."""
    queue = [QueuedRequest("F", 0.0, 2_020, 0), QueuedRequest("H", 99.0, 4_040, 4_000)]
    queue += [QueuedRequest(f"m{i}", 99.5, 2_100 + 60 * i, 0) for i in range(30)]
    return [*queue, QueuedRequest("fits", 99.5, 1_000, 0)]


def test_a_fast_lane_that_passes_over_its_head_is_read_further() -> None:
    """The engine gives the rule the first two entries of each lane (two free slots); the Fast
    lane passes over both, so the engine reads twice as many of its entries, and again, until
    it finds the request that fits at the end of the queue: then it decides as the rule does
    over the whole lanes."""
    budget = StepBudget(2_048, 2)
    queue = _passing_queue()
    engine, rule = get("fairway"), get("fairway")
    assert isinstance(engine, FairwayPolicy) and isinstance(rule, FairwayPolicy)
    got = engine.ordering(QueueColumns.of(queue), Step(100.0, 2, budget))
    want = rule.decide(queue, Step(100.0, None, budget))
    assert [int(i) for i in got.order][:2] == list(want.order)[:2]
    assert got.plan is not None and want.plan is not None
    assert dataclasses.replace(got.plan, lanes={}) == dataclasses.replace(want.plan, lanes={})
    assert _state(engine)[0] == _state(rule)[0]
    assert [queue[int(i)].request_id for i in want.order][:3] == ["H", "fits", "F"]
