"""The vLLM side of the virtual replay's CPU offload tier (`fairway.replay.offload_sim`).

`offload_sim.TierTransfers` times the offloading worker's copies without vLLM; this module is the
part that touches vLLM: the `kv_transfer_config` of a tier of N blocks in the offline engine, the
check that vLLM built that tier, a step's connector metadata, the size of a transfer spec, and the
worker's report in vLLM's own types. The connector's fields are not a public API: each access is
tagged `# vLLM internal:` (as in `fairway.vllm.internals`, which other code owns).

Imports vLLM only inside the functions that need its classes, so that importing it stays cheap.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fairway.errors import FairwayConfigError
from fairway.vllm import internals

#: vLLM's `kv_connector` name of the CPU tier (what `--kv-offloading-size` selects).
CONNECTOR = "OffloadingConnector"


def transfer_config(blocks: int) -> dict[str, Any]:
    """vLLM's `kv_transfer_config` of a CPU tier of `blocks` blocks in the offline engine.

    vLLM sizes the tier in bytes (`cpu_bytes_to_use`) and divides by its bytes per chunk, aligned
    up to `SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT`. The offline engine's fake KV spec has far
    fewer bytes per block than that alignment (8 x block size), so one aligned unit per block
    asks for exactly `blocks` chunks; `check_tier_blocks` verifies it after the build.
    """
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
        raise FairwayConfigError(f"the offload tier needs an integer >= 1 of blocks: {blocks!r}")
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

    return {
        "kv_connector": CONNECTOR,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            # vLLM internal: SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT
            "cpu_bytes_to_use": blocks * SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT,
        },
    }


def tier_scheduler(scheduler: Any) -> Any:
    """The engine's `OffloadingConnectorScheduler`.

    Raises:
        FairwayConfigError: the engine has no offloading connector.
    """
    connector = internals.kv_connector(scheduler)
    tier = internals.offloading_scheduler(connector)
    if tier is None:
        raise FairwayConfigError(f"the replay's engine has no {CONNECTOR} (got {connector!r})")
    return tier


def check_tier_blocks(scheduler: Any, blocks: int) -> None:
    """Refuse an engine whose tier does not hold exactly `blocks` blocks (one block per chunk).

    Raises:
        FairwayConfigError: another chunk count, or chunks of several blocks.
    """
    tier = tier_scheduler(scheduler)
    # vLLM internal: CPUOffloadingManager._num_chunks, SchedulerOffloadConfig.blocks_per_chunk
    chunks = tier.manager._num_chunks
    per_chunk = tier.config.blocks_per_chunk
    if chunks != blocks or per_chunk != 1:
        raise FairwayConfigError(
            f"vLLM built an offload tier of {chunks!r} chunks of {per_chunk} blocks, not "
            f"{blocks} blocks: the offline engine's KV bytes per block no longer fit one "
            "BLOCK_SIZE_ALIGNMENT unit (fairway.vllm.offload_worker.transfer_config)"
        )


def step_metadata(scheduler_output: Any) -> Any:
    """The connector's plan for a step (`OffloadingConnectorMetadata`: `load_jobs`,
    `store_jobs`, `jobs_to_flush`), as `schedule()` attached it to its output."""
    return scheduler_output.kv_connector_metadata


def spec_blocks(spec: Any) -> int:
    """GPU blocks of a transfer's GPU-side `GPULoadStoreSpec`."""
    return len(spec.block_ids)  # vLLM internal: BlockIDsLoadStoreSpec.block_ids


def worker_output(loads: Iterable[tuple[int, str, int, float]],
                  stores: Iterable[tuple[int, str, int, float]]) -> Any:
    """The offloading worker's `KVConnectorOutput` for finished jobs.

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
    for job_id, _, num_bytes, seconds in stores:
        meta.mark_completed(job_id)
        meta.transfer_stats.store.record(num_bytes, seconds)
    recving = set()
    for job_id, req_id, num_bytes, seconds in loads:
        meta.mark_completed(job_id)
        meta.transfer_stats.load.record(num_bytes, seconds)
        recving.add(req_id)
    return KVConnectorOutput(finished_recving=recving or None, kv_connector_worker_meta=meta)


class FinishOrder(set[str]):
    """A set of request ids that iterates in the order they were added.

    vLLM's connector walks `SchedulerOutput.finished_req_ids` (a plain `set[str]`) to create the
    finished requests' last store jobs, and job ids follow that walk: with a plain set, the
    stores' FIFO order, hence flush waits and the tier's LRU order, would follow Python's string
    hash seed, and two processes would replay one trace differently. The engine only `add`s to
    it between steps; any id that arrived another way is iterated after those, sorted.
    """

    def __init__(self) -> None:
        super().__init__()
        self._order: dict[str, None] = {}

    def add(self, request_id: str) -> None:
        super().add(request_id)
        self._order.setdefault(request_id, None)

    def __iter__(self) -> Any:
        ordered = [r for r in self._order if set.__contains__(self, r)]
        rest = sorted(set(set.__iter__(self)) - set(ordered))
        return iter(ordered + rest)


def order_finished_ids(scheduler: Any) -> None:
    """Give the scheduler a `FinishOrder` for the ids that finish before its next `schedule()`
    (which hands it to the connector and starts a new plain set: call this after each)."""
    current = scheduler.finished_req_ids  # vLLM internal: Scheduler.finished_req_ids
    if isinstance(current, FinishOrder):
        return
    replacement = FinishOrder()
    for request_id in sorted(current):
        replacement.add(request_id)
    scheduler.finished_req_ids = replacement
