"""The fleet replay: N prefill nodes behind a router, on one virtual-clock event loop.

Each node is what a single `fairway bench` replay runs (`fairway.replay.sim_loop.EngineNode`):
vLLM's real Scheduler (Fairway's class, its own policy instance), its own KV cache and its own
virtual clock. One event loop advances them in time order: before a request is routed at time t
(its arrival, or a closed-loop session turn's release), every node whose next step starts before
t takes it, the nodes in order of their clocks; a node with nothing to do jumps to the time of
the request it is given. The router (`fairway.fleet.routing.Router`) sees only a
`DelayedView`: the nodes' load figures and KV events as published at their step ends and
delivered late (`FleetSignals`), and it is told when a node answers (first token) or fails each
request it routed, at that time.

`fleet_replay` is the API (the capacity-at-SLO search builds on it; its arguments and
`FleetResult` are kept stable). With one node and any router it replays exactly what
`fairway.replay.sim.replay` does, field for field.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Mapping
from itertools import count
from typing import TYPE_CHECKING, Any

from fairway.fleet.node import FleetNode
from fairway.fleet.result import FleetResult, fleet_settings, node_stats
from fairway.fleet.routing import FleetSignals, RoutedRequest, Router
from fairway.fleet.view import DelayedView, FleetError
from fairway.options import FairwayOptions
from fairway.profiling.table import PrefillProfile
from fairway.replay.engine_sizing import (
    DEFAULT_BATCHED_TOKENS,
    DEFAULT_CACHE_FRACTION,
    DEFAULT_MAX_NUM_SEQS,
    CacheSizing,
    check_prompt_lengths,
    size_cache,
)
from fairway.replay.results import ReplayResult, default_trace_name
from fairway.replay.sessions import Releases, arrivals_setting
from fairway.replay.sim import engine_settings, engine_setup
from fairway.replay.sim_loop import EngineNode, Recorder, VirtualClock, abort_unanswered, drain

if TYPE_CHECKING:
    from fairway.traces.format import Trace

logger = logging.getLogger(__name__)

#: The result tag naming the node a request ran on (its index in the fleet).
NODE_TAG = "node"
#: The router's delays unless told otherwise (`FleetSignals`'s defaults).
DEFAULT_SIGNALS = FleetSignals()


def fleet_replay(
    trace: Trace,
    policy: str | FairwayOptions,
    *,
    num_nodes: int,
    router: str | Router,
    router_params: Mapping[str, Any] | None = None,
    signals: FleetSignals = DEFAULT_SIGNALS,
    profile: PrefillProfile | str | None = None,
    policy_params: Mapping[str, Any] | None = None,
    num_blocks: int | None = None,
    cache_fraction: float = DEFAULT_CACHE_FRACTION,
    block_size: int = 16,
    max_num_batched_tokens: int = DEFAULT_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    step_overhead_s: float | None = None,
    fairway_options: Mapping[str, Any] | None = None,
    scheduling_policy: str | None = None,
    open_loop: bool = False,
    seed: int = 0,
    kv_events: bool = True,
    trace_name: str | None = None,
    progress: bool = False,
) -> FleetResult:
    """Replay `trace` on `num_nodes` prefill nodes under `policy`, routed by `router`.

    Args:
        trace: the workload, at the fleet's rate (`fairway.fleet.traces.fleet_trace` builds a
            preset at N x one node's capacity).
        policy: every node's ordering (registry name or `FairwayOptions`); each node builds
            its own policy object.
        num_nodes: nodes in the fleet (>= 1).
        router: a router registry name (`fairway.fleet.routers.make_router`, built with
            `num_nodes`, `seed` and `router_params`), or a router object (tests).
        router_params: the router's parameters (only with a name).
        signals: the delays with which the router sees the nodes' loads and KV events.
        profile, policy_params, step_overhead_s, fairway_options, scheduling_policy,
            block_size, max_num_batched_tokens, max_num_seqs, open_loop: as in
            `fairway.replay.sim.replay`, for every node.
        num_blocks: each node's KV cache in blocks; None: sized from the trace (`node_cache`).
            `fairway bench --nodes` passes the blocks a single replay of the preset at one
            node's rate gives its engine (`fairway.fleet.traces.node_blocks`).
        cache_fraction: without `num_blocks`, the share of the trace's reusable content the
            fleet's caches hold together: each node gets cache_fraction / num_nodes of it
            (never below the floor of `size_cache`); one node is sized as a single replay.
        seed: the router's seed (routers that draw at random).
        kv_events: turn vLLM's KV cache events on in every node (False: off; a router that
            reads them is then an error). Kept only for a router that reads them.
        trace_name: label in the result; None: `<preset or family>-seed<seed>`.
        progress: a tqdm bar of answered requests.

    Returns:
        The `FleetResult`: the fleet-wide `ReplayResult` (each request tagged with its node,
        `NODE_TAG`) and each node's figures.

    Raises:
        FleetError: fewer than one node, router parameters with a router object, or a router
            that answers a node outside 0..num_nodes-1.
        RouterError: an unknown router name or bad router parameters.
        TraceError: as `replay` (a prompt longer than the context, bad session tags).
    """
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise FleetError(f"a fleet needs an integer number of nodes >= 1, got {num_nodes!r}")
    check_prompt_lengths(trace, trace_name)  # before vLLM's import, as `replay`
    releases = Releases(trace.requests, open_loop=open_loop)
    the_router = _router(router, router_params, num_nodes, seed)
    started = time.perf_counter()
    setup = engine_setup(
        trace, policy, profile=profile, policy_params=policy_params,
        fairway_options=fairway_options, step_overhead_s=step_overhead_s,
        scheduling_policy=scheduling_policy, block_size=block_size,
    )
    sizing = node_cache(trace, num_nodes, cache_fraction, num_blocks, block_size,
                        max_num_batched_tokens)
    loop = FleetLoop(trace, releases, the_router, signals, block_size, progress)
    for _ in range(num_nodes):
        scheduler = setup.make_scheduler(
            num_blocks=sizing.num_blocks, block_size=block_size,
            max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
            kv_events=kv_events,
        )
        loop.add_node(scheduler, setup.cost, kv_events)
    loop.run()
    wall = time.perf_counter() - started
    engines = [node.engine for node in loop.nodes]
    settings = engine_settings(
        trace, setup.options.policy, engines[0].scheduler, setup.cost, sizing,
        sum(e.num_steps for e in engines), loop.recorder.num_preemptions,
    )
    arrivals = arrivals_setting(trace.requests, open_loop)
    if arrivals is not None:
        settings["arrivals"] = arrivals
    ref = setup.profile_ref
    settings["profile"] = ref if isinstance(ref, str) else "(PrefillProfile object)"
    requests = loop.recorder.results()
    for request, node in zip(requests, loop.node_of, strict=True):
        if node >= 0:
            request.tags[NODE_TAG] = node
    settings["fleet"] = fleet_settings(
        num_nodes, the_router.name, router_params, seed, signals, cache_fraction, kv_events,
        loop.view.reads_events,
    )
    simulated = max(e.clock.now for e in engines)
    fleet_wide = ReplayResult(
        policy=setup.options.policy,
        trace_name=trace_name or default_trace_name(trace),
        settings=settings,
        requests=requests,
        wall_s=wall,
        simulated_s=simulated,
    )
    result = FleetResult(
        replay=fleet_wide, router=the_router.name, num_nodes=num_nodes,
        nodes=node_stats(requests, [e.num_steps for e in engines], NODE_TAG),
    )
    logger.info(
        "fleet replay of %s on %d nodes (%s, %s): %d requests, %.1f simulated s in %.1f wall s, "
        "%d errors", fleet_wide.trace_name, num_nodes, the_router.name, fleet_wide.policy,
        len(requests), simulated, wall, fleet_wide.n_errors,
    )
    return result


def _router(router: str | Router, params: Mapping[str, Any] | None, num_nodes: int,
            seed: int) -> Router:
    """The router object: built from the registry for a name, else the given one."""
    if isinstance(router, str):
        from fairway.fleet.routers import make_router

        return make_router(router, num_nodes, seed, **dict(params or {}))
    if params:
        raise FleetError("router_params go with a router name, not with a router object")
    return router


def node_cache(trace: Trace, num_nodes: int, cache_fraction: float, num_blocks: int | None,
               block_size: int, max_num_batched_tokens: int) -> CacheSizing:
    """One node's KV cache: `num_blocks`, or cache_fraction / num_nodes of the trace's reusable
    content (the fleet together holds cache_fraction of it), never below `size_cache`'s floor."""
    return size_cache(
        trace, cache_fraction=cache_fraction / num_nodes, num_blocks=num_blocks,
        block_size=block_size, max_num_batched_tokens=max_num_batched_tokens,
    )


