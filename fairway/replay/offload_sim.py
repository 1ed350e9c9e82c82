"""The worker half of vLLM's CPU KV-offload tier, on the replay's virtual clock.

vLLM's `--kv-offloading-size GiB` installs the `OffloadingConnector`. Its scheduler half runs as
shipped inside the replay's engine: it finds tier hits, plans loads and stores, and says which
stores must be flushed before a GPU block is reused (`OffloadingConnectorMetadata`). Its worker
half copies KV between GPU and host memory, which a replay without a GPU cannot do. This module
stands in for that half only, and only for the time it takes: `TierTransfers` takes each step's
metadata and answers with the `KVConnectorOutput` the worker would report.

The protocol it follows (vLLM 0.32: `offloading/worker.py`, `kv_offload/cpu/gpu_worker.py`):

- Two directions, each a FIFO: a transfer's CUDA stream waits for the previous transfer of its
  direction (`SingleDirectionOffloadingHandler`), and the two directions run side by side
  (loads host-to-device, stores device-to-host: PCIe is full duplex).
- A step's stores are deferred to the start of the next step (`prepare_store_kv`: so that they
  do not delay the sampled tokens' copies); stores named in `jobs_to_flush` are submitted at the
  start of the step that names them, behind the deferred ones, and the step waits for them
  (`handle_preemptions` -> `worker.wait`) before its forward pass.
- Loads are submitted at the start of their step, after that wait (`start_kv_transfers`); the
  request is not in the step (it waits in `WAITING_FOR_REMOTE_KVS`).
- Completions are polled at the end of every step, empty ones too (`get_finished`): loads come
  back as `finished_recving`, every job in `OffloadingWorkerMetadata.completed_jobs`; stores
  never appear in `finished_sending`.

A job takes tokens x `LoadCost.kv_bytes_per_token` / the direction's rate; its tokens are the
GPU blocks of its GPU-side spec (a load's destination, a store's source) x the block size.

Imports no vLLM (only `fairway/vllm` may): what reads or builds vLLM's objects is in
`fairway.vllm.internals` (a step's transfers, the worker's report), imported where it is used, as
`fairway.replay.sim` does.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fairway.errors import FairwayConfigError

if TYPE_CHECKING:
    from fairway.profiling.load_cost import LoadCost


# --- sizing ---------------------------------------------------------------------------------------


def blocks_for_gib(gib: float, cost: LoadCost, block_size: int) -> int:
    """Tier blocks that `gib` GiB of host memory holds at the model's KV bytes per token.

    Raises:
        FairwayConfigError: `gib` is not a finite number > 0, or holds less than one block.
    """
    if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not (
        math.isfinite(gib) and gib > 0
    ):
        raise FairwayConfigError(f"--kv-offloading-size must be a number of GiB > 0, got {gib!r}")
    blocks = math.floor(gib * cost.tokens_per_gib() / block_size)
    if blocks < 1:
        raise FairwayConfigError(
            f"--kv-offloading-size {gib!r} GiB holds no block of {block_size} tokens "
            f"({cost.kv_bytes_per_token * block_size:,} bytes at {cost.kv_bytes_per_token:,} KV "
            "bytes per token)"
        )
    return blocks


def gib_of_blocks(blocks: int, cost: LoadCost, block_size: int) -> float:
    """The GiB of host memory `blocks` tier blocks take at the model's KV bytes per token."""
    return blocks * block_size / cost.tokens_per_gib()


# --- the worker half ------------------------------------------------------------------------------


@dataclass(slots=True)
class TierCounters:
    """Totals of one replay's tier traffic (virtual seconds)."""

    loads: int = 0
    stores: int = 0
    loaded_tokens: int = 0
    stored_tokens: int = 0
    #: Seconds the links were busy with loads / stores (queueing not counted).
    load_s: float = 0.0
    store_s: float = 0.0
    #: Steps that waited for flushed stores, and how long they waited in all.
    flushes: int = 0
    flush_wait_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "loads": self.loads, "stores": self.stores,
            "loaded_tokens": self.loaded_tokens, "stored_tokens": self.stored_tokens,
            "load_s": self.load_s, "store_s": self.store_s,
            "flushes": self.flushes, "flush_wait_s": self.flush_wait_s,
        }


@dataclass(slots=True)
class _Transfer:
    job_id: int
    req_id: str
    tokens: int
    seconds: float
    end_s: float


