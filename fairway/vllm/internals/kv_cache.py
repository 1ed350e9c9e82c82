"""The KV cache: the prefix lookup, the block pool's hash map and its free queue.

Why: Fairway orders by each waiting request's cached prefix, which it reads without side effects
through vLLM's own lookup and keeps up to date from the block pool's hash map (`probe`,
`prefix_memo`); soft eviction protection moves free cached blocks within the free queue
(`protect`). Checked on vLLM 0.32, 0.33 and 0.34 (`make matrix` runs the tests below on each); a
reading that differs by release names them.

Tests: the lookup, the hash map's entries, the free queue and a reset,
`tests/integration/test_selftest.py` (`_prefix_hits`, `_reading_skips`; `OLD_READINGS` for the
pre-0.34 entry reading); the memo against vLLM's lookup, `tests/integration/test_probe.py`;
protection, `tests/integration/test_protect.py`; `usable_blocks`, `tests/integration/test_sim.py`;
`kv_usage`, `tests/integration/test_vllm_window.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from fairway.vllm.internals.versions import shape

if TYPE_CHECKING:
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_coordinator import KVCacheCoordinator
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import BlockHash, FreeKVCacheBlockQueue, KVCacheBlock
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request


def kv_cache_manager(scheduler: Scheduler) -> KVCacheManager:
    """The scheduler's KV cache manager."""
    return scheduler.kv_cache_manager  # vLLM internal: Scheduler.kv_cache_manager


def block_pool(scheduler: Scheduler) -> BlockPool:
    """The block pool (free queue, hash map) behind the scheduler's KV cache."""
    return scheduler.kv_cache_manager.block_pool  # vLLM internal: KVCacheManager.block_pool


def coordinator_of(manager: KVCacheManager) -> KVCacheCoordinator:
    """The KV-cache coordinator (the prefix lookup across groups)."""
    return manager.coordinator  # vLLM internal: KVCacheManager.coordinator


def pool_of(manager: KVCacheManager) -> BlockPool:
    """The block pool of a KV cache manager."""
    return manager.block_pool  # vLLM internal: KVCacheManager.block_pool


def block_size_of(manager: KVCacheManager) -> int:
    """Tokens per block of the (first) KV-cache group."""
    # vLLM internal: KVCacheCoordinator.single_type_managers
    managers = manager.coordinator.single_type_managers
    return int(managers[0].block_size) if managers else 1


def usable_blocks(scheduler: Scheduler) -> int:
    """KV blocks a single request could ever hold: the pool minus vLLM's null block."""
    return block_pool(scheduler).num_gpu_blocks - 1  # vLLM internal: BlockPool.num_gpu_blocks


def free_blocks(scheduler: Scheduler) -> int:
    """KV blocks vLLM can hand out now: free ones and cached ones no request holds."""
    return int(block_pool(scheduler).get_num_free_blocks())


def free_block_queue(scheduler: Scheduler) -> FreeKVCacheBlockQueue:
    """vLLM's queue of evictable blocks, LRU first."""
    return block_pool(scheduler).free_block_queue  # vLLM internal: BlockPool.free_block_queue


def kv_usage(scheduler: Scheduler) -> float:
    """The share of the KV cache's usable blocks in use, 1 - free / usable (cached blocks no
    request holds count as free): vLLM's `KVCacheManager.usage` (`BlockPool.get_usage`), a
    public property in 0.32 to 0.34, the value vLLM 0.34 compares with
    `cache_aware_admission_threshold`."""
    return float(kv_cache_manager(scheduler).usage)


def prefix_cache_lookup_enabled(manager: KVCacheManager, request: Request) -> bool:
    """False where vLLM skips the prefix lookup for a request (prompt logprobs, pooling)."""
    return bool(manager.prefix_cache_lookup_enabled(request))


