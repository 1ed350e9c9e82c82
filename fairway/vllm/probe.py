"""Side-effect-free, incremental cached-prefix lookup of the waiting queue.

vLLM's objects are read through `fairway.vllm.internals`; the few `Request` fields read inline
in the per-request loops are tagged `# vLLM internal: <name>` like the accessors there.

Why incremental: vLLM's lookup (`KVCacheCoordinator.find_longest_cache_hit`) walks the request's
block hashes from the start, ~1 us per cached block on a CPU core, so re-probing 1,000 waiting
16k-token prompts every step would cost ~0.5 s. A waiting request's hit changes only if
(a) the last block of its hit chain was evicted or (b) its next block got cached. `PrefixProbe`
memoizes per request the hash keys of those two blocks and indexes the requests by them, so a step
checks (a) with one C-level set difference against the block pool's hash map, (b) by looking up
only the keys cached since the last step (the hash map is an insertion-ordered dict; see
`PrefixProbe._grown_keys`), and does Python work only for the requests whose hit changed. A new
request (or one whose tail was evicted) is looked up by a search over its block hashes that
gallops from a likely length (the memo's minus one; for a new request the last hit of a request
with the same first block); new requests are looked up at most `probe_budget` per step, oldest
first (a burst is spread over steps and its requests are ordered as misses until probed). The
queue's fields live in numpy columns by row (`QueueColumns`), so the policies order arrays, not
per-request Python objects.

Why checking the last block suffices (full-attention, single KV-cache group, the only mode the
incremental path is used in): vLLM frees a request's blocks tail first and appends them to the LRU
end of the free queue, and a request that holds block i of a chain holds blocks 0..i-1 too. So an
ancestor always sits behind its descendants in eviction order; while the last memoized block keeps
its hash, every earlier block of the chain is still cached. The same argument makes the cached
blocks of a chain prefix-closed, which is what the binary search relies on. (Exception: a KV
connector's `evict_blocks()` after a failed KV load may drop interior blocks; the memo then
overstates the hit until the last block goes too. Ordering is then slightly off; admission stays
exact, because vLLM does its own lookup at admission.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import islice, repeat
from typing import TYPE_CHECKING, Any

import numpy as np
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.request import Request, RequestStatus

from fairway.policies.columns import HeadOrder, QueueColumns
from fairway.vllm import internals

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheManager


# --- the probe ------------------------------------------------------------------------------------

#: Requests probed for the first time per step, oldest first. A burst of arrivals is spread over
#: steps: a request not yet probed is ordered as if nothing of it were cached (h = 0).
PROBE_BUDGET = 1_024

_ORDERED, _FIXED, _OVERSIZED = 0, 1, 2
#: vLLM's hash-map key of a block hash in KV-cache group 0 is the hash followed by these bytes
#: (`internals.group_key_suffix`). The incremental probe appends them itself, one Python call
#: less per hash-map read, and runs only where that holds (`internals.keys_are_suffixed`).
GROUP0_SUFFIX = internals.group_key_suffix(0)


#: Requests vLLM may have put back at the head of the queue that `_match` looks past.
_MAX_HEAD = 256
#: Steps after which `advance()` checks every waiting request's next block against the cache
#: even when the walk over the newly cached keys proved that nothing else was cached.
FULL_CHECK_EVERY = 32
#: Most first-block hints `PrefixProbe._lookup` keeps (cleared when full: they are only guesses).
_MAX_HINTS = 4_096
#: Keys `_grown_keys` reads from the hash map's end at a time.
_WALK_CHUNK = 256
#: `arrange` rebuilds the queue by list slices (one per moved row) when at most
#: max(_MIN_MOVED, n / _MOVED_SHARE) rows moved to the front, else by one gather of all n rows:
#: measured on CPython 3.11 and numpy 2, the two cost the same near n / 20 moved rows.
_MIN_MOVED = 8
_MOVED_SHARE = 20


def _ids_of_rows(current: list[Request], positions: np.ndarray | None, rows: Any) -> list[str]:
    """Request ids of ordered rows (`QueueColumns.ids_source`): row i is the request at
    `current[positions[i]]`, or at `current[i]` when no request was set apart."""
    if isinstance(rows, slice):
        picked = current if positions is None else [current[i] for i in positions.tolist()]
        return list(map(internals.request_id_of, picked[rows]))
    index = np.asarray(rows, dtype=np.intp)
    if positions is not None:
        index = positions[index]
    return [current[i].request_id for i in index.tolist()]  # vLLM internal: Request.request_id


def _equal_tail(
    current: list[Request], head: int, last: list[Request], start: int, arrivals: list[Request],
    split: int,
) -> bool:
    """Whether `current[head:]` is `last[start:]` followed by `arrivals` (from `arrivals[split]`
    when split >= 0). Identity-first list comparisons (C loops); a side that is a whole list is
    compared without copying it."""
    if split >= 0:
        return current[head:] == arrivals[split:]
    kept = len(last) - start
    end = head + kept
    ours = current if head == 0 and end == len(current) else current[head:end]
    if ours != (last if start == 0 else last[start:]):
        return False
    return len(current) == end + len(arrivals) and current[end:] == arrivals


def _move_to_front(current: list[Request], rows: list[int]) -> list[Request]:
    """`current` with the requests at `rows` moved to the front, in that order: C-level list
    slices between the moved positions instead of one Python object per request."""
    queue = [current[i] for i in rows]
    start = 0
    for i in sorted(rows):
        queue += current[start:i]
        start = i + 1
    queue += current[start:]
    return queue


@dataclass(slots=True, eq=False)
class _Hit:
    """Memo of one waiting request for one stint in the queue (dropped when it leaves).

    While a request waits its tokens, arrival and status do not change, only the cache around it.
    """

    request: Request
    #: Row of the request in the probe's columns; -1 once it left (or for a one-off lookup).
    slot: int
    arrival: float
    num_tokens: int
    #: (num_tokens - 1) // block_size: the hit never covers the last token.
    cap: int
    #: Hit length in blocks.
    blocks: int = 0
    #: Hash key of block `blocks` (the next one to look for; growth check); None: cannot grow.
    next_key: bytes | None = None
    #: Hash key of block `blocks - 1` (the chain's tail; eviction check); None: no hit.
    last_key: bytes | None = None
    #: False until the first lookup (a burst is probed over several steps).
    probed: bool = False


class PrefixProbe:
    """Cached-prefix length of waiting requests, without touching vLLM's state, and the queue's
    fields as numpy columns for the policies.

    Read-only: no ref counts, no free-queue moves, no prefix-cache stats, no KV events (it reads the
    block pool's hash map directly, not `get_computed_blocks`). Block-granular and capped at
    `num_tokens - 1` like vLLM's own lookup (the last token is always computed).

    Cost per step (incremental path, see the module docstring): one C-level comparison with the
    last arranged queue to find the rows (a dict lookup per request when that fails), one lookup
    in the next-block index per key cached since the last step (growth; every next key is checked
    by one C-level intersection every `FULL_CHECK_EVERY` steps), one C-level difference of the
    distinct chain-tail keys with the hash map (eviction), and Python work only for the requests
    whose hit changed. A new request costs one lookup: a search over its block hashes from the
    hit last found for its first block (1-2 hash-map reads when they share the prefix, at most
    ~2 log2(blocks) otherwise), valid because the cached blocks of a chain are prefix-closed in
    that mode. At most `probe_budget` new requests are looked up per step, oldest first.
    """

    def __init__(
        self,
        manager: KVCacheManager,
        *,
        caching: bool = True,
        max_tokens: int | None = None,
        keep_preempted_first: bool = True,
        probe_budget: int = PROBE_BUDGET,
    ) -> None:
        self._manager = manager
        self._coordinator = internals.coordinator_of(manager)
        self._pool = internals.pool_of(manager)
        self._hash_map: Any = None
        self._cache: dict[bytes, Any] | None = None
        self._cache_get: Callable[[bytes], Any] = dict().get
        self._bind()
        self.caching = caching
        self.block_size = internals.block_size_of(manager)
        self.incremental = (
            caching
            and self._cache is not None
            and internals.supports_incremental(self._coordinator, self._pool)
        )
        #: Requests longer than this cannot fit in an empty cache (kept last, never probed).
        self.max_tokens = max_tokens if max_tokens is not None else 2**62
        #: PREEMPTED requests stay at the head in their order (vLLM's rule) instead of ordered.
        self.keep_preempted_first = keep_preempted_first
        if probe_budget < 1:
            raise ValueError(f"probe_budget must be >= 1, got {probe_budget}")
        self.probe_budget = probe_budget
        #: Lookups by kind since construction (tests and the benchmark read them).
        self.num_full_lookups = 0
        self.num_extensions = 0
        self._slot_of: dict[Request, int] = {}
        self._hits: list[_Hit | None] = []
        self._free: list[int] = []
        self._pending: list[_Hit] = []  # not yet probed; oldest first once sorted
        self._pending_sorted = True
        self._by_next: dict[bytes, set[_Hit]] = {}
        # The hash map's newest key, its block and the key before it at the last `advance()`,
        # and the steps since the last check of every next key (see `_grown_keys`).
        self._newest: tuple[bytes | None, Any, bytes | None] = (None, None, None)
        self._since_full = 0
        self._by_last: dict[bytes, set[_Hit]] = {}
        #: First block hash -> the hit length (blocks) last found for a request starting with it.
        self._hints: dict[bytes, int] = {}
        # The last arranged queue, its rows, and the requests noted since (see `_match`).
        self._last_queue: list[Request] | None = None
        self._last_slots = np.zeros(0, dtype=np.intp)
        self._arrivals: list[Request] = []
        self._arrival_slots: list[int] = []
        # Columns by slot.
        #: Live requests whose kind is not _ORDERED (`snapshot` splits the queue only if any).
        self._num_special = 0
        self._live = np.zeros(0, dtype=bool)
        self._given = np.zeros(0, dtype=bool)  # handed to the policy at least once
        self._kind = np.zeros(0, dtype=np.int8)
        self._arrival = np.zeros(0, dtype=np.float64)
        self._prompt = np.zeros(0, dtype=np.int64)
        self._cached = np.zeros(0, dtype=np.int64)
        self._request_of = np.zeros(0, dtype=object)

    def _bind(self) -> None:
        """(Re)read the pool's hash map; vLLM replaces it on `reset_prefix_cache()`."""
        hash_map = internals.block_hash_map(self._pool)
        self._hash_map = hash_map
        raw = internals.hash_map_dict(hash_map)
        if raw is not None:
            self._cache, self._cache_get = raw, raw.get
        else:  # the private dict is gone: the public getter, and no set-based checks
            self._cache, self._cache_get = None, internals.hash_map_getter(hash_map)

    # --- one request ------------------------------------------------------------------------------

    def cached_tokens(self, request: Request) -> int:
        """Tokens of the longest cached prefix of `request` now (what admission would reuse).

        Registers the request (its memo is dropped at the next `snapshot` if it is not waiting).
        """
        self._check_map()
        slot = self._slot_of.get(request)
        hit = self._hits[slot] if slot is not None else None
        if hit is None:
            hit = self._hits[self._register(request)]
            assert hit is not None
        if not hit.probed:
            self._first(hit)
        elif not self.incremental:
            self._lookup(hit)
        else:
            self._verify(hit)
        return hit.blocks * self.block_size if self.incremental else int(self._cached[hit.slot])

    def known_cached_tokens(self, request: Request) -> int | None:
        """h as the policy would see it now, without probing (None: not looked up yet)."""
        slot = self._slot_of.get(request)
        hit = self._hits[slot] if slot is not None else None
        return int(self._cached[slot]) if hit is not None and hit.probed else None

    def fresh_cached_tokens(self, request: Request) -> int:
        """A full lookup by vLLM's coordinator that ignores and does not update the memo (tests)."""
        if not self.caching or not internals.prefix_cache_lookup_enabled(self._manager, request):
            return 0
        # vLLM internal: Request.block_hashes / num_tokens
        return internals.longest_cache_hit(
            self._coordinator, request.block_hashes, request.num_tokens - 1
        )[1]

    def hit_blocks(self, request: Request) -> list[KVCacheBlock]:
        """The cached blocks of a waiting request's hit, first block first (read on demand)."""
        slot = self._slot_of.get(request)
        hit = self._hits[slot] if slot is not None else None
        if hit is None or not hit.probed or not self._cached[hit.slot]:
            return []
        if not self.incremental:
            groups = internals.longest_cache_hit(
                self._coordinator, request.block_hashes, hit.num_tokens - 1  # vLLM internal
            )[0]
            return list(groups[0]) if len(groups) == 1 else [b for g in groups for b in g]
        hashes = request.block_hashes  # vLLM internal: Request.block_hashes
        blocks = []
        for i in range(hit.blocks):
            block = internals.one_block(self._cache_get(hashes[i] + GROUP0_SUFFIX))
            if block is None:
                break
            blocks.append(block)
        return blocks

    def _verify(self, hit: _Hit) -> None:
        """The steady-state checks of one memo (the batch version is in `_refresh`)."""
        cache_get = self._cache_get
        if hit.last_key is not None and cache_get(hit.last_key) is None:
            self._lookup(hit, evicted=True)
        elif hit.next_key is not None and cache_get(hit.next_key) is not None:
            self._extend(hit)

    def _first(self, hit: _Hit) -> None:
        hit.probed = True
        manager = self._manager
        if not self.caching or not internals.prefix_cache_lookup_enabled(manager, hit.request):
            return  # vLLM skips the lookup for this request (prompt logprobs, pooling): h = 0
        self._lookup(hit)

    def _lookup(self, hit: _Hit, evicted: bool = False) -> None:
        """From-scratch lookup of a new request, or of one whose chain's tail was evicted
        (`evicted`: the hit is now shorter than its memo).

        The cached blocks of a chain are prefix-closed (see the module docstring), so "block i
        is cached" is monotone in i and the hit's end is found by galloping from a likely length
        (`_cached_prefix_near`): the memo's length minus one after an eviction (the tail block
        goes first), or for a new request the length last found for a request with the same
        first block (`_hints`: shared system prompts and documents); a few hash-map reads when
        the guess is close, instead of a binary search over the whole prompt (~log2(blocks))."""
        self.num_full_lookups += 1
        hashes = hit.request.block_hashes  # vLLM internal: Request.block_hashes
        if not self.incremental:
            tokens = internals.longest_cache_hit(self._coordinator, hashes, hit.num_tokens - 1)[1]
            self._set(hit, tokens // self.block_size, tokens)
            return
        cache = self._cache
        assert cache is not None
        limit = min(hit.cap, len(hashes))
        if evicted:
            limit = min(limit, hit.blocks - 1)
            blocks = _cached_prefix_near(cache, hashes, limit, limit)
        elif limit:
            hints = self._hints
            blocks = _cached_prefix_near(cache, hashes, min(hints.get(hashes[0], 0), limit), limit)
            if len(hints) >= _MAX_HINTS:
                hints.clear()
            hints[hashes[0]] = blocks
        else:
            blocks = 0
        self._set(hit, blocks)

    def _shrink(self, group: list[_Hit]) -> None:
        """Re-look up the hits whose chain tail (one hash key) was evicted: the key is a chain
        hash, so they share every block up to it and their new hit is the same: one search."""
        if not group:
            return
        first, *others = group
        self._lookup(first, evicted=True)
        if others:  # the first's new end lies within the shared chain: the same keys
            self._set_many(others, first.blocks, first.next_key, first.last_key)

    def _extend(self, hit: _Hit) -> None:
        """Probe forward from the memoized length: the hit grew since the last step.

        Block `hit.blocks` is cached (that is why it is extended), so the new end is found by
        galloping up from there (`_cached_prefix_near`): O(log g) hash-map reads for a growth of
        g blocks (a re-cached 8k-token prefix is 512 blocks)."""
        self.num_extensions += 1
        hashes = hit.request.block_hashes  # vLLM internal: Request.block_hashes
        cache = self._cache
        assert cache is not None
        limit = min(hit.cap, len(hashes))
        self._set(hit, _cached_prefix_near(cache, hashes, hit.blocks, limit, at_least=True))

    def _extend_group(self, group: list[_Hit]) -> None:
        """Extend the hits whose next block (one hash key) got cached. The key is a chain hash,
        so they share every block up to it: the first is searched (`_extend`), and another one
        that also shares the first's last hit block (one hash comparison) has at least the
        first's hit, and exactly it when the block after it is the first's too (then not cached,
        or the first's search would have passed it); otherwise it is searched from there, or on
        its own when the chains part earlier."""
        if not group:
            return
        first, *others = group
        self._extend(first)
        if not others:
            return
        cache = self._cache
        assert cache is not None
        shared = first.request.block_hashes  # vLLM internal: Request.block_hashes
        end = first.blocks
        stopped = end < min(first.cap, len(shared))  # at a block that is not cached
        same: list[_Hit] = []  # the first's end and keys
        capped: list[_Hit] = []  # the first's end, no next block
        for hit in others:
            hashes = hit.request.block_hashes  # vLLM internal: Request.block_hashes
            limit = min(hit.cap, len(hashes))
            if end > limit or hashes[end - 1] != shared[end - 1]:
                self._extend(hit)  # the chains part before the first's end
                continue
            self.num_extensions += 1
            if end == limit:
                capped.append(hit)
            elif stopped and hashes[end] == shared[end]:
                same.append(hit)
            else:
                self._set(hit, _cached_prefix_near(cache, hashes, end, limit, at_least=True))
        if same:
            self._set_many(same, end, first.next_key, first.last_key)
        if capped:
            self._set_many(capped, end, None, first.last_key)

    def _set_many(
        self, hits: list[_Hit], blocks: int, next_key: bytes | None, last_key: bytes | None
    ) -> None:
        """`_set(hit, blocks)` for hits known to get these keys (chains shared through them):
        the columns in one assignment, the index moves a set at a time."""
        old_next: dict[bytes | None, list[_Hit]] = {}
        old_last: dict[bytes | None, list[_Hit]] = {}
        for hit in hits:
            hit.blocks = blocks
            old_next.setdefault(hit.next_key, []).append(hit)
            old_last.setdefault(hit.last_key, []).append(hit)
            hit.next_key, hit.last_key = next_key, last_key
        self._cached[[hit.slot for hit in hits]] = blocks * self.block_size
        _move_many(self._by_next, hits, old_next, next_key)
        _move_many(self._by_last, hits, old_last, last_key)

    def _set(self, hit: _Hit, blocks: int, tokens: int | None = None) -> None:
        """Record a hit of `blocks` blocks; re-index its growth and eviction keys."""
        hit.blocks = blocks
        if hit.slot >= 0:
            self._cached[hit.slot] = blocks * self.block_size if tokens is None else tokens
        if not self.incremental:
            return
        hashes = hit.request.block_hashes  # vLLM internal: Request.block_hashes
        last_key = hashes[blocks - 1] + GROUP0_SUFFIX if blocks else None
        can_grow = blocks < min(hit.cap, len(hashes))
        next_key = hashes[blocks] + GROUP0_SUFFIX if can_grow else None
        if hit.slot < 0:
            hit.next_key, hit.last_key = next_key, last_key
            return
        if next_key != hit.next_key:
            _move(self._by_next, hit, hit.next_key, next_key)
            hit.next_key = next_key
        if last_key != hit.last_key:
            _move(self._by_last, hit, hit.last_key, last_key)
            hit.last_key = last_key

    # --- the queue --------------------------------------------------------------------------------

    def snapshot(self, requests: Sequence[Request]) -> QueueSnapshot:
        """Bring every waiting request's hit up to date; split the queue; build the columns.

        Args:
            requests: the waiting queue in its current order.
        """
        self._check_map()
        current = requests if isinstance(requests, list) else list(requests)
        n = len(current)
        matched = self._match(current)
        if matched is None:  # the general path: one dict lookup per request
            slots = np.fromiter(map(self._slot_of.get, current, repeat(-1, n)), np.intp, n)
            unknown = bool(n) and slots.min() < 0
        else:
            slots, unknown = matched
        self._arrivals, self._arrival_slots = [], []
        if unknown:
            for i in np.flatnonzero(slots < 0).tolist():
                slots[i] = self._register(current[i])
        if len(self._slot_of) > n:  # some requests left without being admitted (aborts)
            self._drop_absent(slots)
        self.advance()
        snap = QueueSnapshot(current=current, slots=slots)
        positions = None  # position in `current` of each ordered row (None: row i is at i)
        if self._num_special:  # else every row is ordered: no split to make
            kind = self._kind[slots]
            snap.fixed = [current[i] for i in np.flatnonzero(kind == _FIXED).tolist()]
            snap.fixed_slots = slots[kind == _FIXED]
            snap.oversized = [current[i] for i in np.flatnonzero(kind == _OVERSIZED).tolist()]
            snap.oversized_slots = slots[kind == _OVERSIZED]
            if len(snap.fixed_slots) or len(snap.oversized_slots):
                positions = np.flatnonzero(kind == _ORDERED)
                slots = slots[positions]
        snap.ordered_slots = slots
        cols = QueueColumns(
            arrival=self._arrival[slots],
            prompt_tokens=self._prompt[slots],
            cached_tokens=self._cached[slots],
            keys=slots,
            new=~self._given[slots],
            # read later, maybe after admission: from this step's list, not the probe's rows
            ids_source=partial(_ids_of_rows, current, positions),
        )
        snap.columns = cols
        if len(slots):
            work = cols.remaining  # kept on the columns: the policy reads it too
            # the ufuncs' own reductions: numpy's `max()` / `min()` methods add a Python frame
            snap.work_max, snap.work_min = int(_largest(work)), int(_smallest(work))
        return snap

    def arrange(self, snap: QueueSnapshot, order: np.ndarray, moved: int) -> list[Request]:
        """The new queue: fixed, then the ordered requests in `order`, then oversized.

        `order` and `moved` as `check_order` returns them: `order[moved:]` ascends. Returns
        `snap.current` itself (no rebuild needed) when that is already the new order. The result
        is remembered, so that the next `snapshot` can find the rows of an unchanged queue by one
        C-level list comparison instead of a dict lookup per request.
        """
        parts = [snap.ordered_slots[order]]
        special = len(snap.fixed_slots) or len(snap.oversized_slots)
        if special:
            parts = [snap.fixed_slots, parts[0], snap.oversized_slots]
        slots = parts[0] if len(parts) == 1 else np.concatenate(parts)
        # without fixed or oversized requests, row i is `current[i]`, and an order that moves a
        # row (moved > 0) is not the identity: the queue changes
        if (np.array_equal(slots, snap.slots) if special else moved == 0):
            queue = snap.current
        elif not special and moved <= max(_MIN_MOVED, len(slots) // _MOVED_SHARE):
            queue = _move_to_front(snap.current, order[:moved].tolist())
        else:
            queue = self._request_of[slots].tolist()
        self._last_queue, self._last_slots = queue, slots
        return queue

    def arrange_head(self, snap: QueueSnapshot, order: HeadOrder) -> list[Request]:
        """`arrange` for an order given by its head (a `HeadOrder` that passed `check_head`): the
        head's rows moved to the front by list slices (`_move_to_front`), their slots by a mask;
        a queue with fixed or oversized requests, or a long head, through the whole order."""
        head = order.head
        slots = snap.ordered_slots
        n = len(slots)
        unmoved = head == list(range(len(head)))  # every row stays where it is
        if len(snap.fixed_slots) or len(snap.oversized_slots) or len(head) > max(
            _MIN_MOVED, n // _MOVED_SHARE
        ):  # `arrange` reads `moved` only to tell an unchanged queue, and its path by size
            return self.arrange(snap, order.full(), 0 if unmoved else len(head))
        if unmoved:
            queue = snap.current
        else:
            queue = _move_to_front(snap.current, head)
            others = np.ones(n, dtype=bool)
            others[head] = False
            slots = np.concatenate((slots[head], slots[others]))
        self._last_queue, self._last_slots = queue, slots
        return queue

    def _match(self, current: list[Request]) -> tuple[np.ndarray, bool] | None:
        """Rows of `current` if it is the last arranged queue with its head consumed, a few
        requests put back at the head (skipped, preempted) and the noted arrivals at the end;
        and whether a row is -1 (a request at the head the probe has not registered)."""
        last = self._last_queue
        if last is None:
            return None
        arrivals = self._arrivals
        expected = len(last) + len(arrivals)
        n = len(current)
        for head in range(min(n, _MAX_HEAD) + 1):
            tail = n - head
            if tail > expected:
                continue
            start = expected - tail
            if tail == 0:
                break
            split = start - len(last)  # where the tail starts within the arrivals, if >= 0
            if current[head] is not (last[start] if split < 0 else arrivals[split]):
                continue
            if not _equal_tail(current, head, last, start, arrivals, split):
                continue
            slot_get = self._slot_of.get
            heads = [slot_get(r, -1) for r in current[:head]]
            parts = [
                np.array(heads, dtype=np.intp),
                self._last_slots[min(start, len(last)) :],
                np.array(self._arrival_slots[max(split, 0) :], dtype=np.intp),
            ]
            return np.concatenate(parts), -1 in heads
        return None

    def oldest_arrival(self) -> float:
        """Earliest arrival among the registered requests (inf when there are none)."""
        live = self._arrival[self._live]
        return float(live.min()) if len(live) else float("inf")

    def mark_given(self, cols: QueueColumns) -> None:
        """The policy ordered these rows: they are no longer new to it."""
        self._given[cols.keys] = True

    def advance(self) -> None:
        """Probe new requests (up to the budget) and re-verify every memo against the cache.

        Also the whole pre-pass of a step that cannot admit anything: the hits stay current and a
        burst keeps being probed while the running slots are full.
        """
        self._check_map()
        if self._pending:
            self._probe_pending()
        if not self.incremental:
            if self.caching:  # no memo to trust: every probed request is looked up again
                for hit in self._hits:
                    if hit is not None and hit.probed and self._kind[hit.slot] != _OVERSIZED:
                        self._first(hit)
            return
        cache = self._cache
        assert cache is not None
        by_last = self._by_last
        if by_last:
            for key in set(by_last).difference(cache):  # chain tails that were evicted
                self._shrink(list(by_last.get(key, ())))
        by_next = self._by_next
        if by_next:
            for key in self._grown_keys(cache, by_next):  # next blocks that got cached
                self._extend_group(list(by_next.get(key, ())))
        self._since_full += 1
        self._mark_newest(cache)

    def _grown_keys(self, cache: dict[bytes, Any], by_next: dict[bytes, Any]) -> Iterable[bytes]:
        """Keys of `by_next` that may have been cached since the last `advance()`.

        The hash map is a dict, so keys cached since then come after the newest key seen last
        time (`_mark_newest`), in insertion order: a walk back from the newest key (newest first)
        costs O(blocks cached since), instead of a check of every waiting request's next key.
        The walk proves itself: it must meet the remembered newest key, holding the same block,
        with the remembered second-newest key right behind it (else a key was popped and put
        back at the end, which vLLM does when an eviction finds another block under the hash).
        When it cannot prove it, or after `FULL_CHECK_EVERY` steps, the whole index is checked
        (one C-level intersection), so a growth is seen at the latest that many steps late.
        """
        newest, block, second = self._newest
        if (
            newest is None
            or self._since_full >= FULL_CHECK_EVERY
            or cache.get(newest) is not block
        ):
            return self._all_grown(cache, by_next)
        grown: list[bytes] = []
        walk = reversed(cache)
        while len(grown) <= len(by_next):  # else as costly as the full check: do that instead
            chunk = list(islice(walk, _WALK_CHUNK))  # newest first, read in C
            try:
                i = chunk.index(newest)
            except ValueError:
                grown += chunk
                if len(chunk) < _WALK_CHUNK:  # the newest key is gone
                    break
                continue
            if chunk[i] is not newest:  # an equal key, inserted again
                break
            behind = chunk[i + 1] if i + 1 < len(chunk) else next(walk, None)
            if behind is not second:
                break
            grown += chunk[:i]
            return by_next.keys() & grown  # the lookups in C, too
        return self._all_grown(cache, by_next)

    def _all_grown(self, cache: dict[bytes, Any], by_next: dict[bytes, Any]) -> Iterable[bytes]:
        self._since_full = 0
        return by_next.keys() & cache.keys()

    def _mark_newest(self, cache: dict[bytes, Any]) -> None:
        """Remember the hash map's newest key, its block and the key before it (`_grown_keys`)."""
        walk = reversed(cache)
        newest = next(walk, None)
        block = cache[newest] if newest is not None else None
        self._newest = (newest, block, next(walk, None))

    def note_arrival(self, request: Request) -> None:
        """Register a request as vLLM appends it to the queue (a step that cannot admit still
        probes it; the next `snapshot` expects it at the end of the queue)."""
        # vLLM internal: Request.status
        if request not in self._slot_of and request.status == RequestStatus.WAITING:
            self._arrivals.append(request)
            self._arrival_slots.append(self._register(request))

    @property
    def num_unprobed(self) -> int:
        """Waiting requests not looked up yet (ordered as misses until they are)."""
        return sum(1 for hit in self._pending if hit.slot >= 0 and not hit.probed)

    def _probe_pending(self) -> None:
        pending = self._pending
        if not self._pending_sorted:
            pending.sort(key=_arrival_of)  # stable: equal arrivals keep their order of arrival
            self._pending_sorted = True
        budget, k = self.probe_budget, 0
        while k < len(pending) and budget:
            hit = pending[k]
            k += 1
            if hit.slot >= 0 and not hit.probed:
                self._first(hit)
                budget -= 1
        del pending[:k]

    def _register(self, request: Request) -> int:
        """A row for a request seen for the first time in this stint."""
        if not self._free:
            self._grow()
        slot = self._free.pop()
        num_tokens = request.num_tokens  # vLLM internal: Request.num_tokens
        arrival = request.arrival_time  # vLLM internal: Request.arrival_time
        hit = _Hit(request, slot, arrival, num_tokens, (num_tokens - 1) // self.block_size)
        self._slot_of[request] = slot
        self._hits[slot] = hit
        self._request_of[slot] = request
        self._live[slot] = True
        self._given[slot] = False
        self._arrival[slot] = arrival
        self._prompt[slot] = num_tokens
        self._cached[slot] = 0
        if num_tokens > self.max_tokens:
            self._kind[slot] = _OVERSIZED
            self._num_special += 1
            hit.probed = True  # never looked up: it cannot be admitted anyway
            return slot
        # vLLM internal: Request.status / RequestStatus.PREEMPTED
        preempted = self.keep_preempted_first and request.status == RequestStatus.PREEMPTED
        self._kind[slot] = _FIXED if preempted else _ORDERED
        self._num_special += preempted
        pending = self._pending
        if pending and self._pending_sorted and arrival < pending[-1].arrival:
            self._pending_sorted = False
        pending.append(hit)
        return slot

    def _grow(self) -> None:
        old = len(self._hits)
        new = max(64, 2 * old)
        for name in ("_live", "_given", "_kind", "_arrival", "_prompt", "_cached", "_request_of"):
            column = getattr(self, name)
            grown = np.zeros(new, dtype=column.dtype)
            grown[:old] = column
            setattr(self, name, grown)
        self._hits.extend([None] * (new - old))
        self._free.extend(range(new - 1, old - 1, -1))  # pop() hands out the lowest slot first

    def _release(self, hit: _Hit) -> None:
        slot = hit.slot
        del self._slot_of[hit.request]
        if self._kind[slot] != _ORDERED:
            self._num_special -= 1
        self._hits[slot] = None
        self._request_of[slot] = None
        self._live[slot] = False
        if hit.next_key is not None:
            _move(self._by_next, hit, hit.next_key, None)
        if hit.last_key is not None:
            _move(self._by_last, hit, hit.last_key, None)
        hit.slot = -1  # also marks it gone for `_pending`
        self._free.append(slot)

    def _drop_absent(self, slots: np.ndarray) -> None:
        present = np.zeros(len(self._live), dtype=bool)
        present[slots] = True
        for slot in np.flatnonzero(self._live & ~present).tolist():
            hit = self._hits[slot]
            if hit is not None:
                self._release(hit)

    def _check_map(self) -> None:
        """After `reset_prefix_cache()` (a new hash map) every memo is stale: probe again."""
        if internals.block_hash_map(self._pool) is self._hash_map:
            return
        self._bind()
        self._by_next.clear()
        self._by_last.clear()
        self._hints.clear()
        self._newest = (None, None, None)
        for hit in self._hits:
            if hit is not None and hit.probed and self._kind[hit.slot] != _OVERSIZED:
                hit.probed, hit.blocks, hit.next_key, hit.last_key = False, 0, None, None
                self._cached[hit.slot] = 0
                self._pending.append(hit)
        self._pending_sorted = False

    def invalidate(self, request: Request) -> None:
        """Drop one request's memo while it may still be queued (its tokens changed)."""
        self.forget([request])
        self._last_queue = None  # its row may be reused: find every row by lookup next time

    def forget(self, requests: Iterable[Request]) -> None:
        """Drop memo entries (requests admitted or gone: no longer in the queue)."""
        slot_of, hits = self._slot_of, self._hits
        for request in requests:
            slot = slot_of.get(request)
            if slot is not None:
                hit = hits[slot]
                assert hit is not None
                self._release(hit)

    def __len__(self) -> int:
        return len(self._slot_of)


def _cached_prefix_near(
    cache: dict[bytes, Any], hashes: Sequence[bytes], guess: int, hi: int, at_least: bool = False
) -> int:
    """The hit's length in blocks, known to lie in [0, hi], found by galloping from `guess` (a
    likely length, 0 <= guess <= hi; `at_least`: known to be cached) away from it by 1, 2, 4, ...
    blocks until the end is passed, then a binary search in the last gap (`_cached_prefix`):
    O(log d) hash-map reads for an end d blocks from the guess, 1-2 when the guess is right."""
    lo = 0
    if not at_least and guess and hashes[guess - 1] + GROUP0_SUFFIX not in cache:
        hi, step = guess - 1, 1  # shorter than the guess: gallop down
        while lo < hi:
            probe = max(lo + 1, hi - step + 1)  # is a hit of `probe` blocks cached?
            if hashes[probe - 1] + GROUP0_SUFFIX in cache:
                lo = probe
                break
            hi = probe - 1
            step *= 2
    else:
        lo, step = guess, 1  # at least the guess: gallop up
        while lo < hi:
            probe = min(lo + step, hi)
            if hashes[probe - 1] + GROUP0_SUFFIX not in cache:
                hi = probe - 1
                break
            lo = probe
            step *= 2
    return _cached_prefix(cache, hashes, lo, hi)


def _cached_prefix(cache: dict[bytes, Any], hashes: Sequence[bytes], lo: int, hi: int) -> int:
    """The hit's length in blocks, known to lie in [lo, hi]: a binary search, valid because the
    cached blocks of a chain are prefix-closed (block i cached means blocks 0..i are)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hashes[mid - 1] + GROUP0_SUFFIX in cache:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _arrival_of(hit: _Hit) -> float:
    return hit.arrival


def _move(index: dict[bytes, set[_Hit]], hit: _Hit, old: bytes | None, new: bytes | None) -> None:
    """Move `hit` from key `old` to key `new` in a key -> hits index (None: not indexed)."""
    if old is not None:
        holders = index.get(old)
        if holders is not None:
            holders.discard(hit)
            if not holders:
                del index[old]
    if new is not None:
        holders = index.get(new)
        if holders is None:
            index[new] = {hit}
        else:
            holders.add(hit)


def _move_many(
    index: dict[bytes, set[_Hit]],
    hits: list[_Hit],
    old: dict[bytes | None, list[_Hit]],
    new: bytes | None,
) -> None:
    """`_move` for many hits: from their old keys (`old`: key -> its hits) to `new`."""
    for key, leaving in old.items():
        if key is None or key == new:
            continue
        holders = index.get(key)
        if holders is not None:
            holders.difference_update(leaving)
            if not holders:
                del index[key]
    if new is not None:
        index.setdefault(new, set()).update(hits)


# --- the queue view -------------------------------------------------------------------------------


_NO_ROWS = np.zeros(0, dtype=np.intp)
_NO_ROWS.flags.writeable = False
_largest, _smallest = np.maximum.reduce, np.minimum.reduce


def _no_rows() -> np.ndarray:
    """An empty row array, shared (read-only): a snapshot is built every step."""
    return _NO_ROWS


@dataclass(slots=True)
class QueueSnapshot:
    """The waiting queue split for one ordering step (every request in exactly one part).

    The new queue is fixed, then the ordered rows in the policy's order, then oversized
    (`PrefixProbe.arrange`).
    """

    #: The queue in its current order and the probe's row of each request.
    current: list[Request] = field(default_factory=list)
    slots: np.ndarray = field(default_factory=_no_rows)
    #: Preempted requests kept at the head in their current order (vLLM's rule), and their rows.
    fixed: list[Request] = field(default_factory=list)
    fixed_slots: np.ndarray = field(default_factory=_no_rows)
    #: Rows the policy orders; row i of `columns` is `ordered_slots[i]`.
    ordered_slots: np.ndarray = field(default_factory=_no_rows)
    columns: QueueColumns | None = None
    #: Requests that cannot fit in an empty KV cache (kept behind everyone else), and their rows.
    oversized: list[Request] = field(default_factory=list)
    oversized_slots: np.ndarray = field(default_factory=_no_rows)
    #: Largest / smallest uncached work among the ordered requests (tokens; 0 when none).
    work_max: int = 0
    work_min: int = 0

    @property
    def num_fixed(self) -> int:
        return len(self.fixed_slots)
