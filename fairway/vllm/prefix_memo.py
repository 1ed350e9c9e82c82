"""The incremental cached-prefix memo: how many tokens of each waiting request vLLM has cached.

Why incremental: vLLM's lookup (`KVCacheCoordinator.find_longest_cache_hit`) walks the request's
block hashes from the start, ~1 us per cached block on a CPU core, so re-probing 1,000 waiting
16k-token prompts every step would cost ~0.5 s. A waiting request's hit changes only if
(a) the last block of its hit chain was evicted or (b) its next block got cached. `PrefixMemo`
memoizes per request the hash keys of those two blocks and indexes the requests by them, so a step
checks (a) with one C-level set difference against the block pool's hash map, (b) by looking up
only the keys cached since the last step (the hash map is an insertion-ordered dict; see
`fairway.vllm.cache_growth`), and does Python work only for the requests whose hit changed. A new
request (or one whose tail was evicted) is looked up by a search over its block hashes that
gallops from a likely length (the memo's minus one; for a new request the last hit of a request
with the same first block); new requests are looked up at most `probe_budget` per step, oldest
first (a burst is spread over steps and its requests are ordered as misses until probed).

Why checking the last block suffices (full-attention, single KV-cache group, the only mode the
incremental path is used in): vLLM frees a request's blocks tail first and appends them to the LRU
end of the free queue, and a request that holds block i of a chain holds blocks 0..i-1 too. So an
ancestor always sits behind its descendants in eviction order; while the last memoized block keeps
its hash, every earlier block of the chain is still cached. The same argument makes the cached
blocks of a chain prefix-closed, which is what the binary search relies on. (Exception: a KV
connector's `evict_blocks()` after a failed KV load may drop interior blocks; the memo then
overstates the hit until the last block goes too. Ordering is then slightly off; admission stays
exact, because vLLM does its own lookup at admission.)

vLLM's objects are read through `fairway.vllm.internals`, except `Request.block_hashes` (a public
field: vLLM's KV connectors read it too), read inline in the loops over changed hits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np

from fairway.vllm import internals
from fairway.vllm.cache_growth import CacheGrowth
from fairway.vllm.prefix_hit import PrefixHit, arrival_of, move
from fairway.vllm.prefix_search import GROUP0_SUFFIX, cached_prefix_near

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.request import Request

#: Requests probed for the first time per step, oldest first. A burst of arrivals is spread over
#: steps: a request not yet probed is ordered as if nothing of it were cached (h = 0).
PROBE_BUDGET = 1_024
#: Most first-block hints `PrefixMemo._lookup` keeps (cleared when full: they are only guesses).
#: The hints win benchmarks/scheduler_overhead.py's burst at 1,000 waiting: searched from 0
#: instead, Fairway's own time for the burst took 53-61% longer (8.1 -> 12.4-13.1 ms median).
_MAX_HINTS = 4_096


class PrefixMemo:
    """Cached-prefix length of waiting requests by ticket, without touching vLLM's state.

    Read-only: no ref counts, no free-queue moves, no prefix-cache stats, no KV events (it reads the
    block pool's hash map directly, not `get_computed_blocks`). Block-granular and capped at
    `num_tokens - 1` like vLLM's own lookup (the last token is always computed).

    Cost per step (incremental path, see the module docstring): one lookup in the next-block index
    per key cached since the last step (growth; every next key is checked by one C-level
    intersection every `cache_growth.FULL_CHECK_EVERY` steps), one C-level difference of the
    distinct chain-tail keys with the hash map (eviction), and Python work only for the requests
    whose hit changed. A new request costs one lookup: a search over its block hashes from the
    hit last found for its first block (1-2 hash-map reads when they share the prefix, at most
    ~2 log2(blocks) otherwise; `fairway.vllm.prefix_search`), valid because the cached blocks of
    a chain are prefix-closed in that mode. At most `probe_budget` new requests are looked up per
    step, oldest first.
    """

    def __init__(
        self, manager: KVCacheManager, *, caching: bool = True, probe_budget: int = PROBE_BUDGET
    ) -> None:
        self._manager = manager
        self._coordinator = internals.coordinator_of(manager)
        self._pool = internals.pool_of(manager)
        self._hash_map: Any = None
        self._cache: dict[bytes, Any] = {}
        self._cache_get: Callable[[bytes], Any] = self._cache.get
        self._block_of: Callable[[Any], KVCacheBlock | None] = internals.entry_block_reader(
            self._pool
        )
        self._bind()
        self.caching = caching
        self.block_size = internals.block_size_of(manager)
        #: Whether the memo is trusted (else every probed request is looked up again each step).
        self.incremental = (
            caching
            and internals.supports_incremental(self._coordinator, self._pool)
        )
        if probe_budget < 1:
            raise ValueError(f"probe_budget must be >= 1, got {probe_budget}")
        self.probe_budget = probe_budget
        #: Lookups by kind since construction (tests and the benchmark read them).
        self.num_full_lookups = 0
        self.num_extensions = 0
        #: The memo of each ticket (None: a free ticket) and its hit in tokens (the queue's
        #: cached-tokens column), grown with the tickets (`resize`).
        self.hits: list[PrefixHit | None] = []
        self.cached = np.zeros(0, dtype=np.int64)
        self._pending: list[PrefixHit] = []  # not yet probed; oldest first once sorted
        self._pending_sorted = True
        #: Growth index: hash key of a next block -> the memos waiting for it to be cached.
        self.by_next: dict[bytes, set[PrefixHit]] = {}
        #: Eviction index: hash key of a chain's tail block -> the memos whose hit ends there.
        self.by_last: dict[bytes, set[PrefixHit]] = {}
        #: The keys cached since the last `advance()` (a walk from the newest key).
        self.growth = CacheGrowth()
        #: First block hash -> the hit length (blocks) last found for a request starting with it.
        self.hints: dict[bytes, int] = {}

    def _bind(self) -> None:
        """(Re)read the pool's hash map; 0.32 and 0.33 replace it on `reset_prefix_cache()`
        (0.34 clears it in place, and the eviction index sees every chain go)."""
        hash_map = internals.block_hash_map(self._pool)
        self._hash_map = hash_map
        self._cache = internals.hash_map_dict(hash_map)
        self._cache_get = self._cache.get
        self._block_of = internals.entry_block_reader(self._pool)

    # --- tickets ----------------------------------------------------------------------------------

    def resize(self, capacity: int) -> None:
        """Room for tickets 0 .. capacity - 1 (the queue table grew)."""
        old = len(self.hits)
        grown = np.zeros(capacity, dtype=self.cached.dtype)
        grown[:old] = self.cached
        self.cached = grown
        self.hits.extend([None] * (capacity - old))

    def add(
        self, request: Request, ticket: int, arrival: float, num_tokens: int, oversized: bool
    ) -> None:
        """Start the memo of a request seen for the first time in this stint (not looked up yet,
        unless `oversized`: then never)."""
        hit = PrefixHit(request, ticket, arrival, num_tokens, (num_tokens - 1) // self.block_size)
        self.hits[ticket] = hit
        self.cached[ticket] = 0
        if oversized:
            hit.oversized = hit.probed = True  # never looked up: it cannot be admitted anyway
            return
        pending = self._pending
        if pending and self._pending_sorted and arrival < pending[-1].arrival:
            self._pending_sorted = False
        pending.append(hit)

    def add_many(
        self,
        requests: Sequence[Request],
        tickets: Sequence[int],
        arrivals: Sequence[float],
        num_tokens: Sequence[int],
        max_tokens: int,
    ) -> None:
        """`add` for each request in turn (oversized: more than `max_tokens` tokens), in one
        batch: the same memos and the same pending order.
        # speed: benchmarks/probe_batch.py, 1,000 arrivals against `add` per request: 0.44 ->
        # 0.41 ms best, 0.89 -> 0.66 ms median of 16 turns
        """
        block_size, hits = self.block_size, self.hits
        made = [
            PrefixHit(request, ticket, arrival, tokens, (tokens - 1) // block_size)
            for request, ticket, arrival, tokens in zip(
                requests, tickets, arrivals, num_tokens, strict=True
            )
        ]
        for ticket, hit in zip(tickets, made, strict=True):
            hits[ticket] = hit
        self.cached[list(tickets)] = 0
        fresh = made
        if max(num_tokens, default=0) > max_tokens:
            fresh = []
            for hit in made:
                if hit.num_tokens > max_tokens:
                    hit.oversized = hit.probed = True  # never looked up (see `add`)
                else:
                    fresh.append(hit)
        if not fresh:
            return
        pending = self._pending
        if self._pending_sorted:
            times = [hit.arrival for hit in fresh]
            if pending:
                times.insert(0, pending[-1].arrival)
            if any(later < earlier for earlier, later in pairwise(times)):
                self._pending_sorted = False
        pending += fresh

    def remove(self, ticket: int) -> None:
        """Drop the memo of a ticket (its request left the queue)."""
        hit = self.hits[ticket]
        assert hit is not None
        self.hits[ticket] = None
        self.cached[ticket] = 0  # a free ticket holds no hit (`QueueTable.uncached_tokens` sums)
        if hit.next_key is not None:
            move(self.by_next, hit, hit.next_key, None)
        if hit.last_key is not None:
            move(self.by_last, hit, hit.last_key, None)
        hit.ticket = -1  # also marks it gone for `_pending`

    # --- one request ------------------------------------------------------------------------------

    def cached_tokens(self, ticket: int) -> int:
        """Tokens of the longest cached prefix of the ticket's request now (looked up or
        verified)."""
        hit = self.hits[ticket]
        assert hit is not None
        if not hit.probed:
            self._first(hit)
        elif not self.incremental:
            self._lookup(hit)
        else:
            self._verify(hit)
        return hit.blocks * self.block_size if self.incremental else int(self.cached[hit.ticket])

    def known_cached_tokens(self, ticket: int) -> int | None:
        """The ticket's hit as the policy would see it now, without probing (None: not looked up
        yet)."""
        hit = self.hits[ticket]
        return int(self.cached[ticket]) if hit is not None and hit.probed else None

    def fresh_cached_tokens(self, request: Request) -> int:
        """A full lookup by vLLM's coordinator that ignores and does not update the memo (tests)."""
        if not self.caching or not internals.prefix_cache_lookup_enabled(self._manager, request):
            return 0
        return internals.longest_cache_hit(
            self._coordinator, request.block_hashes, request.num_tokens - 1
        )[1]

    def hit_blocks(self, ticket: int) -> list[KVCacheBlock]:
        """The cached blocks of the ticket's hit, first block first (read on demand)."""
        hit = self.hits[ticket]
        if hit is None or not hit.probed or not self.cached[hit.ticket]:
            return []
        request = hit.request
        if not self.incremental:
            groups = internals.longest_cache_hit(
                self._coordinator, request.block_hashes, hit.num_tokens - 1
            )[0]
            return list(groups[0]) if len(groups) == 1 else [b for g in groups for b in g]
        hashes = request.block_hashes
        blocks = []
        for i in range(hit.blocks):
            block = self._block_of(self._cache_get(hashes[i] + GROUP0_SUFFIX))
            if block is None:
                break
            blocks.append(block)
        return blocks

    def hit_ending_at(
        self, key: bytes, protected: Callable[[Request], bool]
    ) -> list[KVCacheBlock] | None:
        """The blocks (first block first) of the hit of a waiting request that `protected`
        accepts and whose hit ends at the block of hash key `key`; None: no such request.
        Requests whose hit ends at one block share the whole chain, so any of them will do."""
        for hit in self.by_last.get(key, ()):
            if hit.ticket >= 0 and protected(hit.request):
                return self.hit_blocks(hit.ticket)
        return None

    def _verify(self, hit: PrefixHit) -> None:
        """The steady-state checks of one memo (the batch version is in `advance`)."""
        cache_get = self._cache_get
        if hit.last_key is not None and cache_get(hit.last_key) is None:
            self._lookup(hit, evicted=True)
        elif hit.next_key is not None and cache_get(hit.next_key) is not None:
            self._extend(hit)

    def _first(self, hit: PrefixHit) -> None:
        hit.probed = True
        manager = self._manager
        if not self.caching or not internals.prefix_cache_lookup_enabled(manager, hit.request):
            return  # vLLM skips the lookup for this request (prompt logprobs, pooling): h = 0
        self._lookup(hit)

    def _lookup(self, hit: PrefixHit, evicted: bool = False) -> None:
        """From-scratch lookup of a new request, or of one whose chain's tail was evicted
        (`evicted`: the hit is now shorter than its memo).

        The cached blocks of a chain are prefix-closed (see the module docstring), so "block i
        is cached" is monotone in i and the hit's end is found by galloping from a likely length
        (`cached_prefix_near`): the memo's length minus one after an eviction (the tail block
        goes first), or for a new request the length last found for a request with the same
        first block (`hints`: shared system prompts and documents); a few hash-map reads when
        the guess is close, instead of a binary search over the whole prompt (~log2(blocks))."""
        self.num_full_lookups += 1
        hashes = hit.request.block_hashes
        if not self.incremental:
            tokens = internals.longest_cache_hit(self._coordinator, hashes, hit.num_tokens - 1)[1]
            self._set(hit, tokens // self.block_size, tokens)
            return
        cache = self._cache
        limit = min(hit.max_blocks, len(hashes))
        if evicted:
            limit = min(limit, hit.blocks - 1)
            blocks = cached_prefix_near(cache, hashes, limit, limit)
        elif limit:
            hints = self.hints
            blocks = cached_prefix_near(cache, hashes, min(hints.get(hashes[0], 0), limit), limit)
            if len(hints) >= _MAX_HINTS:
                hints.clear()
            hints[hashes[0]] = blocks
        else:
            blocks = 0
        self._set(hit, blocks)

    def _shrink(self, group: list[PrefixHit]) -> None:
        """Re-look up the hits whose chain tail (one hash key) was evicted: the key is a chain
        hash, so they share every block up to it and their new hit is the same: one search."""
        if not group:
            return
        first, *others = group
        self._lookup(first, evicted=True)
        for hit in others:  # the first's new end lies within the shared chain
            self._set(hit, first.blocks)

    def _extend(self, hit: PrefixHit) -> None:
        """Probe forward from the memoized length: the hit grew since the last step.

        Block `hit.blocks` is cached (that is why it is extended), so the new end is found by
        galloping up from there (`cached_prefix_near`): O(log g) hash-map reads for a growth of
        g blocks (a re-cached 8k-token prefix is 512 blocks)."""
        self.num_extensions += 1
        hashes = hit.request.block_hashes
        cache = self._cache
        limit = min(hit.max_blocks, len(hashes))
        self._set(hit, cached_prefix_near(cache, hashes, hit.blocks, limit, at_least=True))

    def extend_group(self, group: list[PrefixHit]) -> None:
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
        shared = first.request.block_hashes
        end = first.blocks
        stopped = end < min(first.max_blocks, len(shared))  # at a block that is not cached
        for hit in others:
            hashes = hit.request.block_hashes
            limit = min(hit.max_blocks, len(hashes))
            if end > limit or hashes[end - 1] != shared[end - 1]:
                self._extend(hit)  # the chains part before the first's end
                continue
            self.num_extensions += 1
            if end == limit or (stopped and hashes[end] == shared[end]):
                self._set(hit, end)  # capped at the first's end, or stopped where it stopped
            else:
                self._set(hit, cached_prefix_near(cache, hashes, end, limit, at_least=True))

    def _set(self, hit: PrefixHit, blocks: int, tokens: int | None = None) -> None:
        """Record a hit of `blocks` blocks; re-index its growth and eviction keys."""
        hit.blocks = blocks
        if hit.ticket >= 0:
            self.cached[hit.ticket] = blocks * self.block_size if tokens is None else tokens
        if not self.incremental:
            return
        hashes = hit.request.block_hashes
        last_key = hashes[blocks - 1] + GROUP0_SUFFIX if blocks else None
        can_grow = blocks < min(hit.max_blocks, len(hashes))
        next_key = hashes[blocks] + GROUP0_SUFFIX if can_grow else None
        if hit.ticket < 0:
            hit.next_key, hit.last_key = next_key, last_key
            return
        if next_key != hit.next_key:
            move(self.by_next, hit, hit.next_key, next_key)
            hit.next_key = next_key
        if last_key != hit.last_key:
            move(self.by_last, hit, hit.last_key, last_key)
            hit.last_key = last_key

    # --- every request ----------------------------------------------------------------------------

    def advance(self) -> None:
        """Probe new requests (up to the budget) and re-verify every memo against the cache.

        Also the whole pre-pass of a step that cannot admit anything: the hits stay current and a
        burst keeps being probed while the request slots are full.
        """
        self.check_map()
        if self._pending:
            self._probe_pending()
        if not self.incremental:
            if self.caching:  # no memo to trust: every probed request is looked up again
                for hit in self.hits:
                    if hit is not None and hit.probed and not hit.oversized:
                        self._first(hit)
            return
        cache = self._cache
        by_last = self.by_last
        if by_last:
            for key in set(by_last).difference(cache):  # chain tails that were evicted
                self._shrink(list(by_last.get(key, ())))
        by_next = self.by_next
        if by_next:
            for key in self.growth.grown_keys(cache, by_next):  # next blocks that got cached
                self.extend_group(list(by_next.get(key, ())))
        self.growth.since_full_check += 1
        self.growth.mark_newest(cache)

    @property
    def num_unprobed(self) -> int:
        """Waiting requests not looked up yet (ordered as misses until they are)."""
        return sum(1 for hit in self._pending if hit.ticket >= 0 and not hit.probed)

    def unprobed_tickets(self) -> list[int]:
        """Tickets of the waiting requests not looked up yet."""
        return [hit.ticket for hit in self._pending if hit.ticket >= 0 and not hit.probed]

    def _probe_pending(self) -> None:
        pending = self._pending
        if not self._pending_sorted:
            pending.sort(key=arrival_of)  # stable: equal arrivals keep their order of arrival
            self._pending_sorted = True
        budget, k = self.probe_budget, 0
        batch: list[PrefixHit] = []
        while k < len(pending) and budget:
            hit = pending[k]
            k += 1
            if hit.ticket >= 0 and not hit.probed:
                batch.append(hit)
                budget -= 1
        del pending[:k]
        if self.incremental:
            self._first_many(batch)
        else:
            for hit in batch:
                self._first(hit)

    def _first_many(self, batch: list[PrefixHit]) -> None:
        """`_first` of each hit in turn (incremental path): the same hits, hints and indexes.

        One loop with its lookups hoisted, and the common case inlined: the hint for the first
        block is the hit (its last block cached, the next one not), as for requests sharing a
        document or system prompt; else `cached_prefix_near` searches as `_lookup` does.
        # speed: benchmarks/probe_batch.py, 1,000 first lookups of a burst against `_first` per
        # hit: 3.5 -> 2.3 ms best, 6.1 -> 3.8 ms median of 16 turns; the whole burst step:
        # docs/results.md
        """
        cache = self._cache
        manager, hints, suffix = self._manager, self.hints, GROUP0_SUFFIX
        lookup_enabled = internals.prefix_cache_lookup_enabled
        block_size, cached = self.block_size, self.cached
        by_next, by_last = self.by_next, self.by_last
        rows: list[int] = []
        values: list[int] = []
        for hit in batch:  # unprobed: no keys yet (`add`, or reset by `check_map`)
            hit.probed = True
            request = hit.request
            if not lookup_enabled(manager, request):
                continue  # vLLM skips the lookup for this request: h = 0
            self.num_full_lookups += 1
            hashes = request.block_hashes
            limit = len(hashes)
            if hit.max_blocks < limit:
                limit = hit.max_blocks
            blocks = 0
            if limit:
                first = hashes[0]
                guess = hints.get(first, 0)
                if guess > limit:
                    guess = limit
                if guess and hashes[guess - 1] + suffix in cache and (
                    guess == limit or hashes[guess] + suffix not in cache
                ):
                    blocks = guess  # what `cached_prefix_near` finds from this guess
                else:
                    blocks = cached_prefix_near(cache, hashes, guess, limit)
                if len(hints) >= _MAX_HINTS:
                    hints.clear()
                hints[first] = blocks
            hit.blocks = blocks
            rows.append(hit.ticket)
            values.append(blocks * block_size)
            if blocks:  # indexed as `_set` indexes it (`move` from no key)
                hit.last_key = key = hashes[blocks - 1] + suffix
                by_last.setdefault(key, set()).add(hit)
            if blocks < limit:
                hit.next_key = key = hashes[blocks] + suffix
                by_next.setdefault(key, set()).add(hit)
        if rows:
            cached[rows] = values

    def check_map(self) -> None:
        """After `reset_prefix_cache()` every memo is stale: probe again. 0.32 and 0.33 replace
        the hash map, which this notices; 0.34 clears it in place, so every hit's tail key is
        gone and the next `advance()` shrinks every memo through the eviction index
        (`tests/integration/test_probe.py::test_reset_prefix_cache_forgets_every_hit`)."""
        if internals.block_hash_map(self._pool) is self._hash_map:
            return
        self._bind()
        self.by_next.clear()
        self.by_last.clear()
        self.hints.clear()
        self.growth.forget()
        for hit in self.hits:
            if hit is not None and hit.probed and not hit.oversized:
                hit.probed, hit.blocks, hit.next_key, hit.last_key = False, 0, None, None
                self.cached[hit.ticket] = 0
                self._pending.append(hit)
        self._pending_sorted = False
