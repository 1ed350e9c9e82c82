"""`QueueMirror`: Fairway's mirror of vLLM's waiting queue, with each request's cached prefix.

The one object the scheduler holds for the waiting queue. It joins the slot table
(`queue_slots.QueueSlots`: the queue's columns by slot, the snapshot the policies order, the
rearranging), the cached-prefix memo (`prefix_memo.PrefixMemo`: the incremental lookup of each
waiting request's hit) and, with an offload tier, the tier probe, behind the calls the scheduler
makes each step. All are side-effect free towards vLLM: they read its objects, through
`fairway.vllm.internals`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from vllm.v1.request import Request, RequestStatus

from fairway.policies.queue import QueueColumns
from fairway.vllm.prefix_memo import PROBE_BUDGET, PrefixMemo
from fairway.vllm.queue_slots import QueueSlots, QueueSnapshot
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

    A request is registered (a slot and a memo) after vLLM appends it to the queue
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
        self.slots = QueueSlots(
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
        slot = self.slots.slot_of.get(request)
        if slot is None:
            slot = self._register(request)
        return self.memo.cached_tokens(slot)

    def known_cached_tokens(self, request: Request) -> int | None:
        """h as the policy would see it now, without probing (None: not looked up yet)."""
        self._register_noted()
        slot = self.slots.slot_of.get(request)
        return None if slot is None else self.memo.known_cached_tokens(slot)

    def fresh_cached_tokens(self, request: Request) -> int:
        """A full lookup by vLLM's coordinator that ignores and does not update the memo (tests)."""
        return self.memo.fresh_cached_tokens(request)

    def hit_blocks(self, request: Request) -> list[KVCacheBlock]:
        """The cached blocks of a waiting request's hit, first block first (read on demand)."""
        self._register_noted()
        slot = self.slots.slot_of.get(request)
        return [] if slot is None else self.memo.hit_blocks(slot)

    # --- the queue --------------------------------------------------------------------------------

    def snapshot(self, requests: Sequence[Request]) -> QueueSnapshot:
        """Bring every waiting request's hit up to date; split the queue; build the columns.

        Args:
            requests: the waiting queue in its current order.
        """
        self._register_noted()
        self.memo.check_map()
        current = requests if isinstance(requests, list) else list(requests)
        slots, unknown = self.slots.find(current)
        if unknown:
            for i in np.flatnonzero(slots < 0).tolist():
                slots[i] = self._register(current[i])
        if len(self.slots) > len(current):  # some requests left without being admitted (aborts)
            for slot in self.slots.absent(slots):
                self._release(slot)
        self.memo.advance()
        if self.tier is None or not current:
            snap = self.slots.split(current, slots, self.memo.cached)
        else:
            snap = self._split_with_tier(current, slots, self.tier)
        unprobed = self.memo.unprobed_slots()  # empty once every waiting hit is looked up
        if unprobed and snap.columns is not None:
            by_slot = np.zeros(self.slots.capacity, dtype=bool)
            by_slot[unprobed] = True
            snap.columns.unprobed = by_slot[snap.columns.slots]
        return snap

    def _split_with_tier(self, current: list[Request], slots: np.ndarray,
                         tier: TierProbe) -> QueueSnapshot:
        """The split with the tier priced in: h = GPU hit + weight x tier tokens (capped at the
        prompt), and the requests the connector would defer set behind the ordered ones."""
        gpu = self.memo.cached[slots]
        tokens, deferred = tier.lookup(
            current, slots, gpu, self.slots.slot_of, self._requests_by_id(),
            self.memo.unprobed_slots(),
        )
        cached = self.memo.cached
        if tokens.any() and tier.weight > 0:
            cached = cached.copy()
            priced = gpu + np.rint(tier.weight * tokens).astype(np.int64)
            cached[slots] = np.minimum(priced, self.slots.prompt_of(slots))
        snap = self.slots.split(current, slots, cached, deferred if deferred.any() else None)
        if snap.columns is not None and tokens.any():
            by_slot = np.zeros(self.slots.capacity, dtype=np.int64)
            by_slot[slots] = tokens
            snap.columns.tier_tokens = by_slot[snap.columns.slots]
        return snap

    def arrange(
        self, snap: QueueSnapshot, order: np.ndarray, moved: int
    ) -> tuple[list[Request], list[int] | None]:
        """The new queue and the positions moved to its front (`QueueSlots.arrange`)."""
        return self.slots.arrange(snap, order, moved)

    def mark_given(self, cols: QueueColumns) -> None:
        """The policy ordered these requests: they are no longer new to it."""
        self.slots.mark_given(cols)

    def oldest_arrival(self) -> float:
        """Earliest arrival among the registered requests (inf when there are none)."""
        self._register_noted()
        return self.slots.oldest_arrival()

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
        registering each one as it was noted gives (the same slots, memos and pending order),
        in one batch.
        # speed: the slot table's part for 1,000 arrivals, 0.58 ms one by one -> 0.27 ms as one
        # batch (`QueueSlots.add_many`, best of 7 x 50); the memos' part, `PrefixMemo.add_many`'s
        """
        if not self._noted:
            return
        noted, self._noted = self._noted, []
        slot_of = self.slots.slot_of
        new = [r for r in dict.fromkeys(noted) if r not in slot_of]
        if len(new) < _BATCH:  # a few arrivals: one at a time costs less than numpy's calls
            note = self.slots.note_arrival
            for request in new:
                note(request, self._register(request))
            return
        num_tokens = [r.num_tokens for r in new]
        arrivals = [r.arrival_time for r in new]
        slots = self.slots.add_many(new, arrivals, num_tokens)
        if len(self.memo.hits) < self.slots.capacity:
            self.memo.resize(self.slots.capacity)
        self.memo.add_many(new, slots, arrivals, num_tokens, self.max_tokens)
        self.slots.note_arrivals(new, slots)

    def invalidate(self, request: Request) -> None:
        """Drop one request's memo while it may still be queued (its tokens changed)."""
        self.forget([request])
        self.slots.forget_order()  # its slot may be reused: find every slot by lookup next time

    def tier_tokens_of(self, requests: Iterable[Request]) -> int:
        """Sum of the tier-hit tokens last probed for these requests (0 without a tier)."""
        self._register_noted()
        tier, slot_of = self.tier, self.slots.slot_of
        if tier is None:
            return 0
        return sum(tier.tokens_of(slot) for r in requests if (slot := slot_of.get(r)) is not None)

    def forget(self, requests: Iterable[Request]) -> None:
        """Drop memo entries (requests admitted or gone: no longer in the queue)."""
        self._register_noted()
        slot_of = self.slots.slot_of
        for request in requests:
            slot = slot_of.get(request)
            if slot is not None:
                self._release(slot)

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
        return len(self.slots)

    def _register(self, request: Request) -> int:
        """A slot and a memo for a request seen for the first time in this stint."""
        num_tokens = request.num_tokens
        arrival = request.arrival_time
        slot = self.slots.add(request, arrival, num_tokens)
        if len(self.memo.hits) < self.slots.capacity:
            self.memo.resize(self.slots.capacity)
        self.memo.add(request, slot, arrival, num_tokens, num_tokens > self.max_tokens)
        return slot

    def _release(self, slot: int) -> None:
        if self.tier is not None:
            self.tier.forget(slot)
        self.memo.remove(slot)
        self.slots.remove(slot)