@dataclass(slots=True)
class _Channel:
    """One copy direction: jobs run one after the other, in submission order."""

    seconds_per_token: float
    queue: deque[_Transfer] = field(default_factory=deque)
    free_at: float = 0.0

    def submit(self, job_id: int, req_id: str, tokens: int, now: float) -> _Transfer:
        seconds = tokens * self.seconds_per_token
        start = max(now, self.free_at)
        job = _Transfer(job_id, req_id, tokens, seconds, start + seconds)
        self.free_at = job.end_s
        self.queue.append(job)
        return job

    def done_by(self, when: float) -> list[_Transfer]:
        """Pop the jobs finished by `when` (a FIFO's are finished in order)."""
        done = []
        while self.queue and self.queue[0].end_s <= when:
            done.append(self.queue.popleft())
        return done

    def end_of(self, job_ids: Iterable[int]) -> float | None:
        """When the last of those still queued finishes (None: none is)."""
        wanted = set(job_ids)
        ends = [job.end_s for job in self.queue if job.job_id in wanted]
        return max(ends, default=None)


class TierTransfers:
    """The offloading worker's copies, timed on the virtual clock (see the module docstring).

    Per engine step: `start_step(metadata, now)` when the step's `schedule()` has run (returns
    the seconds the step waits for flushed stores), then `finish_step(end)` when it ends (what
    the worker reports at that time). Between steps, `next_completion()` says when a poll would
    next find something and `pending` whether any job is still unreported.

    Attributes:
        counters: totals of the traffic.
        loaded_by_request: tokens each request got from the tier (summed over its loads).
    """

    def __init__(self, cost: LoadCost, block_size: int) -> None:
        if block_size < 1:
            raise FairwayConfigError(f"block_size must be >= 1, got {block_size}")
        self.cost = cost
        self.block_size = block_size
        self._loads = _Channel(cost.load_s(1))
        self._stores = _Channel(cost.store_s(1))
        #: Stores of the last step, (job id, (request id, GPU blocks)), submitted at the start
        #: of the next.
        self._deferred: list[tuple[int, tuple[str, int]]] = []
        self.counters = TierCounters()
        self.loaded_by_request: dict[str, int] = {}

    @property
    def pending(self) -> bool:
        """Jobs not yet reported: queued, in flight, finished but unpolled, or deferred."""
        return bool(self._loads.queue or self._stores.queue or self._deferred)

    def next_completion(self) -> float | None:
        """When the next submitted job finishes (None: none is submitted; deferred stores
        start with the next step)."""
        heads = [ch.queue[0].end_s for ch in (self._loads, self._stores) if ch.queue]
        return min(heads, default=None)

    def start_step(self, metadata: Any, now: float) -> float:
        """Submit the step's transfers at `now`; returns the seconds its flush wait takes.

        Args:
            metadata: the step's `OffloadingConnectorMetadata` (`load_jobs`, `store_jobs`:
                job id -> `TransferJob(req_id, src_spec, dst_spec)`; `jobs_to_flush`), or None.
            now: when the step's `schedule()` ran.
        """
        from fairway.vllm import internals

        transfers = internals.offload_transfers(metadata)
        store_jobs = dict(transfers.stores)
        flush = transfers.flush
        submit = self._deferred + [(job_id, store_jobs.pop(job_id))
                                   for job_id in sorted(flush) if job_id in store_jobs]
        self._deferred = sorted(store_jobs.items())
        for job_id, (req_id, blocks) in submit:
            tokens = blocks * self.block_size
            submitted = self._stores.submit(job_id, req_id, tokens, now)
            self.counters.stores += 1
            self.counters.stored_tokens += tokens
            self.counters.store_s += submitted.seconds
        delay = 0.0
        if flush:
            ends = [end for end in (self._stores.end_of(flush), self._loads.end_of(flush))
                    if end is not None]
            delay = max(0.0, max(ends, default=now) - now)
            if delay > 0.0:
                self.counters.flushes += 1
                self.counters.flush_wait_s += delay
        for job_id, (req_id, blocks) in sorted(transfers.loads.items()):
            tokens = blocks * self.block_size
            submitted = self._loads.submit(job_id, req_id, tokens, now + delay)
            self.counters.loads += 1
            self.counters.loaded_tokens += tokens
            self.counters.load_s += submitted.seconds
            self.loaded_by_request[req_id] = self.loaded_by_request.get(req_id, 0) + tokens
        return delay

    def finish_step(self, now_end: float) -> Any:
        """The worker's report at the end of a step: a vLLM `KVConnectorOutput` of every job
        finished by `now_end` (None: nothing finished)."""
        loads = self._loads.done_by(now_end)
        stores = self._stores.done_by(now_end)
        if not loads and not stores:
            return None
        from fairway.vllm import internals

        def rows(jobs: Iterable[_Transfer]) -> list[tuple[int, str, int, float]]:
            per_token = self.cost.kv_bytes_per_token
            return [(j.job_id, j.req_id, j.tokens * per_token, j.seconds) for j in jobs]

        return internals.offload_worker_output(rows(loads), rows(stores))
