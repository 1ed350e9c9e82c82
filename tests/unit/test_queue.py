"""The numpy-column path of the policies gives the same order as the `QueuedRequest` path."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairway.policies import QueuedRequest, get, names
from fairway.policies.queue import (
    QueueColumns,
    Step,
    StepBudget,
    TicketState,
    check_order,
    check_permutation,
    head_order,
)


class _Keys:
    """Keys as the scheduler's probe hands them out: stable while waiting, reused after."""

    def __init__(self) -> None:
        self.of: dict[str, int] = {}
        self.free: list[int] = []
        self.given: set[str] = set()
        self.next = 0

    def columns(self, queue: list[QueuedRequest]) -> QueueColumns:
        waiting = {r.request_id for r in queue}
        for rid in [rid for rid in self.of if rid not in waiting]:
            self.free.append(self.of.pop(rid))
            self.given.discard(rid)
        keys = []
        for r in queue:
            if r.request_id not in self.of:
                self.of[r.request_id] = self.free.pop() if self.free else self._new()
            keys.append(self.of[r.request_id])
        cols = QueueColumns.of(queue, keys)
        cols.new = np.array([r.request_id not in self.given for r in queue], dtype=bool)
        self.given |= waiting
        return cols

    def _new(self) -> int:
        self.next += 1
        return self.next - 1


def _evolve(rng: random.Random, queue: list[QueuedRequest], n: int) -> list[QueuedRequest]:
    """One step: some leave, hits change, some arrive (at the end, newest), order shuffled a bit."""
    kept = [r for r in queue if rng.random() > 0.2]
    changed = []
    for r in kept:
        if rng.random() < 0.3:
            r = QueuedRequest(r.request_id, r.arrival, r.prompt_tokens, rng.choice((0, 16, 32)))
        changed.append(r)
    for k in range(rng.randint(0, 4)):
        prompt = rng.randint(40, 400)
        cached = rng.choice((0, 16, 32))
        changed.append(QueuedRequest(f"n{n}-{k}", float(rng.randint(0, 5)), prompt, cached))
    if len(changed) > 1 and rng.random() < 0.3:  # vLLM puts skipped requests back at the head
        i = rng.randrange(len(changed))
        changed.insert(0, changed.pop(i))
    return changed


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), cap=st.sampled_from([None, 3]))
def test_lpm_columns_equal_views_over_many_steps(seed: int, cap: int | None) -> None:
    rng = random.Random(seed)
    by_views = get("lpm", max_queue_for_sort=cap)
    by_columns = get("lpm", max_queue_for_sort=cap)
    keys = _Keys()
    queue: list[QueuedRequest] = []
    for step in range(25):
        queue = _evolve(rng, queue, step)
        expected = [queue[i].request_id for i in by_views.order(queue, 0.0)]
        cols = keys.columns(queue)
        got = check_permutation(by_columns.ordering(cols, Step(0.0)).order, len(queue))
        assert [queue[i].request_id for i in got] == expected
        queue = [queue[i] for i in got]  # the engine's queue now has this order
    assert by_columns.num_unsorted_steps == by_views.num_unsorted_steps


