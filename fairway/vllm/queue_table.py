"""The waiting queue's table: its fields as numpy columns by ticket, and its rearranging.

Each waiting request holds a ticket (a small integer, reused once it leaves;
`QueueColumns.tickets`) for one stint in the queue: the index of its entries in the columns, and of
its memos (the prefix memo's, the tier probe's). Not vLLM's request slots (`max_num_seqs`). The
columns by ticket hold what the policies order by (arrival, prompt length, whether the policy saw
it before); a snapshot gathers them in queue order, so the policies order arrays, not per-request
Python objects. The cached-prefix column is the memo's (`prefix_memo.PrefixMemo.cached`). "Row" is
a position in a snapshot's columns, as the policies use the word.

Finding the tickets of the queue at each step is a C-level list comparison with the last arranged
queue, kept in a list of the table's own and brought up to date in place (`_match_in_place`;
`_match` when vLLM put requests back at the front; a dict lookup per request when both fail). A new
order that moves few requests to the front is written by moving just them (`arrange`'s `front`,
`internals.move_to_front`): on a big queue, touching every request costs a cache miss each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from vllm.v1.request import Request, RequestStatus

from fairway.policies.queue import QueueColumns
from fairway.vllm import internals

_ORDERED, _FIXED, _OVERSIZED, _DEFERRED = 0, 1, 2, 3
#: Requests vLLM may have put back at the front of the queue that `_match` looks past (a bound on
#: its search; no case of benchmarks/scheduler_overhead.py puts requests back: 0 and 256 measure
#: the same there).
_MAX_PUT_BACK = 256
#: `arrange` rebuilds the queue by list slices (one per moved row) when at most
#: max(MIN_MOVED, n / MOVED_SHARE) rows moved to the front, else by one gather of all n rows:
#: measured on CPython 3.11 and numpy 2, the two cost the same near n / 20 moved rows. Wins
#: benchmarks/scheduler_overhead.py's fairway admit and busy steps at 10,000 waiting: with the
#: gather alone Fairway's own step took ~8% longer
#: (0.60 -> 0.65 ms median); lpm and fairway-step: no difference.
MIN_MOVED = 8
MOVED_SHARE = 20
#: At most this many rows moved to the front are moved within the kept copy of the queue in place
#: (one pointer `memmove` each, no request touched); more are written as a new list.
#: # speed: every pass over the queue's requests (a copy or a free of a list of them) touches each
#: # request's reference count, a cache miss per request on a big queue. The kept copy and
#: # `internals.move_to_front` leave 2 such passes per step (`list(queue)` and its free), where
#: # 10 were (matching slices, the new list, the deque's clear and extend, the frees):
#: # benchmarks/overhead_against.py against e4f38bc, docs/results.md "Touching only the
#: # requests that move".
MAX_IN_PLACE = 16


def _ids_of_rows(current: list[Request], positions: np.ndarray | None, rows: Any) -> list[str]:
    """Request ids of ordered rows (`QueueColumns.ids_source`): row i is the request at
    `current[positions[i]]`, or at `current[i]` when no request was set apart."""
    if isinstance(rows, slice):
        picked = current if positions is None else [current[i] for i in positions.tolist()]
        return [r.request_id for r in picked[rows]]
    index = np.asarray(rows, dtype=np.intp)
    if positions is not None:
        index = positions[index]
    return [current[i].request_id for i in index.tolist()]


def _plain_of_rows(current: list[Request], positions: np.ndarray | None, rows: np.ndarray
                   ) -> np.ndarray:
    """Whether each of these ordered rows is a plain waiting request (`QueueColumns.
    plain_source`), read now; rows map to `current` as in `_ids_of_rows`."""
    index = rows if positions is None else positions[rows]
    return np.array(internals.plain_waiting([current[i] for i in index.tolist()]), dtype=bool)


def _equal_tail(
    current: list[Request], num_back: int, last: list[Request], start: int,
    arrivals: list[Request], split: int,
) -> bool:
    """Whether `current[num_back:]` is `last[start:]` followed by `arrivals` (from
    `arrivals[split]` when split >= 0). Identity-first list comparisons (C loops); a side that
    is a whole list is compared without copying it."""
    if split >= 0:
        return current[num_back:] == arrivals[split:]
    kept = len(last) - start
    end = num_back + kept
    ours = current if num_back == 0 and end == len(current) else current[num_back:end]
    if ours != (last if start == 0 else last[start:]):
        return False
    return len(current) == end + len(arrivals) and current[end:] == arrivals


def move_to_front(current: list[Request], positions: list[int]) -> list[Request]:
    """`current` with the requests at `positions` moved to the front, in that order: C-level
    list slices between the moved positions instead of one Python object per request."""
    queue = [current[i] for i in positions]
    start = 0
    for i in sorted(positions):
        queue += current[start:i]
        start = i + 1
    queue += current[start:]
    return queue


def move_to_front_in_place(queue: list[Request], positions: list[int]) -> None:
    """`move_to_front` done to `queue` itself: one pointer `memmove` per moved request (a few
    microseconds at 10,000 waiting), no other request touched."""
    moved = [queue[i] for i in positions]
    for i in sorted(positions, reverse=True):
        del queue[i]
    queue[0:0] = moved


class QueueTable:
    """The table of the waiting queue: ticket of each registered request, columns by ticket,
    and the last arranged queue (to find the tickets of the next step's queue cheaply)."""

    def __init__(
        self,
        *,
        max_tokens: int,
        keep_preempted_first: bool = True,
        classify: Callable[[Request], tuple[int, int]] | None = None,
    ) -> None:
        #: Requests longer than this cannot fit in an empty cache (kept last, never probed).
        self.max_tokens = max_tokens
        #: `request -> (tenant code, priority level)`; None: every request is (0, 0), and the
        #: snapshot's columns carry no tenant or priority column (today's single queue).
        self.classify = classify
        #: Live tickets whose tenant or priority is not 0 (the columns are gathered only if any).
        self.num_classified = 0
        #: PREEMPTED requests stay at the front in their order (vLLM's rule) instead of ordered.
        self.keep_preempted_first = keep_preempted_first
        #: The snapshot's columns say which rows are plain waiting requests (`QueueColumns.
        #: plain_source`; policies with `reads_plain`): off, no policy pays for the reads.
        self.read_plain = False
        self.ticket_of: dict[Request, int] = {}
        #: Sum of the registered requests' L, kept as they come and go (`uncached_tokens`).
        self.live_prompt_tokens = 0
        self._free: list[int] = []
        # The last arranged queue, its tickets, and the requests noted since (see `_match`).
        self._last_queue: list[Request] | None = None
        #: Whether `_last_queue` is this table's own list (no snapshot reads it), which the next
        #: `_match` and `arrange` may change in place.
        self._last_owned = False
        self._last_tickets = np.zeros(0, dtype=np.intp)
        self._arrivals: list[Request] = []
        self._arrival_tickets: list[int] = []
        # Columns by ticket.
        #: Live requests whose kind is not _ORDERED (`split` splits the queue only if any).
        self.num_special = 0
        self._live = np.zeros(0, dtype=bool)
        self._given = np.zeros(0, dtype=bool)  # handed to the policy at least once
        self._kind = np.zeros(0, dtype=np.int8)
        self._arrival = np.zeros(0, dtype=np.float64)
        self._prompt = np.zeros(0, dtype=np.int64)
        self._tenant = np.zeros(0, dtype=np.intp)
        self._priority = np.zeros(0, dtype=np.int64)
        self._request_of = np.zeros(0, dtype=object)

    @property
    def capacity(self) -> int:
        """Tickets the columns hold (free or not)."""
        return len(self._live)

    def __len__(self) -> int:
        return len(self.ticket_of)

    def add(self, request: Request, arrival: float, num_tokens: int) -> int:
        """A ticket for a request seen for the first time in this stint."""
        if not self._free:
            self._grow()
        ticket = self._free.pop()
        self.ticket_of[request] = ticket
        self._request_of[ticket] = request
        self._live[ticket] = True
        self._given[ticket] = False
        self._arrival[ticket] = arrival
        self._prompt[ticket] = num_tokens
        self.live_prompt_tokens += num_tokens
        tenant, priority = self.classify(request) if self.classify is not None else (0, 0)
        self._tenant[ticket], self._priority[ticket] = tenant, priority
        self.num_classified += bool(tenant or priority)
        if num_tokens > self.max_tokens:
            self._kind[ticket] = _OVERSIZED
            self.num_special += 1
            return ticket
        preempted = self.keep_preempted_first and request.status == RequestStatus.PREEMPTED
        self._kind[ticket] = _FIXED if preempted else _ORDERED
        self.num_special += preempted
        return ticket

    def add_many(
        self, requests: list[Request], arrivals: list[float], num_tokens: list[int]
    ) -> list[int]:
        """`add` for each request in turn (requests not registered, each once), in one batch:
        the same tickets, in the same order, and the same columns."""
        free = self._free
        tickets: list[int] = []
        k = len(requests)
        while len(tickets) < k:  # `add` pops one free ticket at a time, growing when none is left
            if not free:
                self._grow()
            take = min(k - len(tickets), len(free))
            tickets.extend(reversed(free[len(free) - take :]))
            del free[len(free) - take :]
        self.ticket_of.update(zip(requests, tickets, strict=True))
        request_of = self._request_of
        for ticket, request in zip(tickets, requests, strict=True):
            request_of[ticket] = request
        index = np.array(tickets, dtype=np.intp)
        self._live[index] = True
        self._given[index] = False
        self._arrival[index] = arrivals
        prompt = np.array(num_tokens, dtype=np.int64)
        self._prompt[index] = prompt
        self.live_prompt_tokens += int(prompt.sum())
        if self.classify is not None:
            classes = [self.classify(r) for r in requests]
            tenant = np.array([c[0] for c in classes], dtype=np.intp)
            priority = np.array([c[1] for c in classes], dtype=np.int64)
            self._tenant[index], self._priority[index] = tenant, priority
            self.num_classified += int(np.count_nonzero((tenant != 0) | (priority != 0)))
        else:
            self._tenant[index] = self._priority[index] = 0
        oversized = prompt > self.max_tokens
        kind = np.where(oversized, _OVERSIZED, _ORDERED).astype(np.int8)
        if self.keep_preempted_first:
            preempted = np.array([r.status == RequestStatus.PREEMPTED for r in requests])
            kind[preempted & ~oversized] = _FIXED
        self._kind[index] = kind
        self.num_special += int(np.count_nonzero(kind != _ORDERED))
        return tickets

    def _grow(self) -> None:
        old = len(self._live)
        new = max(64, 2 * old)
        for name in (
            "_live", "_given", "_kind", "_arrival", "_prompt", "_tenant", "_priority",
            "_request_of",
        ):
            column = getattr(self, name)
            grown = np.zeros(new, dtype=column.dtype)
            grown[:old] = column
            setattr(self, name, grown)
        self._free.extend(range(new - 1, old - 1, -1))  # pop() hands out the lowest ticket first

    def remove(self, ticket: int) -> None:
        """Free a ticket (its request left the queue)."""
        del self.ticket_of[self._request_of[ticket]]
        self.live_prompt_tokens -= int(self._prompt[ticket])
        if self._kind[ticket] != _ORDERED:
            self.num_special -= 1
        if self._tenant[ticket] or self._priority[ticket]:
            self.num_classified -= 1
            self._tenant[ticket] = self._priority[ticket] = 0
        self._request_of[ticket] = None
        self._live[ticket] = False
        self._free.append(ticket)

    def note_arrival(self, request: Request, ticket: int) -> None:
        """`request` (registered in `ticket`) was appended to the queue after the last `arrange`."""
        self._arrivals.append(request)
        self._arrival_tickets.append(ticket)

    def note_arrivals(self, requests: list[Request], tickets: list[int]) -> None:
        """`note_arrival` for each request in turn."""
        self._arrivals += requests
        self._arrival_tickets += tickets

    def forget_order(self) -> None:
        """Find every ticket by lookup next time (a ticket of the last queue may be reused)."""
        self._last_queue = None
        self._last_owned = False

    def find(self, current: list[Request]) -> tuple[np.ndarray, bool]:
        """The ticket of each request of `current` (-1: not registered), and whether any is -1."""
        n = len(current)
        matched = self._match_in_place(current)
        if matched is None:
            self._last_owned = False  # `_last_queue` (if any) is not `current`'s requests
            matched = self._match(current)
        if matched is None:  # the general path: one dict lookup per request
            ticket_get = self.ticket_of.get
            tickets = np.array([ticket_get(r, -1) for r in current], dtype=np.intp)
            unknown = bool(n) and tickets.min() < 0
        else:
            tickets, unknown = matched
        self._arrivals, self._arrival_tickets = [], []
        return tickets, unknown

    def absent(self, tickets: np.ndarray) -> list[int]:
        """Registered tickets not among `tickets` (their requests left without being admitted)."""
        present = np.zeros(len(self._live), dtype=bool)
        present[tickets] = True
        return np.flatnonzero(self._live & ~present).tolist()

    def split(self, current: list[Request], tickets: np.ndarray, cached: np.ndarray,
              deferred: np.ndarray | None = None) -> QueueSnapshot:
        """Split the queue (fixed, ordered, deferred, oversized) and gather the ordered requests'
        columns; `cached`: hit tokens by ticket; `deferred`: True per position of `current` for a
        request vLLM will skip this step (its offload-tier blocks are in flight)."""
        snap = QueueSnapshot(current=current, tickets=tickets)
        positions = None  # position in `current` of each ordered row (None: row i is at i)
        # split only when a fixed or oversized request waits (benchmarks/scheduler_overhead.py,
        # admit and busy at 10,000 waiting: splitting anyway took lpm's own step 5-10% longer,
        # 0.29 -> 0.32 ms median)
        if self.num_special or deferred is not None:
            kind = self._kind[tickets]
            if deferred is not None:
                kind = np.where(deferred & (kind == _ORDERED), _DEFERRED, kind)
                snap.deferred = [current[i] for i in np.flatnonzero(kind == _DEFERRED).tolist()]
                snap.deferred_tickets = tickets[kind == _DEFERRED]
            snap.fixed = [current[i] for i in np.flatnonzero(kind == _FIXED).tolist()]
            snap.fixed_tickets = tickets[kind == _FIXED]
            snap.oversized = [current[i] for i in np.flatnonzero(kind == _OVERSIZED).tolist()]
            snap.oversized_tickets = tickets[kind == _OVERSIZED]
            if len(snap.fixed_tickets) or len(snap.oversized_tickets) or len(snap.deferred_tickets):
                positions = np.flatnonzero(kind == _ORDERED)
                tickets = tickets[positions]
        snap.ordered_tickets = tickets
        cols = QueueColumns(
            arrival=self._arrival[tickets],
            prompt_tokens=self._prompt[tickets],
            cached_tokens=cached[tickets],
            tickets=tickets,
            new=~self._given[tickets],
            # read later, maybe after admission: from this step's list, not the queue table
            ids_source=partial(_ids_of_rows, current, positions),
            tenant=self._tenant[tickets] if self.num_classified else None,
            priority=self._priority[tickets] if self.num_classified else None,
            plain_source=partial(_plain_of_rows, current, positions) if self.read_plain else None,
        )
        snap.columns = cols
        return snap

    def arrange(
        self, snap: QueueSnapshot, order: np.ndarray, moved: int
    ) -> tuple[list[Request], list[int] | None]:
        """The new queue: fixed, then the ordered requests in `order`, then the deferred ones (in
        their order), then oversized.

        `order` and `moved` as `check_order` returns them: `order[moved:]` ascends. Returns the
        new queue and, when it is `snap.current` with its first `moved` rows moved to the front,
        their positions in `snap.current`, in their new order (`internals.move_to_front` writes
        just that into vLLM's deque); None: the new queue is `snap.current` itself (nothing to
        write) or replaces the deque's contents. The new queue is remembered in a list of this
        table's own, so that the next `find` can tell the tickets of an unchanged queue by one
        C-level list comparison instead of a dict lookup per request (`_match_in_place`). The
        ordered requests are no longer new to the policy (`QueueColumns.new`).
        """
        self._given[snap.ordered_tickets] = True
        parts = [snap.ordered_tickets[order]]
        special = (
            len(snap.fixed_tickets) or len(snap.oversized_tickets) or len(snap.deferred_tickets)
        )
        if special:
            parts = [snap.fixed_tickets, parts[0], snap.deferred_tickets, snap.oversized_tickets]
        tickets = parts[0] if len(parts) == 1 else np.concatenate(parts)
        # without fixed or oversized requests, row i is `current[i]`, and an order that moves a
        # row (moved > 0) is not the identity: the queue changes
        # `find` left `_last_queue` holding `snap.current`'s requests in its order when it owns it
        kept = self._last_queue if self._last_owned else None
        front: list[int] | None = None
        if (np.array_equal(tickets, snap.tickets) if special else moved == 0):
            queue = snap.current
            kept = kept if kept is not None else list(queue)  # a snapshot holds `snap.current`
        elif not special and moved <= max(MIN_MOVED, len(tickets) // MOVED_SHARE):
            front = order[:moved].tolist()
            if kept is not None and moved <= MAX_IN_PLACE:
                move_to_front_in_place(kept, front)
            else:
                kept = move_to_front(snap.current, front)
            queue = kept
        else:
            queue = kept = self._request_of[tickets].tolist()
        self._last_queue, self._last_tickets, self._last_owned = kept, tickets, True
        return queue, front

    def _match_in_place(self, current: list[Request]) -> tuple[np.ndarray, bool] | None:
        """`_match`'s usual case, without a copy: vLLM admitted the first `start` requests of
        the last arranged queue and put none back, and the noted arrivals are at the end. The
        kept list becomes `current`'s requests in place (the admitted ones deleted, the arrivals
        appended: only they are touched) and is then compared with `current` by identity (a
        C loop over pointers). None when it is not that case; the kept list is dropped if it
        was changed."""
        last = self._last_queue
        if last is None or not self._last_owned or not current:
            return None
        arrivals = self._arrivals
        start = len(last) + len(arrivals) - len(current)
        if not 0 <= start < len(last):
            return None
        first = last[start]
        # a request that left (its ticket freed, maybe reused) and came back to the front is not
        # the one the last queue held there (see `_match`)
        if current[0] is not first or self.ticket_of.get(first) != self._last_tickets[start]:
            return None
        del last[:start]
        last += arrivals
        if last != current:
            self.forget_order()
            return None
        tickets = np.concatenate(
            [self._last_tickets[start:], np.array(self._arrival_tickets, dtype=np.intp)]
        )
        self._last_tickets = tickets  # the kept list's tickets, whether or not `arrange` follows
        return tickets, False

    def _match(self, current: list[Request]) -> tuple[np.ndarray, bool] | None:
        """Tickets of `current` if it is the last arranged queue with its front consumed, a few
        requests put back at the front (skipped, preempted) and the noted arrivals at the end;
        and whether a ticket is -1 (a request put back not registered).

        Wins every admit and busy case of benchmarks/scheduler_overhead.py: with a dict lookup
        per request instead, Fairway's own step took 57-60% longer at 10,000 waiting (fairway
        admit 0.72 -> 1.14 ms median) and 12-15% longer at 1,000."""
        last = self._last_queue
        if last is None:
            return None
        arrivals = self._arrivals
        last_len = len(last)
        expected = last_len + len(arrivals)
        n = len(current)
        for num_back in range(min(n, _MAX_PUT_BACK) + 1):
            tail = n - num_back
            if tail > expected:
                continue
            start = expected - tail
            if tail == 0:
                break
            split = start - last_len  # where the tail starts within the arrivals, if >= 0
            if current[num_back] is not (last[start] if split < 0 else arrivals[split]):
                continue
            if split < 0 and self.ticket_of.get(last[start]) != self._last_tickets[start]:
                # it left (its ticket freed, maybe reused) and came back to the front: vLLM's
                # preemption or a prefix-cache reset; found by make_compat's priority tests
                continue
            if not _equal_tail(current, num_back, last, start, arrivals, split):
                continue
            ticket_get = self.ticket_of.get
            put_back = [ticket_get(r, -1) for r in current[:num_back]]
            parts = [
                np.array(put_back, dtype=np.intp),
                self._last_tickets[min(start, last_len) :],
                np.array(self._arrival_tickets[max(split, 0) :], dtype=np.intp),
            ]
            return np.concatenate(parts), -1 in put_back
        return None

    def prompt_of(self, tickets: np.ndarray) -> np.ndarray:
        """Prompt tokens (L) of the requests in `tickets`."""
        return self._prompt[tickets]

    def uncached_tokens(self, cached: np.ndarray) -> int:
        """Sum over the registered requests of their L beyond `cached`, their hit tokens by
        ticket (0 for a free ticket). A hit is at most L - 1 (vLLM computes a fully cached
        prompt's last token), so each request counts at least 1.
        # speed: O(1) and one sum over `cached`, ~2 us at 1,000 waiting (L - h over the live
        # tickets by a boolean mask: ~15 us, +45 us on scheduler_overhead.py's full step)
        """
        return self.live_prompt_tokens - int(cached.sum()) if self.ticket_of else 0

    def oldest_arrival(self) -> float:
        """Earliest arrival among the registered requests (inf when there are none)."""
        live = self._arrival[self._live]
        return float(live.min()) if len(live) else float("inf")



def _no_tickets() -> np.ndarray:
    return np.zeros(0, dtype=np.intp)


@dataclass(slots=True)
class QueueSnapshot:
    """The waiting queue split for one ordering step (every request in exactly one part).

    The new queue is fixed, then the ordered rows in the policy's order, then oversized
    (`QueueTable.arrange`).
    """

    #: The queue in its current order and the ticket of each request.
    current: list[Request] = field(default_factory=list)
    tickets: np.ndarray = field(default_factory=_no_tickets)
    #: Preempted requests kept at the front in their current order (vLLM's rule), and their
    #: tickets.
    fixed: list[Request] = field(default_factory=list)
    fixed_tickets: np.ndarray = field(default_factory=_no_tickets)
    #: Tickets of the requests the policy orders; row i of `columns` is `ordered_tickets[i]`.
    ordered_tickets: np.ndarray = field(default_factory=_no_tickets)
    columns: QueueColumns = field(init=False)
    #: Requests vLLM's KV connector will skip this step (their offload-tier blocks are in
    #: flight), kept behind the ordered ones so that no plan counts on them, and their tickets.
    deferred: list[Request] = field(default_factory=list)
    deferred_tickets: np.ndarray = field(default_factory=_no_tickets)
    #: Requests that cannot fit in an empty KV cache (kept behind everyone else), and their tickets.
    oversized: list[Request] = field(default_factory=list)
    oversized_tickets: np.ndarray = field(default_factory=_no_tickets)

