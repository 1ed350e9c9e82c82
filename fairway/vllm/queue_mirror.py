"""`QueueMirror`: Fairway's mirror of vLLM's waiting queue, with each request's cached prefix.

The one object the scheduler holds for the waiting queue. It joins the queue table
(`queue_table.QueueTable`: the queue's columns by ticket, the snapshot the policies order, the
rearranging), the cached-prefix memo (`prefix_memo.PrefixMemo`: the incremental lookup of each
waiting request's hit) and, with an offload tier, the tier probe, behind the calls the scheduler
makes each step. All are side-effect free towards vLLM: they read its objects, through
`fairway.vllm.internals`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np
from vllm.v1.request import Request, RequestStatus

from fairway.vllm import internals
from fairway.vllm.prefix_memo import PROBE_BUDGET, PrefixMemo
from fairway.vllm.queue_table import QueueSnapshot, QueueTable
from fairway.vllm.tier_probe import TierProbe

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import KVCacheBlock


#: Noted arrivals registered as one batch from this many on (fewer: one by one, as numpy's
#: fixed cost per call exceeds the scalar writes of a few requests).
_BATCH = 16


class QueueMirror:
    """The waiting queue as Fairway sees it: each request's fields as numpy columns for the
    policies and its cached-prefix length, kept without touching vLLM's state.

    A request is registered (a ticket and a memo) after vLLM appends it to the queue
    (`note_arrival` notes it; the next call that reads the mirror registers every noted request
    in one batch), when a snapshot first finds it there, or when it is looked up on its own
    (`cached_tokens`), and dropped when it leaves (`forget`, or absent from a snapshot).
    """

    def __init__(
        self,
        manager: KVCacheManager,
        *,
        caching: bool = True,
        max_tokens: int | None = None,
        keep_preempted_first: bool = True,
        probe_budget: int = PROBE_BUDGET,
        classify: Callable[[Request], tuple[int, int]] | None = None,
        tier: TierProbe | None = None,
        requests_by_id: Callable[[], Mapping[str, Request]] | None = None,
    ) -> None:
        self.memo = PrefixMemo(manager, caching=caching, probe_budget=probe_budget)
        #: The CPU offload tier's probe (None: no tier, or the order is tier-blind).
        self.tier = tier
        self._requests_by_id = requests_by_id or dict
        #: Requests longer than this cannot fit in an empty cache (kept last, never probed).
        self.max_tokens = max_tokens if max_tokens is not None else 2**62
        self.table = QueueTable(
            max_tokens=self.max_tokens, keep_preempted_first=keep_preempted_first,
            classify=classify,
        )
        self.caching = caching
        self.block_size = self.memo.block_size
        self.incremental = self.memo.incremental
        #: Requests `note_arrival` noted and no call has registered yet (`_register_noted`).
        self._noted: list[Request] = []

    # --- one request ------------------------------------------------------------------------------

    def cached_tokens(self, request: Request) -> int:
        """Tokens of the longest cached prefix of `request` now (what admission would reuse).

        Registers the request (its memo is dropped at the next `snapshot` if it is not waiting).
        """
        self._register_noted()
        self.memo.check_map()
        ticket = self.table.ticket_of.get(request)
        if ticket is None:
            ticket = self._register(request)
        return self.memo.cached_tokens(ticket)

    def known_cached_tokens(self, request: Request) -> int | None:
        """h as the policy would see it now, without probing (None: not looked up yet)."""
        self._register_noted()
        ticket = self.table.ticket_of.get(request)
        return None if ticket is None else self.memo.known_cached_tokens(ticket)

    def fresh_cached_tokens(self, request: Request) -> int:
        """A full lookup by vLLM's coordinator that ignores and does not update the memo (tests)."""
        return self.memo.fresh_cached_tokens(request)

    def hit_blocks(self, request: Request) -> list[KVCacheBlock]:
        """The cached blocks of a waiting request's hit, first block first (read on demand)."""
        self._register_noted()
        ticket = self.table.ticket_of.get(request)
        return [] if ticket is None else self.memo.hit_blocks(ticket)

    def protected_hit_at(
        self, block: KVCacheBlock, protected: Callable[[Request], bool]
    ) -> list[KVCacheBlock] | None:
        """The hit blocks of a waiting request `protected` accepts whose hit ends at `block`
        (None: none; always None where the memo is not incremental: it keeps no such index)."""
        key = internals.block_key(block)
        return None if key is None else self.memo.hit_ending_at(key, protected)

    @property
    def indexes_hit_ends(self) -> bool:
        """Whether `protected_hit_at` can find hits (the memo is incremental)."""
        return self.memo.incremental

    # --- the queue --------------------------------------------------------------------------------

    def snapshot(self, current: list[Request]) -> QueueSnapshot:
        """Bring every waiting request's hit up to date; split the queue; build the columns.

        Args:
            current: the waiting queue in its current order.
        """
        self._register_noted()
        self.memo.check_map()
        tickets, unknown = self.table.find(current)
        if unknown:
            for i in np.flatnonzero(tickets < 0).tolist():
                tickets[i] = self._register(current[i])
        if len(self.table) > len(current):  # some requests left without being admitted (aborts)
            for ticket in self.table.absent(tickets):
                self._release(ticket)
        self.memo.advance()
        if self.tier is None or not current:
            snap = self.table.split(current, tickets, self.memo.cached)
        else:
            snap = self._split_with_tier(current, tickets, self.tier)
        unprobed = self.memo.unprobed_tickets()  # empty once every waiting hit is looked up
        if unprobed:
            by_ticket = np.zeros(self.table.capacity, dtype=bool)
            by_ticket[unprobed] = True
            snap.columns.unprobed = by_ticket[snap.columns.tickets]
        return snap

    def _split_with_tier(self, current: list[Request], tickets: np.ndarray,
                         tier: TierProbe) -> QueueSnapshot:
        """The split with the tier priced in: h = GPU hit + weight x tier tokens (capped at the
        prompt), and the requests the connector would defer set behind the ordered ones."""
        gpu = self.memo.cached[tickets]
        tokens, deferred = tier.lookup(
            current, tickets, gpu, self.table.ticket_of, self._requests_by_id(),
            self.memo.unprobed_tickets(),
        )
        cached = self.memo.cached
        if tokens.any() and tier.weight > 0:
            cached = cached.copy()
            priced = gpu + np.rint(tier.weight * tokens).astype(np.int64)
            cached[tickets] = np.minimum(priced, self.table.prompt_of(tickets))
        snap = self.table.split(current, tickets, cached, deferred if deferred.any() else None)
        if tokens.any():
            by_ticket = np.zeros(self.table.capacity, dtype=np.int64)
            by_ticket[tickets] = tokens
            snap.columns.tier_tokens = by_ticket[snap.columns.tickets]
        return snap

    def uncached_tokens(self) -> int:
        """Prompt tokens the waiting requests still have to compute after their cached prefix
        (GPU hits, as last looked up; a request not looked up yet counts whole): numpy over the
        table's columns, no request read. Exact after a `snapshot`; after a step that ordered
        nothing it still counts requests that left the queue unadmitted (aborts) since the last
        snapshot."""
        self._register_noted()
        return self.table.uncached_tokens(self.memo.cached)

    def oldest_arrival(self) -> float:
        """Earliest arrival among the registered requests (inf when there are none)."""
        self._register_noted()
        return self.table.oldest_arrival()

    def advance(self) -> None:
        """Probe new requests (up to the budget) and re-verify every memo (`PrefixMemo.advance`);
        the whole pre-pass of a step that cannot admit anything."""
        self._register_noted()
        self.memo.advance()

    def note_arrival(self, request: Request) -> None:
        """Note a request vLLM appended to the queue: the next call that reads the mirror
        registers it (a step that cannot admit still probes it; the next `snapshot` expects it
        at the end of the queue)."""
        if request.status == RequestStatus.WAITING:
            self._noted.append(request)

    def _register_noted(self) -> None:
        """Register the noted requests not registered yet, in the order they were noted: what
        registering each one as it was noted gives (the same tickets, memos and pending order),
        in one batch.
        # speed: the queue table's part for 1,000 arrivals, 0.58 ms one by one -> 0.27 ms as one
        # batch (`QueueTable.add_many`, best of 7 x 50); the memos' part, `PrefixMemo.add_many`'s
        """
        if not self._noted:
            return
        noted, self._noted = self._noted, []
        ticket_of = self.table.ticket_of
        new = [r for r in dict.fromkeys(noted) if r not in ticket_of]
        if len(new) < _BATCH:  # a few arrivals: one at a time costs less than numpy's calls
            note = self.table.note_arrival
            for request in new:
                note(request, self._register(request))
            return
        num_tokens = [r.num_tokens for r in new]
        arrivals = [r.arrival_time for r in new]
        tickets = self.table.add_many(new, arrivals, num_tokens)
        if len(self.memo.hits) < self.table.capacity:
            self.memo.resize(self.table.capacity)
        self.memo.add_many(new, tickets, arrivals, num_tokens, self.max_tokens)
        self.table.note_arrivals(new, tickets)

    def invalidate(self, request: Request) -> None:
        """Drop one request's memo while it may still be queued (its tokens changed)."""
        self.forget([request])
        self.table.forget_order()  # its ticket may be reused: find every ticket by lookup next time

    def tier_tokens_of(self, requests: Iterable[Request]) -> int:
        """Sum of the tier-hit tokens last probed for these requests (0 without a tier)."""
        self._register_noted()
        tier, ticket_of = self.tier, self.table.ticket_of
        if tier is None:
            return 0
        tickets = (ticket_of.get(r) for r in requests)
        return sum(tier.tokens_of(ticket) for ticket in tickets if ticket is not None)

    def forget(self, requests: Iterable[Request]) -> None:
        """Drop memo entries (requests admitted or gone: no longer in the queue)."""
        self._register_noted()
        ticket_of = self.table.ticket_of
        for request in requests:
            ticket = ticket_of.get(request)
            if ticket is not None:
                self._release(ticket)

    @property
    def num_unprobed(self) -> int:
        """Waiting requests not looked up yet (ordered as misses until they are)."""
        self._register_noted()
        return self.memo.num_unprobed

    @property
    def num_full_lookups(self) -> int:
        """From-scratch lookups since construction (tests and the benchmark read them)."""
        return self.memo.num_full_lookups

    @property
    def num_extensions(self) -> int:
        """Searches forward from a memo that grew, since construction."""
        return self.memo.num_extensions

    def __len__(self) -> int:
        self._register_noted()
        return len(self.table)

    def _register(self, request: Request) -> int:
        """A ticket and a memo for a request seen for the first time in this stint."""
        num_tokens = request.num_tokens
        arrival = request.arrival_time
        ticket = self.table.add(request, arrival, num_tokens)
        if len(self.memo.hits) < self.table.capacity:
            self.memo.resize(self.table.capacity)
        self.memo.add(request, ticket, arrival, num_tokens, num_tokens > self.max_tokens)
        return ticket

    def _release(self, ticket: int) -> None:
        if self.tier is not None:
            self.tier.forget(ticket)
        self.memo.remove(ticket)
        self.table.remove(ticket)