def _random_queue(rng: random.Random, n: int) -> list[QueuedRequest]:
    """n requests of 20-3,000 tokens; about half have half of their prompt cached."""
    queue = []
    for i in range(n):
        prompt = rng.randint(20, 3_000)
        cached = rng.choice((0, prompt // 2))
        queue.append(QueuedRequest(f"r{i}", rng.uniform(0, 10), prompt, cached))
    return queue


@pytest.mark.parametrize("name", names())
def test_every_policy_orders_columns_as_views_on_a_first_call(name: str) -> None:
    queue = _random_queue(random.Random(3), 40)
    expected = get(name).order(queue, 12.0)
    ordering = get(name).ordering(QueueColumns.of(queue), Step(12.0))
    got = check_permutation(ordering.order, len(queue))
    assert got.tolist() == list(expected)


def test_views_round_trip() -> None:
    queue = [QueuedRequest("a", 1.5, 100, 32), QueuedRequest("b", 0.5, 10, 0)]
    assert QueueColumns.of(queue).views() == queue
    assert QueueColumns.of(queue).remaining.tolist() == [68.0, 10.0]


@pytest.mark.parametrize(
    "order",
    [[0, 1], [1, 1, 0], [0.0, 1.0, 2.0], [0, 1, 3], [-1, 0, 1], [[0, 1, 2]]],
)
def test_check_permutation_rejects(order: list) -> None:
    with pytest.raises(ValueError):
        check_permutation(order, 3)


def test_check_permutation_accepts() -> None:
    assert check_permutation([2, 0, 1], 3).tolist() == [2, 0, 1]
    assert check_permutation(np.array([1, 0], dtype=np.int32), 2).tolist() == [1, 0]
    assert check_permutation([], 0).tolist() == []


@st.composite
def _head_shaped(draw: st.DrawFn) -> tuple[list[int], int]:
    """An order of the `order_head` shape (some rows first, the rest ascending), maybe spoiled
    by one entry overwritten with a duplicate or an out-of-range index; and n."""
    n = draw(st.integers(1, 300))
    head = draw(st.lists(st.integers(0, n - 1), unique=True, max_size=min(n, 90)))
    rest = sorted(set(range(n)) - set(head))
    order = head + rest
    if draw(st.booleans()):
        at = draw(st.integers(0, n - 1))
        order[at] = draw(st.sampled_from([-1, n, n + 5, *order]))
    return order, n


@given(_head_shaped())
@settings(max_examples=400, deadline=None)
def test_check_order_agrees_with_a_set_of_the_indices(case: tuple[list[int], int]) -> None:
    """`check_order` accepts exactly the permutations (the set says which) and reports how
    many rows the order moves to the front (`order[t:]` ascends, t smallest)."""
    order, n = case
    if sorted(order) == list(range(n)):
        got, moved = check_order(order, n)
        assert got.tolist() == order
        assert order[moved:] == sorted(order[moved:])
        assert moved == 0 or order[moved - 1] > order[moved]
    else:
        with pytest.raises(ValueError):
            check_order(order, n)


def test_check_order_checks_and_counts_a_full_shuffle() -> None:
    """A full shuffle (not head-shaped) is checked, and its moved rows counted, too."""
    order = np.random.default_rng(0).permutation(1_000)
    got, moved = check_order(order, 1_000)
    assert got.tolist() == order.tolist() and moved > 125
    spoiled = order.copy()
    spoiled[0] = spoiled[1]
    with pytest.raises(ValueError, match="twice"):
        check_order(spoiled, 1_000)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1.5, 2.0, 7.25]), min_size=1, max_size=30))
def test_the_oldest_row_is_the_first_earliest_arrival(arrivals: list[float]) -> None:
    """`oldest_row` (read by the scheduler's oldest-age stat): the first row of the earliest
    arrival, as `argmin`."""
    cols = QueueColumns.of([QueuedRequest(f"r{i}", a, 10, 0) for i, a in enumerate(arrivals)])
    assert cols.oldest_row == arrivals.index(min(arrivals))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(0, 400))
def test_a_head_order_is_its_head_then_the_other_rows_in_row_order(data, n: int) -> None:
    """`head_order` (what a policy that orders only the scan's head returns): the head, then
    every other row in row order, from a list or an array; `check_order` accepts it, moving at
    most the head to the front, and rejects a head with a repeated or out-of-range row."""
    head = data.draw(st.lists(st.integers(0, max(0, n - 1)), unique=True, max_size=min(n, 90)))
    head = [row for row in head if row < n]
    want = head + [row for row in range(n) if row not in set(head)]
    for rows in (head, np.array(head, dtype=np.intp)):
        order = head_order(rows, n)
        assert order.dtype == np.intp and order.tolist() == want
    got, moved = check_order(order, n)
    assert got.tolist() == want and moved <= len(head)
    assert want[moved:] == sorted(want[moved:])
    if head and n >= 2:  # a row of the head repeated in place of the last row
        with pytest.raises(ValueError, match="appears twice"):
            check_order([*want[:-1], head[0] if head[0] != want[-1] else want[0]], n)
    if n:
        with pytest.raises(ValueError, match="out of range"):
            check_order([n, *want[1:]], n)


