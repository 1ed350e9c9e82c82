"""The vLLM side of the virtual replay's CPU offload tier (`fairway.replay.offload_sim`).

`offload_sim.TierTransfers` times the offloading worker's copies without vLLM; this module builds
what the offline engine needs for the tier: the `kv_transfer_config` of a tier of N blocks, the
check that vLLM built that tier, a step's connector metadata, and an order for the ids of the
requests that finish between steps. The connector's fields are not a public API: every one this
module reads or writes goes through `fairway.vllm.internals` (its `offload` topic), as do a
step's transfers (`internals.offload_transfers`) and the worker's report in vLLM's own types
(`internals.offload_worker_output`), which `offload_sim` calls.

Imports no vLLM itself (`internals` does, inside the functions that need its classes), so that
importing it stays cheap.
"""

from __future__ import annotations

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
    return {
        "kv_connector": CONNECTOR,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "cpu_bytes_to_use": blocks * internals.offload_alignment_bytes(),
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
    chunks, per_chunk = internals.offload_tier_chunks(tier_scheduler(scheduler))
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
    current = internals.finished_request_ids(scheduler)
    if isinstance(current, FinishOrder):
        return
    replacement = FinishOrder()
    for request_id in sorted(current):
        replacement.add(request_id)
    internals.set_finished_request_ids(scheduler, replacement)
