"""One node of the fleet replay: an `EngineNode` (the single replay's stepping unit) and what it
publishes to the router at the end of each step.

Each node is vLLM's Scheduler (Fairway's class, its own policy instance), its own KV cache and its
own virtual clock. The fleet's event loop (`fairway.fleet.replay`) adds requests to it and steps
it; after each step the node publishes its `NodeLoad` and the KV events vLLM recorded during the
step, both stamped with the step's end on the node's clock. Must not import vllm (only
`fairway/vllm` may): the engine side is `fairway.vllm.fleet_signals`, imported where used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fairway.fleet.routing import NodeLoad
from fairway.replay.sim_loop import EngineNode

if TYPE_CHECKING:
    from fairway.vllm.fleet_signals import KVEventSink


class FleetNode:
    """A node of the fleet: its engine, and its signals to the router.

    Attributes:
        index: the node's number in the fleet (0..N-1), as routers name it.
        engine: the engine (scheduler, clock, cost model), stepped by `EngineNode.turn`.
        sink: where vLLM's scheduler publishes its KV events (None: events off).
        stalled: the engine could not schedule anything twice in a row; it waits for a new
            request (`add`), as a single replay's engine waits for the next release.
    """

    def __init__(self, index: int, engine: EngineNode, sink: KVEventSink | None) -> None:
        self.index = index
        self.engine = engine
        self.sink = sink
        self.stalled = False

    @property
    def now(self) -> float:
        """The node's clock: when its next step starts."""
        return self.engine.clock.now

    @property
    def busy(self) -> bool:
        """Whether the node holds a request it has not finished."""
        return self.engine.busy

    @property
    def runnable(self) -> bool:
        """Whether the node has a step to take: busy and not stalled."""
        return self.busy and not self.stalled

    def add(self, request: Any, now: float) -> None:
        """Hand the node a request routed to it at `now`. A node without a step to take (idle,
        or stalled) moves its clock to `now` first, as an idle engine jumps to the next
        arrival; a busy one gets it between its steps."""
        if not self.runnable:
            self.engine.clock.jump_to(max(self.now, now))
            self.stalled = False
        self.engine.add(request)

    def turn(self) -> None:
        """One step of the engine (`EngineNode.turn`); a second step in a row that scheduled
        nothing marks the node stalled."""
        if not self.engine.turn():
            self.stalled = True

    def load(self) -> NodeLoad:
        """The node's load figures now (the end of its last step)."""
        from fairway.vllm.fleet_signals import load_figures

        return NodeLoad(node=self.index, published_s=self.now,
                        **load_figures(self.engine.scheduler))

    def take_events(self) -> list[tuple[int, bool]]:
        """The KV events of the steps since the last call: (block key, stored) pairs."""
        return [] if self.sink is None else self.sink.take()

    def stop_events(self) -> None:
        """Collect no more KV events (the router reads none); vLLM stops recording them."""
        from fairway.vllm.fleet_signals import stop_kv_events

        if self.sink is not None:
            stop_kv_events(self.engine.scheduler, self.sink)
