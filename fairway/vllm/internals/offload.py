"""vLLM's KV offloading connector (the CPU tier): what the tier probe and the replay's tier read.

Why: with `--kv-offloading-size` a waiting request's prefix may sit in host memory, which vLLM
loads instead of recomputing; Fairway's order counts those tokens (`tier_probe`) by reading the
connector's scheduler half without side effects, and the virtual replay stands in for its worker
half (`offload_worker`, `fairway.replay.offload_sim`). None of the connector's fields is a public
API. Checked on vLLM 0.32, 0.33 and 0.34 (`make matrix` runs the tests below on each).

Tests: the probe's reading against what the connector loads, `tests/integration/test_tier_probe.py`;
the tier's size (`offload_alignment_bytes`, `offload_tier_chunks`), a step's transfers
(`offload_transfers`) and the worker's report (`offload_worker_output`),
`tests/integration/test_replay_offload.py` and `tests/unit/test_offload_sim.py`;
`max_load_tokens` and `finished_request_ids`, `tests/integration/test_internals_offload.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fairway.errors import FairwayError

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request


def kv_connector(scheduler: Scheduler) -> Any:
    """The scheduler-side KV connector, or None (no `--kv-transfer-config` / offloading)."""
    return scheduler.get_kv_connector()


def offloading_scheduler(connector: Any) -> Any:
    """The `OffloadingConnectorScheduler` of an `OffloadingConnector` (None: another connector).

    Read by class name, not imported: the connector module pulls in torch's CUDA paths on some
    builds, and a Fairway scheduler without offloading must not import it.
    """
    if type(connector).__name__ != "OffloadingConnector":
        return None
    return connector.connector_scheduler  # vLLM internal: OffloadingConnector.connector_scheduler


def offload_group(tier_scheduler: Any) -> tuple[int, int, int]:
    """(group index, tokens per chunk, block hashes per chunk) of the tier's one KV group.

    Raises `FairwayError` for what the probe does not read: several KV groups (hybrid models),
    sliding-window or EAGLE groups, partial-tail loads.
    """
    config = tier_scheduler.config  # vLLM internal: OffloadingConnectorScheduler.config
    groups = config.kv_group_configs  # vLLM internal: SchedulerOffloadConfig.kv_group_configs
    if len(groups) != 1:
        raise FairwayError(f"the offload tier has {len(groups)} KV groups (one is read)")
    group = groups[0]
    # vLLM internal: GroupOffloadConfig.sliding_window_size_in_chunks / is_eagle_group
    if group.sliding_window_size_in_chunks is not None or group.is_eagle_group:
        raise FairwayError("the offload tier's KV group is sliding-window or EAGLE")
    if config.supports_partial_tail:  # vLLM internal: SchedulerOffloadConfig.supports_partial_tail
        raise FairwayError("the offload tier loads partial tails")
    # vLLM internal: GroupOffloadConfig.group_idx / tokens_per_chunk / hashes_per_chunk
    return int(group.group_idx), int(group.tokens_per_chunk), int(group.hashes_per_chunk)


def offload_manager(tier_scheduler: Any) -> Any:
    """The tier's `OffloadingManager` (its `lookup(key, ctx)` reads without side effects for
    vLLM's CPU manager: a dict read)."""
    return tier_scheduler.manager  # vLLM internal: OffloadingConnectorScheduler.manager


def offload_lookup(manager: Any) -> Callable[[bytes, Any], Any]:
    """The manager's `lookup(key, request context)` -> a `LookupResult`.

    Why: the probe asks the tier about each chunk of a waiting request's prompt, as the
    connector will at admission. `OffloadingManager` declares the method; what Fairway relies
    on is that vLLM's `CPUOffloadingManager` answers with a dict read (no recency touch, no
    transfer prepared, no event): checked on 0.32, 0.33, 0.34 by
    `tests/integration/test_tier_probe.py` (the probe's reading equals the connector's load).
    """
    # vLLM internal: CPUOffloadingManager.lookup without side effects
    lookup: Callable[[bytes, Any], Any] = manager.lookup
    return lookup


def offload_lookup_results() -> tuple[Any, Any]:
    """vLLM's `LookupResult.HIT` and `LookupResult.MISS` (others mean pending or retry)."""
    from vllm.v1.kv_offload.base import LookupResult

    return LookupResult.HIT, LookupResult.MISS


