"""Side-effect-free, incremental cached-prefix lookup, and every private vLLM access Fairway makes.

Each function here that touches a vLLM internal is tagged `# vLLM internal: <name>`;
`tests/integration/test_compat_names.py` asserts each of those names exists, and
`check_internals()` runs the same checks when a Fairway scheduler starts.

Why incremental: vLLM's lookup (`KVCacheCoordinator.find_longest_cache_hit`) walks the request's
block hashes from the start, ~1 us per cached block on a CPU core, so re-probing 1,000 waiting
16k-token prompts every step would cost ~0.5 s. A waiting request's hit changes only if
(a) one of its hit blocks was evicted or (b) its next block got cached. `PrefixProbe` memoizes the
hit chain per request and re-verifies exactly those two things each step: (a) is one attribute
read on the last memoized block (an evicted block loses its hash), (b) one dict lookup of the next
block's hash. A full lookup is done only for new requests and after an eviction. The policy's
view of each request (`QueuedRequest`) is kept in the same memo and reused while it is unchanged.

Why checking the last block suffices (full-attention, single KV-cache group, the only mode the
incremental path is used in): vLLM frees a request's blocks tail first and appends them to the LRU
end of the free queue, and a request that holds block i of a chain holds blocks 0..i-1 too. So an
ancestor always sits behind its descendants in eviction order; while the last memoized block keeps
its hash, every earlier block of the chain is still cached. (Exception: a KV connector's
`evict_blocks()` after a failed KV load may drop interior blocks; the memo then overstates the hit
until the last block goes too. Ordering is then slightly off; admission stays exact, because vLLM
does its own lookup at admission.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_coordinator import UnitaryKVCacheCoordinator
from vllm.v1.core.kv_cache_utils import KVCacheBlock, make_block_hash_with_group_id
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
from vllm.v1.request import Request, RequestStatus

from fairway.policies.base import QueuedRequest

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler


# --- scheduler and request fields -----------------------------------------------------------------


def waiting_queue(scheduler: Scheduler) -> FCFSRequestQueue:
    """The queue Fairway orders: new and preempted requests that hold no KV blocks."""
    return scheduler.waiting  # vLLM internal: Scheduler.waiting


def reorder_queue(queue: FCFSRequestQueue, requests: Sequence[Request]) -> None:
    """Replace the deque's contents by `requests` (a permutation of them), in place.

    In place because vLLM holds the queue object; the order survives until the scan pops it.
    """
    queue.clear()  # vLLM internal: FCFSRequestQueue is a deque
    queue.extend(requests)


def kv_cache_manager(scheduler: Scheduler) -> KVCacheManager:
    """The scheduler's KV cache manager."""
    return scheduler.kv_cache_manager  # vLLM internal: Scheduler.kv_cache_manager


def block_pool(scheduler: Scheduler) -> BlockPool:
    """The block pool (free queue, hash map) behind the scheduler's KV cache."""
    return scheduler.kv_cache_manager.block_pool  # vLLM internal: KVCacheManager.block_pool


def request_fields(request: Request) -> tuple[str, float, int]:
    """(request_id, arrival_time, num_tokens = prompt + output so far)."""
    # vLLM internal: Request.request_id / arrival_time / num_tokens
    return request.request_id, request.arrival_time, request.num_tokens


def is_preempted(request: Request) -> bool:
    """True for a request vLLM preempted (it was put back at the head of the queue)."""
    return request.status == RequestStatus.PREEMPTED  # vLLM internal: RequestStatus.PREEMPTED


def scheduled_tokens(output: SchedulerOutput) -> Mapping[str, int]:
    """Tokens scheduled per request id in one step."""
    return output.num_scheduled_tokens  # vLLM internal: SchedulerOutput.num_scheduled_tokens


def prefill_tokens(scheduler: Scheduler, output: SchedulerOutput) -> int:
    """Tokens of this step that computed prompt positions (prefill), summed over requests.

    Called after `schedule()`, when vLLM has already advanced `num_computed_tokens` by the
    scheduled count: a request was prefilling if it started the step below its prompt length.
    A resumed preempted request recomputes prompt + earlier output, all of it counted.
    """
    requests = scheduler.requests  # vLLM internal: Scheduler.requests
    total = 0
    for req_id, n in output.num_scheduled_tokens.items():
        request = requests.get(req_id)
        # vLLM internal: Request.num_computed_tokens / num_prompt_tokens
        if request is not None and request.num_computed_tokens - n < request.num_prompt_tokens:
            total += n
    return total