class FleetLoop:
    """The event loop: arrivals and releases routed in time order, node steps in between.

    Attributes:
        nodes: the fleet (`add_node` before `run`).
        recorder: every request's facts (one for the fleet; request ids are unique).
        node_of: the node each trace request was routed to (-1: never routed).
        view: the router's delayed view.
    """

    def __init__(self, trace: Trace, releases: Releases, router: Router,
                 signals: FleetSignals, block_size: int, progress: bool) -> None:
        from fairway.vllm.fleet_signals import block_keys  # lazy: imports vLLM

        self.requests = trace.requests
        self.releases = releases
        self.router = router
        self.block_size = block_size
        self.progress = progress
        self._block_keys = block_keys
        self.nodes: list[FleetNode] = []
        self.node_of = [-1] * len(trace.requests)
        self.recorder = Recorder(trace.requests, releases, on_resolved=self._resolved)
        self.view = DelayedView([], signals, stop_events=self._stop_events)
        self._signals = signals
        self._answers: list[tuple[float, int, int]] = []  # (when, seq, trace index)
        self._seq = count()
        self._runnable: list[tuple[float, int]] = []  # (node clock, node index)
        self._queued: list[bool] = []  # node index -> in `_runnable`
        #: Node index -> the end of its last step while its figures are not published yet
        #: (`_publish_loads`), and the same as a heap of (step end, node index).
        self._unpublished: list[float | None] = []
        self._unpublished_by_time: list[tuple[float, int]] = []
        self._routed = 0

    def add_node(self, scheduler: Any, cost: Any, kv_events: bool) -> None:
        """A node of the fleet over `scheduler` (built for it), with its own clock."""
        from fairway.vllm.fleet_signals import capture_kv_events

        clock = VirtualClock()
        scheduler.set_fairway_clock(clock)
        engine = EngineNode(scheduler, cost, clock, self.block_size, self.recorder,
                            self.releases.next_s)
        node = FleetNode(len(self.nodes), engine, capture_kv_events(scheduler)
                         if kv_events else None)
        self.nodes.append(node)
        self._queued.append(False)
        self._unpublished.append(None)

    def run(self) -> None:
        from tqdm import tqdm

        releases, runnable, nodes = self.releases, self._runnable, self.nodes
        self.view = DelayedView([node.load().total_blocks for node in nodes], self._signals,
                                stop_events=self._stop_events)
        bar = tqdm(total=len(self.requests), disable=not self.progress, unit="req",
                   desc="fleet replay", leave=False, mininterval=0.5)
        try:
            while True:
                release = releases.next_s()
                if runnable and (release is None or runnable[0][0] < release):
                    k = heapq.heappop(runnable)[1]
                    self._queued[k] = False
                    done_before = self.recorder.num_done
                    self._step(nodes[k])
                    bar.update(self.recorder.num_done - done_before)
                    continue
                if release is None:
                    break
                self._publish_loads(release)
                self._deliver(release)
                for i in releases.due(release):
                    self._route(i, release)
        finally:
            bar.close()
        self._publish_loads(float("inf"))
        end = max((node.now for node in nodes), default=0.0)
        if any(node.busy for node in nodes):  # stalled, and nothing left to wake them
            abort_unanswered(self.recorder, max(node.now for node in nodes if node.busy))
        drain(self.recorder, end)
        self._deliver(float("inf"))

    def _step(self, node: FleetNode) -> None:
        """One step of `node`; it publishes its KV events and (`_publish_loads`) its figures at
        the step's end."""
        self._publish_load(node.index)
        node.turn()
        events = node.take_events()
        if events:
            self.view.publish_events(node.index, node.now, events)
        self._unpublished[node.index] = node.now
        heapq.heappush(self._unpublished_by_time, (node.now, node.index))
        if node.runnable:
            self._enqueue(node)

    def _publish_loads(self, before: float) -> None:
        """Publish the load figures of the steps that ended before `before`.

        A node runs its step ahead of the requests that arrive during it (the loop routes them
        afterwards), so its figures at the step's end are read once the loop has routed every
        request up to then: before it routes a later one, and before the node steps again
        (`_publish_load`). Nothing else changes a node's state in between.
        """
        by_time, unpublished = self._unpublished_by_time, self._unpublished
        while by_time and by_time[0][0] < before:
            end, index = heapq.heappop(by_time)
            if unpublished[index] == end:  # else published already, before a later step
                self._publish_load(index)

    def _publish_load(self, index: int) -> None:
        """Publish node `index`'s figures of its last step's end, if not published yet."""
        if self._unpublished[index] is not None:
            self._unpublished[index] = None
            self.view.publish_load(self.nodes[index].load())

    def _enqueue(self, node: FleetNode) -> None:
        if not self._queued[node.index]:
            heapq.heappush(self._runnable, (node.now, node.index))
            self._queued[node.index] = True

    def _route(self, index: int, now: float) -> None:
        """Route trace request `index`, released at `now`, and hand it to its node."""
        first = self.nodes[0].engine
        request = first.make_request(index, now)
        trace_request = self.requests[index]
        routed = RoutedRequest(
            request_id=trace_request.request_id,
            prompt_tokens=trace_request.prompt_tokens,
            block_hashes=self._block_keys(request),
            block_size=self.block_size,
            tenant=trace_request.tenant,
        )
        k = self.router.route(routed, self.view, now)
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(self.nodes):
            raise FleetError(
                f"router {self.router.name!r} sent request {routed.request_id!r} to node {k!r}; "
                f"the fleet has nodes 0..{len(self.nodes) - 1}"
            )
        self.node_of[index] = k
        node = self.nodes[k]
        node.add(request, now)
        self._enqueue(node)
        self._routed += 1
        if self._routed == 1:
            self.view.first_route_done()

    def _resolved(self, index: int, when: float) -> None:
        """The recorder's note of an answer (first token) or failure: the router hears of it at
        `when`, before any request routed later."""
        if self.node_of[index] >= 0:
            heapq.heappush(self._answers, (when, next(self._seq), index))

    def _deliver(self, now: float) -> None:
        """Everything that reached the router by `now`: loads, KV events, answers."""
        if now != float("inf"):
            self.view.advance(now)
        answers = self._answers
        while answers and answers[0][0] <= now:
            when, _, index = heapq.heappop(answers)
            self.router.finished(self.requests[index].request_id, self.node_of[index], when)

    def _stop_events(self) -> None:
        for node in self.nodes:
            node.stop_events()
