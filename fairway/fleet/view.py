"""The router's delayed view of the nodes: load figures and KV events, each as late as it arrives.

A node publishes its `NodeLoad` and its KV events at the end of each of its steps; the router reads
the loads `metrics_delay_s` later (a scrape interval) and the events `kv_event_delay_s` later (ZMQ
and its own indexing). `DelayedView` holds what was published and hands the router, at each
arrival, only what had reached it by then (`advance(now)` first): it is the `FleetView` of
`fairway.fleet.routing`. Why a heap per kind: nodes step out of time order relative to each
other (each runs ahead to the arrival it waits for), so publications come in out of order; the
heap delivers them in order of arrival at the router.

KV events are kept only for a router that reads them: one that has not called `kv_events_since`
by the end of its first `route` never gets any (the replay stops collecting them: a fleet of
32 nodes emits millions), and a later call is a `FleetError`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from itertools import count

from fairway.errors import FairwayError
from fairway.fleet.routing import FleetSignals, KVEvent, NodeLoad


class FleetError(FairwayError, ValueError):
    """A fleet replay that cannot run as asked: a bad fleet size, a router's bad answer, or a
    router that starts reading KV events late."""


def idle_load(node: int, total_blocks: int, published_s: float) -> NodeLoad:
    """The figures of a node with nothing to do (what a node shows before its first step)."""
    return NodeLoad(node=node, published_s=published_s, waiting_requests=0, running_requests=0,
                    kv_usage=0.0, active_blocks=0, queued_uncached_tokens=0,
                    total_blocks=total_blocks)


def _arrived(now: float, published: float, delay: float) -> bool:
    """Whether something published at `published` has reached the router by `now`, checked as
    the age a router would compute (`now - published >= delay`), not as a sum that rounds."""
    return now - published >= delay


class DelayedView:
    """The `FleetView` a router reads: each node's newest load figures published at least
    `metrics_delay_s` ago, and the KV events delivered by now, `kv_event_delay_s` after the
    step that emitted them.

    Each node starts with its idle figures, published `metrics_delay_s` before the trace starts
    (the router knows the nodes it was configured with, and that they are idle).
    """

    def __init__(self, total_blocks: Sequence[int], signals: FleetSignals,
                 stop_events: Callable[[], None] | None = None) -> None:
        self.signals = signals
        self.now = 0.0
        self._visible = [idle_load(k, blocks, -signals.metrics_delay_s)
                         for k, blocks in enumerate(total_blocks)]
        self._seq = count()
        self._loads: list[tuple[float, int, NodeLoad]] = []
        self._events: list[tuple[float, int, int, float, list[tuple[int, bool]]]] = []
        #: Delivered events not read yet; `_base` is the cursor of the first.
        self._log: list[KVEvent] = []
        self._base = 0
        #: None until the router's first route ends; then whether it reads KV events.
        self.reads_events: bool | None = None
        self._stop_events = stop_events

    # --- the FleetView protocol -------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        return len(self._visible)

    def loads(self) -> Sequence[NodeLoad]:
        """Each node's newest figures published at least `metrics_delay_s` before now."""
        return tuple(self._visible)

    def kv_events_since(self, cursor: int) -> tuple[Sequence[KVEvent], int]:
        """The KV events delivered since `cursor` (0 at the start), oldest first, and the next
        cursor. Events before `cursor` are dropped: pass the cursor of the last call."""
        if self.reads_events is False:
            raise FleetError(
                "the router read KV events for the first time after its first route; a router "
                "that reads them must read them from its first route on (the replay stopped "
                "collecting them there)"
            )
        if self.reads_events is None:
            self.reads_events = True
        if not self._base <= cursor <= self._base + len(self._log):
            raise FleetError(
                f"KV event cursor {cursor} is outside the events kept ({self._base}.."
                f"{self._base + len(self._log)}); pass the cursor the last call returned"
            )
        fresh = self._log[cursor - self._base:]
        self._log, self._base = fresh, cursor
        return tuple(fresh), cursor + len(fresh)

    # --- the replay's side ------------------------------------------------------------------------

    def publish_load(self, load: NodeLoad) -> None:
        """A node's figures at the end of its step (visible `metrics_delay_s` later)."""
        visible_at = load.published_s + self.signals.metrics_delay_s
        heapq.heappush(self._loads, (visible_at, next(self._seq), load))

    def publish_events(self, node: int, time_s: float, events: list[tuple[int, bool]]) -> None:
        """A node's KV events of the step that ended at `time_s`: (block key, stored) pairs."""
        if events and self.reads_events is not False:
            heapq.heappush(self._events, (time_s + self.signals.kv_event_delay_s,
                                          next(self._seq), node, time_s, events))

    def advance(self, now: float) -> None:
        """Deliver everything that reached the router by `now` (never moves back)."""
        self.now = max(self.now, now)
        now = self.now
        loads, metrics_delay = self._loads, self.signals.metrics_delay_s
        while loads and loads[0][0] <= now and _arrived(now, loads[0][2].published_s,
                                                         metrics_delay):
            load = heapq.heappop(loads)[2]
            self._visible[load.node] = load  # per node in publishing order: the newest last
        events, kv_delay, log = self._events, self.signals.kv_event_delay_s, self._log
        while events and events[0][0] <= now and _arrived(now, events[0][3], kv_delay):
            _, _, node, time_s, pairs = heapq.heappop(events)
            log.extend(KVEvent(node, time_s, key, stored) for key, stored in pairs)

    def first_route_done(self) -> None:
        """After the router's first route: a router that has not read KV events by now never
        will; stop keeping them (and tell the nodes to stop collecting them)."""
        if self.reads_events is not None:
            return
        self.reads_events = False
        self._events.clear()
        self._log.clear()
        if self._stop_events is not None:
            self._stop_events()
