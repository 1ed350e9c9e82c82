"""KV-block accounting around the ordering: soft eviction protection and oversized requests.

Soft protection (the PEEK baseline's cache half, an option for every policy, on by default for
`fairway`): before vLLM's scan, the cached hit blocks of the first K waiting requests that no one
holds (ref_cnt == 0, i.e. in the free queue, evictable) are kept out of the blocks the step can
evict. vLLM evicts from the LRU head of its free queue and a step allocates at most A new blocks
(its token budget in blocks, plus one per request that may start or decode), so only the first A
free blocks are at risk. `protect_at_risk` walks them: a block that ends the hit of a protected
request has that whole hit moved to the MRU end (the hit's first block last); the walk goes on
until it has passed A blocks no protected request needs. Why the hit's last block is the one
found: vLLM frees a request's blocks last block first, so a chain's deeper blocks always sit
nearer the LRU head than its shallower ones, and a protected hit reaches the head at its last
block first (`fairway.vllm.prefix_memo`'s argument). The cost is A blocks walked plus the hits
moved, each of which then stays safe until every other free block has been allocated; moving the
first K requests' every hit block each step (`protect_hit_blocks`, still used where the memo is
not incremental) cost 8-22 ms per step at 1,000 waiting requests (benchmarks/scheduler_overhead.py).
Nothing is pinned: ref counts and the free-block count are unchanged, so admission can never
deadlock on protected blocks. Hard pins (`BlockPool.touch` before the scan) would: they take the
blocks out of the free count, so a head request that needs every free block is refused at every
step while the pins last.

Oversized requests: vLLM's scan stops at the first request whose blocks do not fit. A request that
needs more blocks than the whole cache has would stop it forever, under any ordering.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from vllm.logger import init_logger

from fairway.vllm import internals

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

logger = init_logger(__name__)


def protect_hit_blocks(
    free_queue: FreeKVCacheBlockQueue, chains: Iterable[list[KVCacheBlock]]
) -> int:
    """Move the evictable blocks of `chains` (highest priority first) to the free queue's MRU end.

    The result equals processing the requests in reverse priority order and, for each, moving its
    chain tail first and its first block last; here each block moves once (at its highest-priority
    occurrence), because chains of requests sharing a prefix share blocks. Cost: O(distinct
    blocks) per call, plus one walk over the free queue's MRU end to detect the steady state.

    Args:
        free_queue: vLLM's `BlockPool.free_block_queue`.
        chains: per request, the cached hit blocks in prefix order (`QueueMirror.hit_blocks`).

    Returns:
        The number of blocks moved (0 when the MRU end already has this exact order).
    """
    seen: set[int] = set()
    wanted: list[KVCacheBlock] = []  # wanted[0] must end up at the very end of the queue
    for chain in chains:
        # Chains are prefixes of block-hash chains: if block j was seen (in an earlier, higher
        # priority chain), blocks 0..j were too. Walk back to the last seen block, so requests
        # sharing a long cached prefix cost O(their new blocks), not O(chain length).
        start = len(chain)
        while start > 0 and id(chain[start - 1]) not in seen:
            start -= 1
        new = chain[start:]
        seen.update(map(id, new))
        wanted += internals.evictable_blocks(new)  # in the free queue: can be moved
    if not wanted or internals.ends_with(free_queue, wanted):
        return 0
    internals.move_to_mru_end(free_queue, reversed(wanted))
    return len(wanted)


def protect_at_risk(
    free_queue: FreeKVCacheBlockQueue,
    at_risk: int,
    hit_ending_at: Callable[[KVCacheBlock], list[KVCacheBlock] | None],
) -> int:
    """Keep protected hits out of the first `at_risk` blocks vLLM would evict.

    Walks the free queue from its LRU head. `hit_ending_at(block)` gives the blocks (first block
    first) of a protected request's hit that ends at `block`, or None; such a hit's evictable
    blocks move to the MRU end (its first block last) and the walk resumes after the last block it
    passed (a move may take the next block with it); any other block counts towards `at_risk`.
    A block met again after its move (everything free is protected) ends the walk. Returns the
    number of blocks moved.
    """
    moved = 0
    passed = 0
    seen: set[int] = set()
    last: KVCacheBlock | None = None  # the last block passed (never moved)
    block = internals.eviction_head(free_queue)
    while block is not None and passed < at_risk:
        if id(block) in seen:  # the walk came round to what it moved: all free is protected
            break
        chain = hit_ending_at(block)
        wanted = internals.evictable_blocks(chain) if chain else []
        if any(b is block for b in wanted):
            seen.update(map(id, wanted))
            internals.move_to_mru_end(free_queue, reversed(wanted))
            moved += len(wanted)
            block = (internals.eviction_head(free_queue) if last is None
                     else internals.next_to_evict(free_queue, last))
            continue
        # not in a protected hit: no hit ends here, or this is a second cached copy of a block
        # whose hit holds another (vLLM may keep duplicates of one hash): evicting it loses nothing
        passed += 1
        last = block
        block = internals.next_to_evict(free_queue, block)
    return moved


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """KV blocks a request of `num_tokens` tokens occupies (ceil division)."""
    return -(-num_tokens // block_size)


def log_oversized(request_id: str, num_tokens: int, block_size: int, usable_blocks: int) -> None:
    """The one log line per oversized request (names the request and the numbers)."""
    logger.error(
        "Fairway: request %s needs %d KV blocks (%d tokens, block size %d) but the KV cache has "
        "only %d usable blocks, so it can never be admitted; it is moved behind every other "
        "request and finished with an error. Raise the KV cache size "
        "(--gpu-memory-utilization, --num-gpu-blocks-override) or lower --max-model-len.",
        request_id,
        blocks_needed(num_tokens, block_size),
        num_tokens,
        block_size,
        usable_blocks,
    )