def test_keyed_state_grows_and_keeps_values() -> None:
    state = TicketState()
    assert state.view(np.array([3])).tolist() == [0]
    state.store(np.array([3]), np.array([7]))
    assert state.view(np.array([3, 500])).tolist() == [7, 0]


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    slots=st.integers(0, 6),
    tokens=st.sampled_from([0, 64, 512, 2_048, 100_000]),
    num_running=st.integers(0, 3),
    extra_scan=st.integers(0, 26),
    ties=st.booleans(),
    blocks=st.sampled_from([None, 0, 8, 200, 100_000]),
)
def test_fairway_plan_over_the_scanned_head_equals_the_whole_queue_and_the_reference(
    seed: int, slots: int, tokens: int, num_running: int, extra_scan: int, ties: bool,
    blocks: int | None,
) -> None:
    """With `Step.head` (never below the free slots, as `probe.scan_bound`), `fairway` merges
    only the lanes' known prefixes: the first `head` positions of the order and their lanes, the
    cap, the held prefills and the running order are the whole queue's, and the other rows follow
    in row order; the whole queue's plan is the plain-Python rule's (`FairwayPolicy.decide`);
    over a few steps, as the ledgers carry over."""
    from fairway.policies import UNPLACED_LANE, PrefillingRequest

    rng = random.Random(seed)
    queue = []
    for i in range(rng.choice([0, 1, 5, 30, 200])):  # misses, half hits, near-full hits
        prompt = rng.randint(20, 3_000)
        cached = rng.choice((0, prompt // 2, max(0, prompt - rng.randint(1, 40))))
        arrival = float(rng.choice([0, 1, 2])) if ties else rng.uniform(0, 10)
        queue.append(QueuedRequest(f"r{i}", arrival, prompt, cached))
    running = tuple(
        PrefillingRequest(f"p{j}", rng.uniform(0, 9), rng.randint(1, 900), 1_000)
        for j in range(num_running)
    )
    scan = slots + extra_scan
    whole, head, reference = get("fairway"), get("fairway"), get("fairway")
    cols = QueueColumns.of(queue)
    budget = StepBudget(tokens, slots, free_blocks=blocks)
    for _ in range(3):  # a few steps: the ledgers carry over
        full = whole.ordering(cols, Step(10.0, None, budget, running))
        got = head.ordering(cols, Step(10.0, scan, budget, running))
        ref = reference.decide(queue, Step(10.0, None, budget, running))
        assert ref.plan == full.plan and list(ref.order) == list(full.order)
        assert ref.lanes == full.lanes
        plan, full_plan = got.plan, full.plan
        assert plan is not None and full_plan is not None
        assert (plan.cap, plan.hold, plan.running_order, plan.front_id, plan.contested) == (
            full_plan.cap, full_plan.hold, full_plan.running_order, full_plan.front_id,
            full_plan.contested
        )  # fmt: skip
        n, k = len(queue), min(scan, len(queue))
        order, full_order = list(got.order), list(full.order)
        assert sorted(order) == list(range(n))
        assert order[:k] == full_order[:k]
        assert got.lanes is not None and full.lanes is not None
        assert got.lanes[:k] == full.lanes[:k]
        if n > k and order != full_order:
            unplaced = [i for i, lane in zip(order, got.lanes, strict=True)
                        if lane == UNPLACED_LANE]
            assert unplaced == sorted(unplaced)
        started = [queue[i] for i in order[: min(k, 2)]]  # within the scan's reach
        prefill = {r.request_id: min(r.remaining, 100) for r in started}
        prefill.update({p.request_id: 50 for p in running})
        assert {p.request_id: plan.lanes[p.request_id] for p in running} == {
            p.request_id: full_plan.lanes[p.request_id] for p in running
        }
        for policy in (whole, head, reference):
            policy.on_step_end([], sum(prefill.values()), prefill_by_request=prefill)
        assert head.ledger == whole.ledger == reference.ledger