def skips_external_kv(request: Request) -> bool:
    """Whether vLLM loads none of this request's prefix from a KV connector (the CPU tier).

    0.34: `Request.skip_reading_external_kv`, true for any request with a prefix-cache hit
    limit (skipping the cache, or prompt logprobs); 0.32 and 0.33: the flag
    `Request.skip_reading_prefix_cache`.
    """
    if shape().hit_limit:
        # vLLM internal: Request.skip_reading_external_kv (0.34; no default: the name exists)
        return bool(getattr(request, "skip_reading_external_kv"))  # noqa: B009
    # vLLM internal: Request.skip_reading_prefix_cache (0.32, 0.33)
    return bool(request.skip_reading_prefix_cache)


def longest_cache_hit(
    coordinator: KVCacheCoordinator, block_hashes: list[BlockHash], max_length: int
) -> tuple[Any, int]:
    """vLLM's own lookup: (cached blocks per KV-cache group, hit length in tokens).

    Read-only at the coordinator level (no ref counts, stats or free-queue moves); it walks the
    hashes from the start.
    """
    # vLLM internal: KVCacheCoordinator.find_longest_cache_hit
    result = coordinator.find_longest_cache_hit(
        block_hashes, max_length
    )
    return result[0], int(result[1])


def block_hash_map(pool: BlockPool) -> Any:
    """The pool's block-hash map; vLLM replaces the object on `reset_prefix_cache()`."""
    return pool.cached_block_hash_to_block  # vLLM internal: BlockPool.cached_block_hash_to_block


def hash_map_dict(hash_map: Any) -> dict[bytes, Any]:
    """The plain dict behind the hash map: key -> an entry (`entry_block_reader` reads it)."""
    cache: dict[bytes, Any] = hash_map._cache  # vLLM internal: BlockHashToBlockMap._cache
    return cache


def hash_map_getter(hash_map: Any) -> Any:
    """The hash map's public getter: key -> a block, or None."""
    return hash_map.get_one_block  # vLLM internal: BlockHashToBlockMap.get_one_block


def entry_block_reader(pool: BlockPool) -> Callable[[Any], KVCacheBlock | None]:
    """entry -> one block of a hash-map entry (None -> None).

    0.34 keeps a block id, an index into `BlockPool.blocks`; 0.32 and 0.33 a block, or a dict
    of duplicate blocks.
    """
    if shape().map_holds_ids:
        blocks = pool.blocks  # vLLM internal: BlockPool.blocks (0.34: what map entries index)
        return lambda entry: None if entry is None else blocks[entry]
    return _one_block


def _one_block(entry: Any) -> KVCacheBlock | None:
    # vLLM internal: BlockHashToBlockMap entries (0.32, 0.33: a block, or a dict of duplicates)
    if entry is None or not isinstance(entry, dict):
        return entry
    return next(iter(entry.values()), None)


def group_key_suffix(group_id: int = 0) -> bytes:
    """What vLLM's hash-map key of a block hash appends to the hash for a KV-cache group
    (`make_block_hash_with_group_id`, 0.32: the group id in 4 big-endian bytes)."""
    from vllm.v1.core.kv_cache_utils import BlockHash, make_block_hash_with_group_id

    # vLLM internal: make_block_hash_with_group_id (the hash-map key's encoding)
    return make_block_hash_with_group_id(BlockHash(b""), group_id)


def keys_are_suffixed() -> bool:
    """Whether vLLM builds a group-0 key by appending `group_key_suffix()` to the block hash."""
    from vllm.v1.core.kv_cache_utils import BlockHash, make_block_hash_with_group_id

    sample = BlockHash(bytes(range(32)))
    return make_block_hash_with_group_id(sample, 0) == sample + group_key_suffix()