def offload_request_context(tier_scheduler: Any, request_id: str) -> Any:
    """The tier's per-request context (None: not registered with the connector)."""
    # vLLM internal: OffloadingConnectorScheduler._req_status / RequestOffloadState.req_context
    status = tier_scheduler._req_status.get(request_id)
    return None if status is None else status.req_context


def offload_busy_requests(tier_scheduler: Any) -> set[str]:
    """Ids of requests with a transfer in flight (the connector defers them: `None` matched)."""
    # vLLM internal: OffloadingConnectorScheduler._jobs / TransferJobStatus.req_id
    return {job.req_id for job in tier_scheduler._jobs.values()}


def offload_chunks_being_loaded(tier_scheduler: Any) -> set[bytes] | None:
    """Offload keys with a load in flight (a request needing one is deferred); None: untracked."""
    # vLLM internal: OffloadingConnectorScheduler._chunks_being_loaded
    return tier_scheduler._chunks_being_loaded


def offload_key_suffix(group_idx: int) -> bytes:
    """What vLLM's offload key appends to a block hash for a KV group (`make_offload_key`,
    0.32: the group index in 4 big-endian bytes); checked against vLLM's own function."""
    from vllm.v1.kv_offload.base import make_offload_key

    suffix = group_idx.to_bytes(4, "big", signed=False)
    if make_offload_key(b"fairway-check", group_idx) != b"fairway-check" + suffix:
        raise FairwayError("vLLM's offload key encoding changed (make_offload_key)")
    return suffix


def offload_jobs(tier_scheduler: Any) -> Mapping[int, Any]:
    """The connector's transfer jobs in flight: job id -> its status (`offload_job_keys`)."""
    return tier_scheduler._jobs  # vLLM internal: OffloadingConnectorScheduler._jobs


def offload_job_counter(tier_scheduler: Any) -> int:
    """The id the connector gives its next job (ids are consecutive)."""
    # vLLM internal: OffloadingConnectorScheduler._job_counter
    return int(tier_scheduler._job_counter)


def offload_job_keys(job: Any) -> tuple[bool, Collection[bytes]]:
    """(whether the job is a store, the offload keys it covers)."""
    return bool(job.is_store), job.keys  # vLLM internal: TransferJobStatus.is_store / keys


def offload_used_chunks(manager: Any) -> int:
    """Chunks of vLLM's CPU tier in use, stored or being stored: a store allocates one per key,
    an eviction frees one. The tier probe reads only `CPUOffloadingManager` (it refuses others
    at start-up), whose fields these are in 0.32, 0.33 and 0.34."""
    # vLLM internal: CPUOffloadingManager._num_allocated_chunks / _free_list
    return int(manager._num_allocated_chunks) - len(manager._free_list)


def offload_generation(manager: Any) -> int:
    """Changes when vLLM's CPU tier is reset (`CPUOffloadingManager`, as `offload_used_chunks`)."""
    return int(manager._cache_generation)  # vLLM internal: CPUOffloadingManager._cache_generation


def max_load_tokens(request: Request) -> int | None:
    """The most tokens the connector may load for the request beyond its GPU hit (None: no cap).

    Why: a request's `kv_transfer_params` may cap its tier load (`"max_load_tokens"`, a key
    vLLM's offloading connector calls experimental); the probe must count only what the
    connector will load. Read as the connector reads it (`RequestOffloadState.__post_init__`,
    0.32, 0.33, 0.34): a non-negative int, anything else ignored.
    """
    params = request.kv_transfer_params
    # vLLM internal: the offloading connector's "max_load_tokens" kv_transfer_params key
    raw = params.get("max_load_tokens") if params else None
    return raw if type(raw) is int and raw >= 0 else None


# --- the replay's tier: its size, a step's transfers, the worker's report -----------------------


def offload_alignment_bytes() -> int:
    """The unit vLLM rounds a CPU tier's bytes per chunk up to.

    Why: the offline replay sizes its tier in blocks, vLLM in bytes (`cpu_bytes_to_use`); with
    the offline engine's tiny KV spec one unit holds one block (`offload_worker.transfer_config`,
    verified by `offload_tier_chunks` after the build). Checked on 0.32, 0.33, 0.34.
    """
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

    # vLLM internal: SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT
    return int(SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT)


