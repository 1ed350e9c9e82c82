"""The queue table's matching and rearranging against the plain forms they must equal.

`QueueTable.find` tells each waiting request's ticket without a dict lookup per request when the
queue is the last arranged one with its head admitted and arrivals appended; `arrange` and
`internals.move_to_front` write a new order into vLLM's deque touching only the moved requests.
Whatever vLLM did to the queue in between (admissions, requests put back at the head, preempted
ones, aborts in the middle, arrivals that reuse a freed ticket), the tickets must be the dict's and
the deque must hold exactly the new order.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.v1.request import RequestStatus

from fairway.policies.queue import check_order
from fairway.vllm import internals
from fairway.vllm.queue_table import QueueTable, move_to_front, move_to_front_in_place


class _Request:
    """What the queue table reads of a request: its identity and status."""

    def __init__(self, name: str, status: RequestStatus = RequestStatus.WAITING) -> None:
        self.name, self.status = name, status

    def __repr__(self) -> str:
        return self.name


_ROUND = st.tuples(
    st.integers(0, 6),  # admitted from the head
    st.integers(0, 3),  # of them, put back at the head (a skip; preempted when odd)
    st.integers(0, 2),  # aborted from the middle
    st.integers(0, 8),  # arrivals
    st.lists(st.integers(0, 10_000), max_size=20),  # rows moved to the front (by rank)
    st.booleans(),  # the step is ordered (else only the probe reads the queue: no arrange)
)


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, 30), rounds=st.lists(_ROUND, min_size=1, max_size=12),
       preempted_first=st.booleans())
def test_found_tickets_are_the_dicts_and_the_deque_holds_the_new_order(
    start, rounds, preempted_first
) -> None:
    tickets = QueueTable(max_tokens=1_000, keep_preempted_first=preempted_first)
    queue: deque[_Request] = deque()
    names = iter(range(1_000_000))

    def arrive(count: int) -> None:
        for _ in range(count):
            request = _Request(f"r{next(names)}")
            queue.append(request)
            tickets.note_arrival(request, tickets.add(request, float(len(tickets)), 10))

    arrive(start)
    for admitted, put_back, aborted, arrivals, moved_ranks, ordered in rounds:
        popped = [queue.popleft() for _ in range(min(admitted, len(queue)))]
        for request in popped:  # admitted: the probe forgets them
            tickets.remove(tickets.ticket_of[request])
        for k, request in enumerate(popped[:put_back]):
            if k % 2:
                request.status = RequestStatus.PREEMPTED
            queue.appendleft(request)
        for _ in range(min(aborted, len(queue))):
            request = queue[len(queue) // 2]
            queue.remove(request)
            if request in tickets.ticket_of:
                tickets.remove(tickets.ticket_of[request])
        arrive(arrivals)  # may reuse the tickets just freed

        current = list(queue)
        found, unknown = tickets.find(current)
        assert found.tolist() == [tickets.ticket_of.get(r, -1) for r in current]
        assert unknown == (-1 in found.tolist())
        for i in np.flatnonzero(found < 0).tolist():  # the probe registers those
            found[i] = tickets.add(current[i], 0.0, 10)
        if not ordered:
            continue
        snap = tickets.split(current, found, np.zeros(tickets.capacity, dtype=np.int64))
        n = len(snap.ordered_tickets)
        head = list(dict.fromkeys(rank % n for rank in moved_ranks)) if n else []
        order, moved = check_order(head + sorted(set(range(n)) - set(head)), n)
        new_queue, front = tickets.arrange(snap, order, moved)
        want = [tickets._request_of[s] for s in np.concatenate(
            [snap.fixed_tickets, snap.ordered_tickets[order], snap.oversized_tickets]).tolist()]
        assert new_queue == want
        if front is not None:
            assert [current[i] for i in front] == want[: len(front)]
            internals.move_to_front(queue, front)
        elif new_queue is not current:
            internals.reorder_queue(queue, new_queue)
        assert list(queue) == want


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(0, 80))
def test_moving_to_the_front_in_place_equals_the_new_list(data, n) -> None:
    """The deque's rotations and the kept list's deletions give `move_to_front`'s list."""
    positions = data.draw(st.lists(st.integers(0, max(0, n - 1)), unique=True, max_size=n))
    positions = [p for p in positions if p < n]
    items = [object() for _ in range(n)]
    want = move_to_front(items, positions)
    assert want == [items[p] for p in positions] + [
        x for i, x in enumerate(items) if i not in set(positions)]
    kept = list(items)
    move_to_front_in_place(kept, positions)
    assert kept == want
    queue = deque(items)
    internals.move_to_front(queue, positions)
    assert list(queue) == want
