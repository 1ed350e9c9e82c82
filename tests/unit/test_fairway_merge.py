"""`fairway`'s merge, grants and step plan as pure functions (no vLLM): the paper's order on a
fresh step, the worked example, the slot rule, and the plan's cap and hold."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fairway.policies import (
    Ordering,
    Policy,
    PrefillingRequest,
    QueueColumns,
    QueuedRequest,
    Step,
    StepBudget,
    StepPlan,
    get,
)
from fairway.policies.fairway import grants
from fairway.policies.lanes import merge

queues = st.lists(
    st.tuples(
        st.sampled_from([0.0, 1.0, 2.0, 3.5]),  # arrival (ties on purpose)
        st.integers(1, 20_000),  # prompt tokens
        st.floats(0, 1),  # cached share
    ),
    min_size=1,
    max_size=40,
)


def _plan(
    policy: Policy,
    waiting: list[QueuedRequest],
    running: tuple[PrefillingRequest, ...],
    budget: StepBudget,
    now: float,
) -> tuple[Ordering, StepPlan]:
    """The engine's call for one step: the ordering and its plan."""
    ordering = policy.ordering(QueueColumns.of(waiting), Step(now, None, budget, running))
    assert ordering.plan is not None
    return ordering, ordering.plan


def _queue(rows) -> list[QueuedRequest]:
    return [QueuedRequest(f"r{i}", a, L, int(L * c)) for i, (a, L, c) in enumerate(rows)]


@settings(max_examples=300, deadline=None)
@given(rows=queues, weight=st.sampled_from([0.5, 1.0, 4.0, 16.0]))
def test_a_fresh_order_is_the_papers(rows, weight) -> None:
    """Without a budget (and so on a first contested step without running prefills) `fairway`
    orders the waiting queue as `fairway-step` does, lanes included."""
    queue = _queue(rows)
    ours, step = get("fairway", fast_weight=weight), get("fairway-step", fast_weight=weight)
    assert ours.order(queue, 5.0) == step.order(queue, 5.0)
    ordering = ours.ordering(QueueColumns.of(queue), Step(5.0))
    assert list(ordering.lanes) == step.order_with_lanes(queue, 5.0)[1]


def test_the_worked_example_and_its_charges() -> None:
    """Five hits of 300 new tokens, an older 6,000-token miss M, a 2,048-token step: H1..H5, then
    M with the other 548 tokens; the ledgers start at (1,200, 6,000) and are charged what the
    engine scheduled."""
    queue = [QueuedRequest("M", 0.0, 6_000, 0)] + [
        QueuedRequest(f"H{i}", 1.0 + i, 6_300, 6_000) for i in range(1, 6)
    ]
    policy = get("fairway")
    ordering, share = _plan(policy, queue, (), StepBudget(2_048, 16), 2.0)
    assert list(ordering.order) == [1, 2, 3, 4, 5, 0]
    assert share.contested and share.front_id == "M" and share.cap == 2_048
    assert share.lanes == {"H1": "fast", "H2": "fast", "H3": "fast", "H4": "fast",
                           "H5": "fast", "M": "fair"}
    assert (policy.ledger.fast, policy.ledger.fair, policy.ledger.start_gap) == (1_200, 6_000,
                                                                               -4_800)
    scheduled = {f"H{i}": 300 for i in range(1, 6)} | {"M": 548}
    policy.on_step_end(list(scheduled), 2_048, prefill_by_request=scheduled)
    assert (policy.ledger.fast, policy.ledger.fair) == (1_200 + 4 * 1_500, 6_000 + 548)
    # M now runs with 5,452 left and the Fair ledger is behind (D = 652): M goes first, the whole
    # step (the new hits wait one step; the Fast ledger is then behind)
    running = (PrefillingRequest("M", 0.0, 5_452, 6_000),)
    hits = [QueuedRequest(f"G{i}", 2.0, 6_300, 6_000) for i in range(3)]
    _, share = _plan(policy, hits, running, StepBudget(2_048, 16), 2.1)
    assert next(iter(share.lanes.items())) == ("M", "fair")
    assert share.running_order == ("M",) and not share.hold and share.cap == 2_048


