"""The scheduler's KV cache events: where each step's batch goes, and the keys they carry.

Why: the fleet replay's routers learn where prefixes are cached from vLLM's own KV events, as
vLLM's router (`kv_aware`) and Dynamo's KV router do over ZMQ. With KV events on, vLLM's block pool
records a `BlockStored` for the full blocks it caches and a `BlockRemoved` for each one it evicts;
`Scheduler.update_from_output` takes them at the end of every step and hands them, as one
`KVEventBatch`, to its publisher. The replay puts its own publisher there
(`fairway.vllm.fleet_signals.KVEventSink`) instead of a ZMQ socket. The events are vLLM's public
wire format; which object publishes them is not.

Not in the start-up check lists: only the fleet replay swaps the publisher (and turns the
events off when its router reads none), never a server
(tests/integration/test_internals_markers.py, `UNCHECKED`). Tests: the events a step publishes
carry the keys of the request's blocks, tests/integration/test_fleet_replay.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fairway.vllm.internals.kv_cache import block_pool

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler

#: The low 64 bits of a block hash: what vLLM's KV events carry for it.
_KEY_MASK = (1 << 64) - 1


def set_kv_event_publisher(scheduler: Scheduler, publisher: Any) -> None:
    """Hand the scheduler's KV event batches to `publisher` (a vLLM `EventPublisher`) from now on.

    The scheduler builds its publisher in `__init__` from `--kv-events-config` (the null one
    here: nothing to bind) and calls its `publish(batch)` once per step with events.
    """
    scheduler.kv_event_publisher = publisher  # vLLM internal: Scheduler.kv_event_publisher


def stop_kv_events(scheduler: Scheduler) -> None:
    """Stop vLLM recording KV events from now on (nobody reads them): its block pool checks
    `enable_kv_cache_events` at every block it caches or evicts, and builds each event (hash
    conversion, token slices, an environment read per block) only when it is set. The events
    recorded so far are dropped."""
    pool = block_pool(scheduler)
    pool.take_events()
    pool.enable_kv_cache_events = False  # vLLM internal: BlockPool.enable_kv_cache_events


def event_block_key(block_hash: bytes | int) -> int:
    """A block's key as a KV event carries it, from the hash a request holds (bytes) or from an
    event's (an int, or bytes when vLLM is told to send them).

    vLLM's `maybe_convert_block_hash` turns a hash into the integer of its low 64 bits (read
    big-endian) under its default `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`, else sends the bytes;
    both become that integer here, so a request's keys and its node's events compare equal
    either way.
    """
    if isinstance(block_hash, int):
        return block_hash
    # vLLM internal: maybe_convert_block_hash (the low 64 bits of the hash, big-endian)
    return int.from_bytes(block_hash, "big") & _KEY_MASK
