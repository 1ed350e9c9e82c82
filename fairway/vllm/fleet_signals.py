"""What a node of the fleet replay publishes: its load figures and vLLM's KV cache events.

A real router sees a node through `/metrics` (queue lengths, KV usage) and, for the KV-aware ones,
through the node's KV events over ZMQ. The fleet replay (`fairway.fleet`) builds both from each
node's engine at the end of each of its steps: `load_figures` reads the figures (Fairway's exported
queue work among them), `KVEventSink` takes the events vLLM's scheduler publishes, and
`block_keys` gives a request's blocks under the keys those events carry. Why here: these read
vLLM's objects (through `fairway.vllm.internals`), which only `fairway/vllm` may.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from vllm.distributed.kv_events import BlockRemoved, BlockStored, EventBatch, EventPublisher

from fairway.vllm import internals

if TYPE_CHECKING:
    from vllm.v1.request import Request

    from fairway.vllm.scheduler import FairwayScheduler


class KVEventSink(EventPublisher):
    """vLLM's publisher interface, collecting instead of sending: each step's `BlockStored` and
    `BlockRemoved` events as (block key, stored) pairs, in the order vLLM recorded them, until
    `take` hands them over (the fleet replay stamps them with the step's end).

    `enabled` False drops every batch at once (a router that reads no events: nothing is kept).
    vLLM's `AllBlocksCleared` (a prefix-cache reset, which a replay never asks for) is dropped.
    """

    def __init__(self) -> None:
        super().__init__(data_parallel_rank=0)
        self.enabled = True
        self._pending: list[tuple[int, bool]] = []

    def publish(self, events: EventBatch) -> None:
        if not self.enabled:
            return
        key = internals.event_block_key
        pending = self._pending
        for event in events.events:
            if isinstance(event, BlockStored):
                pending.extend((key(h), True) for h in event.block_hashes)
            elif isinstance(event, BlockRemoved):
                pending.extend((key(h), False) for h in event.block_hashes)

    def shutdown(self) -> None:
        """Nothing to close: no socket, no thread."""

    def take(self) -> list[tuple[int, bool]]:
        """The events collected since the last call, oldest first."""
        taken, self._pending = self._pending, []
        return taken


def capture_kv_events(scheduler: FairwayScheduler) -> KVEventSink:
    """Put a `KVEventSink` where the scheduler publishes its KV events (built with
    `kv_events=True`, `fairway.vllm.offline_vllm.engine_configs`) and return it."""
    sink = KVEventSink()
    internals.set_kv_event_publisher(scheduler, sink)
    return sink


def stop_kv_events(scheduler: FairwayScheduler, sink: KVEventSink) -> None:
    """No more KV events from this node: vLLM stops recording them (they cost it a Python
    object per block) and the sink drops what it holds."""
    internals.stop_kv_events(scheduler)
    sink.enabled = False
    sink.take()


def block_keys(request: Request) -> tuple[int, ...]:
    """The keys of a request's full blocks, as its node's KV events name them (`Request.
    block_hashes`, vLLM's chained hashes, one per full block of `block_size` tokens)."""
    key = internals.event_block_key
    return tuple(key(h) for h in request.block_hashes)


class LoadFigures(TypedDict):
    """`fairway.fleet.routing.NodeLoad`'s engine figures (its docstring says what each is)."""

    waiting_requests: int
    running_requests: int
    kv_usage: float
    active_blocks: int
    queued_uncached_tokens: int
    total_blocks: int


def load_figures(scheduler: FairwayScheduler) -> LoadFigures:
    """The node's load figures now, as its `/metrics` would show them: the fields of
    `fairway.fleet.routing.NodeLoad` but the node's index and the time, which the fleet adds
    (this package sits below `fairway.fleet` and does not import it)."""
    running, waiting = scheduler.get_request_counts()
    usable = internals.usable_blocks(scheduler)
    return LoadFigures(
        waiting_requests=waiting,
        running_requests=running,
        kv_usage=internals.kv_usage(scheduler),
        active_blocks=usable - internals.free_blocks(scheduler),
        # Fairway's exported queue work, as `fairway:queued_uncached_tokens` measures it
        queued_uncached_tokens=scheduler.fairway_prepass.queued_uncached_tokens(),
        total_blocks=usable,
    )