def test_a_running_prefill_keeps_its_grant_and_no_more() -> None:
    """With the Fast lane behind, the hits placed first take their tokens and the running miss
    is capped at what is left; with nothing left it is held back for the step."""
    policy = get("fairway")
    running = (PrefillingRequest("M", 0.0, 30_000, 32_000),)
    hits = [QueuedRequest(f"H{i}", 1.0, 6_300, 6_000) for i in range(3)]
    _, share = _plan(policy, hits, running, StepBudget(2_048, 16), 1.5)
    assert list(share.lanes) == ["H0", "H1", "H2", "M"]  # the paper's start: M's work is Fair's
    assert share.cap == 2_048 - 900 and not share.hold
    many = [QueuedRequest(f"H{i}", 1.0, 6_300, 6_000) for i in range(10)]
    _, share = _plan(get("fairway"), many, running, StepBudget(2_048, 16), 1.5)
    # The Fast lane places the six hits that fit (1,800 tokens) and passes over the rest (300 >
    # 248 left); M, the Fair front, would be capped below a hit's work: it is held for the step,
    assert share.hold == {"M"}
    assert list(share.lanes)[:7] == [*(f"H{i}" for i in range(6)), "M"]
    # but not two steps in a row: then its cap is the largest work placed before it.
    policy = get("fairway")
    _plan(policy, many, running, StepBudget(2_048, 16), 1.5)
    policy.on_step_end([], 1_800, prefill_by_request={f"H{i}": 300 for i in range(6)})
    _, share = _plan(policy, many, running, StepBudget(2_048, 16), 1.6)
    assert share.contested and not share.hold and share.cap == 300
    # A running prefill that is not the Fair front is still held when nothing is left for it.
    later = (*running, PrefillingRequest("N", 0.5, 5_000, 6_000))
    _, share = _plan(get("fairway"), many, later, StepBudget(2_048, 16), 1.5)
    assert share.hold == {"M", "N"} and share.front_id == "M"


@settings(max_examples=300, deadline=None)
@given(
    work=st.lists(st.integers(1, 5_000), min_size=1, max_size=30),
    running=st.integers(0, 4),
    tokens=st.integers(0, 10_000),
    slots=st.integers(0, 8),
    data=st.data(),
)
def test_grants_and_the_slot_rule(work, running, tokens, slots, data) -> None:
    """Grants never exceed a request's work or the step; waiting requests past the slots get
    nothing; once the slots are placed, every running prefill is placed before more waiting."""
    keys = list(range(len(work))) + [-(j + 1) for j in range(running)]
    amounts = dict(zip(range(len(work)), work, strict=True))
    amounts |= {-(j + 1): data.draw(st.integers(1, 9_000)) for j in range(running)}
    fast = data.draw(st.permutations(keys))
    fair = data.draw(st.permutations(keys))
    step = data.draw(st.sampled_from([None, 256, 2_048]))
    placed, lanes, charged = merge(fast, fair, amounts, 4.0, None, slots, step)
    assert sorted(placed) == sorted(keys) and len(lanes) == len(charged) == len(placed)
    for key, lane, lane_charged in zip(placed, lanes, charged, strict=True):
        long_front = key == fair[0] and step is not None and amounts[key] >= 4.0 * step
        assert lane_charged == ("fair" if lane == "fair" or long_front else "fast")
    waiting_seen = 0
    for i, key in enumerate(placed):
        if key >= 0:
            waiting_seen += 1
            if waiting_seen > slots:
                assert all(k >= 0 for k in placed[i:])  # the running prefills came first
                break
    given = grants(placed, amounts, tokens, slots)
    assert sum(given) <= tokens
    assert all(0 <= g <= amounts[k] for k, g in zip(placed, given, strict=True))
    started = [k for k, g in zip(placed, given, strict=True) if k >= 0 and g > 0]
    assert len(started) <= slots