def scheduled_spans(
    scheduler: Scheduler, scheduled: Mapping[str, int]
) -> dict[str, tuple[int, int, int]]:
    """request id -> (start, end, prompt tokens) of the positions each request computes this step.

    Read after `schedule()`, which has already advanced `num_computed_tokens` by the scheduled
    count, so the span is [computed - n, computed). Used by the virtual replay's cost model.
    """
    requests = scheduler.requests  # vLLM internal: Scheduler.requests
    spans = {}
    for request_id, n in scheduled.items():
        request = requests[request_id]
        # vLLM internal: Request.num_computed_tokens / num_prompt_tokens
        end = request.num_computed_tokens
        spans[request_id] = (end - n, end, request.num_prompt_tokens)
    return spans


def deferred_count(scheduler: Scheduler) -> int:
    """How many waiting requests vLLM skipped (blocked status etc.); bounds the admission scan."""
    return len(scheduler.deferred_waiting)  # vLLM internal: Scheduler.deferred_waiting


def report_request_error(scheduler: Scheduler, request_id: str) -> bool:
    """Have vLLM finish a waiting request with FINISHED_ERROR at the next `update_from_output`.

    vLLM finishes a waiting request with an error output delivered to its client only from
    `update_from_output`, via the id sets it drains there (0.32; the same set exists in the
    upstream versions around it); `grammar_compile_error_reqs` is the one that needs no other
    state. Returns False (nothing done) if the set is missing: the request then only stays last.
    """
    errors = getattr(scheduler, "grammar_compile_error_reqs", None)  # vLLM internal
    if not isinstance(errors, set):
        return False
    errors.add(request_id)
    return True


def usable_blocks(scheduler: Scheduler) -> int:
    """KV blocks a single request could ever hold: the pool minus vLLM's null block."""
    return block_pool(scheduler).num_gpu_blocks - 1  # vLLM internal: BlockPool.num_gpu_blocks


def _eagle_groups(coordinator: Any) -> set[int]:
    # vLLM internal: KVCacheCoordinator.eagle_group_ids (0.33 adds drop_eagle_group_ids)
    groups = getattr(coordinator, "drop_eagle_group_ids", None)
    if groups is None:
        groups = getattr(coordinator, "eagle_group_ids", set())
    return set(groups)


# --- the probe ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Hit:
    """Memo of one waiting request: its cached chain, what to re-verify, and its policy view.

    Valid for one stint in the waiting queue (dropped at admission): while a request waits, its
    tokens, arrival and status do not change, only the cache around it does.
    """

    num_tokens: int
    #: (num_tokens - 1) // block_size: the hit never covers the last token.
    cap: int
    blocks: list[KVCacheBlock] = field(default_factory=list)
    #: Hit length in tokens (len(blocks) * block_size on the incremental path).
    tokens: int = 0
    #: Last block of the chain and the hash key it had when memoized (eviction check).
    last_block: KVCacheBlock | None = None
    last_key: bytes | None = None
    #: Hash key of block `len(blocks)`, the next one to look for (growth check); None: unhashed.
    next_key: bytes | None = None
    #: vLLM skips the lookup for this request (prompt logprobs, pooling): the hit stays 0.
    disabled: bool = False
    #: The policy's view of the request, reused while nothing changes.
    view: QueuedRequest | None = None