def offload_tier_chunks(tier_scheduler: Any) -> tuple[int, int]:
    """(chunks the CPU tier holds, GPU blocks per chunk) as vLLM built it.

    Why: the replay refuses a tier of another size than asked (`offload_worker.check_tier_blocks`).
    Checked on 0.32, 0.33, 0.34.
    """
    manager, config = tier_scheduler.manager, tier_scheduler.config
    # vLLM internal: CPUOffloadingManager._num_chunks, SchedulerOffloadConfig.blocks_per_chunk
    return int(manager._num_chunks), int(config.blocks_per_chunk)


@dataclass(frozen=True)
class OffloadTransfers:
    """A step's transfers, as the connector planned them for its worker half.

    Attributes:
        loads / stores: job id -> (request id, GPU blocks of the job's GPU-side spec: a load's
            destination, a store's source).
        flush: ids of the store jobs the step must wait for (a GPU block they read is reused).
    """

    loads: dict[int, tuple[str, int]]
    stores: dict[int, tuple[str, int]]
    flush: frozenset[int]


def offload_transfers(metadata: Any) -> OffloadTransfers:
    """The transfers of a step's `OffloadingConnectorMetadata` (None: none).

    Why: the replay times the worker's copies by their size in blocks (`offload_sim`). The
    metadata is the connector's private message from its scheduler half to its worker half.
    Checked on 0.32, 0.33, 0.34.
    """
    if metadata is None:
        return OffloadTransfers({}, {}, frozenset())
    # vLLM internal: OffloadingConnectorMetadata.load_jobs / store_jobs / jobs_to_flush
    # vLLM internal: TransferJob.req_id / src_spec / dst_spec, BlockIDsLoadStoreSpec.block_ids
    return OffloadTransfers(
        loads={i: (job.req_id, len(job.dst_spec.block_ids))
               for i, job in metadata.load_jobs.items()},
        stores={i: (job.req_id, len(job.src_spec.block_ids))
                for i, job in metadata.store_jobs.items()},
        flush=frozenset(metadata.jobs_to_flush or ()),
    )


def offload_worker_output(loads: Iterable[tuple[int, str, int, float]],
                          stores: Iterable[tuple[int, str, int, float]]) -> Any:
    """The offloading worker's `KVConnectorOutput` for finished jobs.

    Why: the replay's stand-in worker reports in the connector's own types, so vLLM's scheduler
    half completes its jobs as on a GPU. Checked on 0.32, 0.33, 0.34.

    Args:
        loads / stores: (job id, request id, bytes, seconds) of each finished job.

    Returns:
        Loads' request ids as `finished_recving` (None: no load), every job in
        `OffloadingWorkerMetadata.completed_jobs` (count 1: one worker) with vLLM's transfer
        stats; stores never appear in `finished_sending` (vLLM's `get_finished`).
    """
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        OffloadingWorkerMetadata,
    )
    from vllm.v1.outputs import KVConnectorOutput

    meta = OffloadingWorkerMetadata()
    # vLLM internal: OffloadingWorkerMetadata.mark_completed / transfer_stats,
    # TransferStats.load / store, DirectionalTransferStats.record
    for job_id, _, num_bytes, seconds in stores:
        meta.mark_completed(job_id)
        meta.transfer_stats.store.record(num_bytes, seconds)
    recving = set()
    for job_id, req_id, num_bytes, seconds in loads:
        meta.mark_completed(job_id)
        meta.transfer_stats.load.record(num_bytes, seconds)
        recving.add(req_id)
    return KVConnectorOutput(finished_recving=recving or None, kv_connector_worker_meta=meta)


def finished_request_ids(scheduler: Scheduler) -> set[str]:
    """The ids of requests finished since the last `schedule()`, which that call hands to the
    KV connector (and then replaces by a new empty set).

    Why: the replay's tier makes the connector's walk over them follow finish order, not
    Python's string hashing (`offload_worker.order_finished_ids`). Checked on 0.32, 0.33, 0.34.
    """
    return scheduler.finished_req_ids  # vLLM internal: Scheduler.finished_req_ids


def set_finished_request_ids(scheduler: Scheduler, ids: set[str]) -> None:
    """Replace what `finished_request_ids` reads (a `set` subclass: vLLM only adds to it)."""
    scheduler.finished_req_ids = ids  # vLLM internal: Scheduler.finished_req_ids