def supports_incremental(coordinator: KVCacheCoordinator, pool: BlockPool) -> bool:
    """Whether the cached-prefix memo is exact: one full-attention group hashed at the block size
    (no EAGLE, no context parallelism), with hash-map keys built by appending the group suffix."""
    from vllm.v1.core.kv_cache_coordinator import UnitaryKVCacheCoordinator
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager

    if not isinstance(coordinator, UnitaryKVCacheCoordinator):
        return False
    manager = coordinator.single_type_managers[0]
    return (
        type(manager) is FullAttentionManager
        and not _eagle_groups(coordinator)  # EAGLE drops the last hit block
        and pool.hash_block_size == manager.block_size  # vLLM internal: BlockPool.hash_block_size
        # vLLM internal: UnitaryKVCacheCoordinator.dcp_world_size / pcp_world_size
        and coordinator.dcp_world_size == 1
        and coordinator.pcp_world_size == 1
        and keys_are_suffixed()
    )


def _eagle_groups(coordinator: KVCacheCoordinator) -> set[int]:
    """The groups whose last hit block the lookup drops (EAGLE): `drop_eagle_group_ids` from
    0.33, `eagle_group_ids` in 0.32 (`VllmShape.drop_eagle`)."""
    if shape().drop_eagle:
        # vLLM internal: KVCacheCoordinator.drop_eagle_group_ids (0.33, 0.34)
        return set(getattr(coordinator, "drop_eagle_group_ids"))  # noqa: B009 (0.32 lacks it)
    # vLLM internal: KVCacheCoordinator.eagle_group_ids (0.32)
    return set(coordinator.eagle_group_ids)


# --- the free queue (soft eviction protection) ----------------------------------------------------


def evictable_blocks(blocks: Iterable[KVCacheBlock]) -> list[KVCacheBlock]:
    """The blocks no request holds (ref_cnt == 0, i.e. in the free queue), with a hash (cached),
    other than the null block (never in the free queue)."""
    # vLLM internals: KVCacheBlock.ref_cnt, KVCacheBlock.block_hash, KVCacheBlock.is_null
    return [b for b in blocks if b.ref_cnt == 0 and b.block_hash is not None and not b.is_null]


def move_to_mru_end(free_queue: FreeKVCacheBlockQueue, blocks: Iterable[KVCacheBlock]) -> None:
    """Move free blocks to the MRU end of the free queue, in this order (the last one last)."""
    for block in blocks:
        free_queue.remove(block)  # vLLM internal: FreeKVCacheBlockQueue.remove (O(1))
        free_queue.append(block)  # vLLM internal: FreeKVCacheBlockQueue.append


def block_key(block: KVCacheBlock) -> bytes | None:
    """A cached block's key in the block pool's hash map (the hash with its group id; the
    memo's index keys), or None for a block that holds no cached content."""
    key: bytes | None = block.block_hash  # vLLM internal: KVCacheBlock.block_hash
    return key


def eviction_head(free_queue: FreeKVCacheBlockQueue) -> KVCacheBlock | None:
    """The free block vLLM evicts next (the LRU end), or None when the queue is empty."""
    # vLLM internals: FreeKVCacheBlockQueue.fake_free_list_head / fake_free_list_tail,
    # KVCacheBlock.next_free_block (the list's sentinels and links)
    first = free_queue.fake_free_list_head.next_free_block
    return None if first is None or first is free_queue.fake_free_list_tail else first


def next_to_evict(free_queue: FreeKVCacheBlockQueue, block: KVCacheBlock) -> KVCacheBlock | None:
    """The free block vLLM evicts after `block`, or None at the MRU end."""
    # vLLM internal: KVCacheBlock.next_free_block
    following = block.next_free_block
    return None if following is None or following is free_queue.fake_free_list_tail else following


def ends_with(free_queue: FreeKVCacheBlockQueue, wanted: Sequence[KVCacheBlock]) -> bool:
    """True if the free queue already ends with wanted[-1], ..., wanted[0] (wanted[0] last)."""
    # vLLM internals: FreeKVCacheBlockQueue.fake_free_list_tail, KVCacheBlock.prev_free_block
    node: KVCacheBlock | None = free_queue.fake_free_list_tail  # the list's tail sentinel
    for block in wanted:
        node = node.prev_free_block if node is not None else None
        if node is not block:
            return False
    return True