class PrefixProbe:
    """Cached-prefix length of waiting requests, without touching vLLM's state.

    Read-only: no ref counts, no free-queue moves, no prefix-cache stats, no KV events (it uses
    the coordinator lookup and the hash map directly, not `get_computed_blocks`). Block-granular
    and capped at `num_tokens - 1` like vLLM's own lookup (the last token is always computed).

    Cost per waiting request and step in the steady state: one memo lookup (keyed by the Request
    object, so the request's own attributes are not read for it), one attribute compare on the
    last hit block (eviction check) and one hash-map lookup (growth check).
    """

    def __init__(self, manager: KVCacheManager, *, caching: bool = True) -> None:
        self._manager = manager
        self._coordinator = manager.coordinator  # vLLM internal: KVCacheManager.coordinator
        pool = manager.block_pool
        self._cache_get = _hash_map_getter(pool)
        self._memo: dict[Request, _Hit] = {}
        self.caching = caching
        self.block_size = self._block_size()
        self.incremental = caching and self._supports_incremental(pool)
        #: Lookups by kind since construction (tests and the benchmark read them).
        self.num_full_lookups = 0
        self.num_extensions = 0

    def _block_size(self) -> int:
        managers = self._coordinator.single_type_managers  # vLLM internal
        return int(managers[0].block_size) if managers else 1

    def _supports_incremental(self, pool: BlockPool) -> bool:
        """The memo is exact only for one full-attention group hashed at the block size."""
        coordinator = self._coordinator
        if not isinstance(coordinator, UnitaryKVCacheCoordinator):
            return False
        manager = coordinator.single_type_managers[0]
        return (
            type(manager) is FullAttentionManager
            and not _eagle_groups(coordinator)  # EAGLE drops the last hit block
            and pool.hash_block_size == manager.block_size  # vLLM internal: hash_block_size
            and getattr(coordinator, "dcp_world_size", 1) == 1
            and getattr(coordinator, "pcp_world_size", 1) == 1
        )

    def cached_tokens(self, request: Request) -> int:
        """Tokens of the longest cached prefix of `request` now (what admission would reuse)."""
        return self._probe(request, request.num_tokens).tokens  # vLLM internal: num_tokens

    def fresh_cached_tokens(self, request: Request) -> int:
        """A full lookup that ignores and does not update the memo (for tests)."""
        if not self._manager.prefix_cache_lookup_enabled(request):  # vLLM internal
            return 0
        result = self._coordinator.find_longest_cache_hit(  # vLLM internal
            request.block_hashes, request.num_tokens - 1
        )
        return int(result[1])

    def _probe(self, request: Request, num_tokens: int) -> _Hit:
        """The request's memo, re-verified (the general path; `snapshot` inlines the fast one)."""
        hit = self._memo.get(request)
        if hit is None or hit.num_tokens != num_tokens or not self.incremental:
            return self._first(request, num_tokens)
        if hit.disabled:
            return hit
        last = hit.last_block
        if last is not None and last.block_hash != hit.last_key:  # the chain's tail was evicted
            return self._first(request, num_tokens)
        key = hit.next_key
        if key is None:
            if len(request.block_hashes) > len(hit.blocks):  # vLLM internal: block_hashes
                self._extend(request, hit)
        elif len(hit.blocks) < hit.cap and self._cache_get(key) is not None:
            self._extend(request, hit)
        return hit

    def _first(self, request: Request, num_tokens: int) -> _Hit:
        """Full lookup (new request, or its memo went stale); memoizes the chain."""
        hit = _Hit(num_tokens, (num_tokens - 1) // self.block_size)
        self._memo[request] = hit
        # vLLM internal: KVCacheManager.prefix_cache_lookup_enabled
        if not self.caching or not self._manager.prefix_cache_lookup_enabled(request):
            hit.disabled = True
            return hit
        self.num_full_lookups += 1
        result = self._coordinator.find_longest_cache_hit(  # vLLM internal
            request.block_hashes, num_tokens - 1
        )
        groups, hit.tokens = result[0], int(result[1])
        hit.blocks = list(groups[0]) if len(groups) == 1 else [b for g in groups for b in g]
        if self.incremental:
            self._set_keys(request, hit)
        return hit

    def _set_keys(self, request: Request, hit: _Hit) -> None:
        blocks = hit.blocks
        n = len(blocks)
        hit.tokens = n * self.block_size
        hit.last_block = blocks[-1] if n else None
        hit.last_key = blocks[-1].block_hash if n else None
        hashes = request.block_hashes  # vLLM internal: Request.block_hashes
        hit.next_key = make_block_hash_with_group_id(hashes[n], 0) if n < len(hashes) else None

    def _extend(self, request: Request, hit: _Hit) -> None:
        """Probe forward from the memoized length: the hit grew since the last step."""
        self.num_extensions += 1
        blocks = hit.blocks
        self._set_keys(request, hit)
        hashes = request.block_hashes  # vLLM internal: Request.block_hashes
        while hit.next_key is not None and len(blocks) < hit.cap:
            block = _one_block(self._cache_get(hit.next_key))
            if block is None:
                break
            blocks.append(block)
            n = len(blocks)
            hit.next_key = make_block_hash_with_group_id(hashes[n], 0) if n < len(hashes) else None
        self._set_keys(request, hit)

    def snapshot(
        self, requests: Sequence[Request], *, keep_preempted_first: bool, max_tokens: int
    ) -> QueueSnapshot:
        """Probe every waiting request and build the policy's view of the orderable ones.

        The hot path at 1,000+ waiting requests: one loop, the steady-state checks of `_probe`
        inlined, Request fields read directly, and an unchanged request reuses its view object.

        Args:
            requests: the waiting queue in its current order.
            keep_preempted_first: put PREEMPTED requests in `fixed` instead of ordering them.
            max_tokens: requests longer than this cannot fit in an empty cache (`oversized`).
        """
        snap = QueueSnapshot()
        fixed, ordered, views, oversized = snap.fixed, snap.requests, snap.views, snap.oversized
        memo_get, cache_get = self._memo.get, self._cache_get
        incremental = self.incremental
        preempted = RequestStatus.PREEMPTED  # vLLM internal: RequestStatus.PREEMPTED
        work_max, work_min = 0, -1
        for request in requests:
            num_tokens = request.num_tokens  # vLLM internal: Request.num_tokens
            if num_tokens > max_tokens:
                oversized.append(request)
                continue
            hit = memo_get(request)
            if hit is None or not incremental or hit.num_tokens != num_tokens:
                hit = self._probe(request, num_tokens)
            else:
                last, key = hit.last_block, hit.next_key
                if (
                    (last is not None and last.block_hash != hit.last_key)  # tail evicted
                    or (key is not None and cache_get(key) is not None)  # next block cached
                    or (key is None and not hit.disabled)  # new hashes possible
                ):
                    hit = self._probe(request, num_tokens)  # not the steady state: full check
            if keep_preempted_first and request.status == preempted:  # vLLM internal: status
                fixed.append(request)
                continue
            view = hit.view
            if view is None or view.cached_tokens != hit.tokens:
                # vLLM internal: Request.request_id / arrival_time
                view = QueuedRequest(
                    request.request_id, request.arrival_time, num_tokens, hit.tokens
                )
                hit.view = view
            ordered.append(request)
            views.append(view)
            work = num_tokens - hit.tokens
            if work > work_max:
                work_max = work
            if work < work_min or work_min < 0:
                work_min = work
        snap.work_max, snap.work_min = max(work_max, 1), max(work_min, 1)
        return snap

    def hit_blocks(self, request: Request) -> list[KVCacheBlock]:
        """The memoized hit chain of a request probed this step (first block first)."""
        hit = self._memo.get(request)
        return hit.blocks if hit is not None else []

    def forget(self, requests: Iterable[Request]) -> None:
        """Drop memo entries (requests admitted or gone)."""
        memo = self._memo
        for request in requests:
            memo.pop(request, None)

    def retain(self, requests: Iterable[Request]) -> None:
        """Keep only these requests' memo entries (the queue as it is now)."""
        memo = self._memo
        self._memo = {r: memo[r] for r in requests if r in memo}

    def __len__(self) -> int:
        return len(self._memo)


def _hash_map_getter(pool: BlockPool) -> Callable[[bytes], Any]:
    """`key -> cached entry or None` for the pool's hash map, as cheap as possible.

    The growth check runs once per waiting request per step, so it reads the map's dict directly
    (~0.1 us) instead of `BlockHashToBlockMap.get_one_block` (~0.5 us); the public method is the
    fallback if the private dict is gone. Entries are a block or a {block_id: block} dict.
    """
    hash_map = pool.cached_block_hash_to_block  # vLLM internal: BlockPool hash map
    raw = getattr(hash_map, "_cache", None)  # vLLM internal: BlockHashToBlockMap._cache
    if isinstance(raw, dict):
        return raw.get
    return hash_map.get_one_block


def _one_block(entry: Any) -> KVCacheBlock | None:
    """A block from a hash-map entry (a block, or several duplicates in a dict)."""
    if entry is None or isinstance(entry, KVCacheBlock):
        return entry
    return next(iter(entry.values()), None)


# --- the queue view -------------------------------------------------------------------------------


@dataclass(slots=True)
class QueueSnapshot:
    """The waiting queue split for one ordering step (every request in exactly one list).

    The new queue is `fixed + [requests[i] for i in order] + oversized`.
    """

    #: Preempted requests kept at the head in their current order (vLLM's rule).
    fixed: list[Request] = field(default_factory=list)
    #: Requests the policy orders; `views[i]` describes `requests[i]`.
    requests: list[Request] = field(default_factory=list)
    views: list[QueuedRequest] = field(default_factory=list)
    #: Requests that cannot fit in an empty KV cache: kept behind everyone else.
    oversized: list[Request] = field(default_factory=list)
    #: Largest / smallest uncached work among `views` (tokens).
    work_max: int = 0
    work_min: int = 0


# --- start-up self-check --------------------------------------------------------------------------

#: (dotted name, how to find it on a live scheduler) for every internal used above.
INTERNAL_NAMES: tuple[str, ...] = (
    "Scheduler.waiting",
    "Scheduler.requests",
    "Scheduler.deferred_waiting",
    "Scheduler.kv_cache_manager",
    "Scheduler.grammar_compile_error_reqs",
    "KVCacheManager.coordinator",
    "KVCacheManager.block_pool",
    "KVCacheManager.prefix_cache_lookup_enabled",
    "KVCacheCoordinator.find_longest_cache_hit",
    "KVCacheCoordinator.single_type_managers",
    "BlockPool.cached_block_hash_to_block",
    "BlockHashToBlockMap.get_one_block",
    "BlockHashToBlockMap._cache",
    "BlockPool.free_block_queue",
    "BlockPool.num_gpu_blocks",
    "BlockPool.hash_block_size",
    "FreeKVCacheBlockQueue.remove",
    "FreeKVCacheBlockQueue.append",
    "FreeKVCacheBlockQueue.fake_free_list_tail",
    "KVCacheBlock.ref_cnt",
    "KVCacheBlock.block_hash",
    "KVCacheBlock.is_null",
    "KVCacheBlock.prev_free_block",
)


def check_internals(scheduler: Scheduler) -> list[str]:
    """Names from `INTERNAL_NAMES` (and the queue type) missing on this live scheduler."""
    missing: list[str] = []
    if not isinstance(getattr(scheduler, "waiting", None), FCFSRequestQueue):
        missing.append("Scheduler.waiting as FCFSRequestQueue (a deque)")
    objects: dict[str, Any] = {"Scheduler": scheduler}
    manager = getattr(scheduler, "kv_cache_manager", None)
    objects["KVCacheManager"] = manager
    objects["KVCacheCoordinator"] = getattr(manager, "coordinator", None)
    pool = getattr(manager, "block_pool", None)
    objects["BlockPool"] = pool
    objects["BlockHashToBlockMap"] = getattr(pool, "cached_block_hash_to_block", None)
    objects["FreeKVCacheBlockQueue"] = getattr(pool, "free_block_queue", None)
    objects["KVCacheBlock"] = KVCacheBlock(0)
    for name in INTERNAL_NAMES:
        owner, attr = name.split(".")
        obj = objects.get(owner)
        if obj is None or not hasattr(obj, attr):
            missing.append(name)
    for attr in ("request_id", "arrival_time", "num_tokens", "block_hashes", "status"):
        if attr not in _request_attrs():
            missing.append(f"Request.{attr}")
    return missing


def _request_attrs() -> set[str]:
    """Attribute names a Request has (properties on the class, fields set in __init__)."""
    names = set(dir(Request))
    init = Request.__init__.__code__
    names.update(init.co_names)  # attribute names assigned in __init__ (self.x = ...)
    return names
