"""What a router sees and answers: the contract between the fleet replay and the routers.

A real router sees a request's prompt, its own routing history, and whatever the nodes publish:
load figures scraped from `/metrics` (llm-d's endpoint picker, Dynamo), KV events over ZMQ
(vLLM's router `kv_aware`, Dynamo's KV router). It never sees a node's queue directly, and what
it sees is late. The fleet replay builds these views from the nodes' real state at the times the
router would have received it (`FleetSignals` holds the delays); a router reads only them.

Must not import vllm: routers are plain Python over these views, unit-tested without an engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class RoutedRequest:
    """One request as a router sees it.

    Attributes:
        request_id: the trace's id.
        prompt_tokens: prompt length in tokens.
        block_hashes: the chained hashes of the prompt's full blocks (`block_size` tokens each),
            the same keys the nodes' prefix caches and KV events use: two prompts share a prefix
            of k blocks exactly when their first k hashes are equal. A text-level router (vLLM's
            `cache_aware` matches characters) is modelled at this block granularity.
        block_size: tokens per block.
        tenant: the request's tenant, or None.
    """

    request_id: str
    prompt_tokens: int
    block_hashes: tuple[int, ...]
    block_size: int
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """One node's published load figures, as of `published_s` (what `/metrics` said then).

    Attributes:
        node: the node's index in the fleet (0..N-1).
        published_s: when the node published these figures (virtual seconds).
        waiting_requests: requests in the node's waiting queue (`vllm:num_requests_waiting`).
        running_requests: requests the node is running (`vllm:num_requests_running`).
        kv_usage: share of the node's KV blocks in use, 0..1 (`vllm:kv_cache_usage_perc`).
        active_blocks: KV blocks held by the node's running requests.
        queued_uncached_tokens: the prompt tokens the node's waiting and running requests still
            have to compute after their prefix hits: Fairway's exported queue work
            (`fairway:queued_uncached_tokens`); the signal no prefix-aware router has.
        total_blocks: the node's KV cache size in blocks.
    """

    node: int
    published_s: float
    waiting_requests: int
    running_requests: int
    kv_usage: float
    active_blocks: int
    queued_uncached_tokens: int
    total_blocks: int


@dataclass(frozen=True, slots=True)
class FleetSignals:
    """The delays with which the router learns what the nodes publish (seconds).

    Attributes:
        metrics_delay_s: age of the load figures a router acts on (a scrape interval).
        kv_event_delay_s: how late a node's KV events (block stored / removed) reach the router.
    """

    metrics_delay_s: float = 0.05
    kv_event_delay_s: float = 0.01


@dataclass(frozen=True, slots=True)
class KVEvent:
    """One KV cache event of one node: `stored` True for a block stored (cached), False for a
    block removed (evicted); `block_hash` is the key `RoutedRequest.block_hashes` uses."""

    node: int
    time_s: float
    block_hash: int
    stored: bool


@runtime_checkable
class FleetView(Protocol):
    """What the fleet replay shows a router at one arrival (already delayed)."""

    @property
    def num_nodes(self) -> int: ...

    def loads(self) -> Sequence[NodeLoad]:
        """Each node's newest load figures published at least `metrics_delay_s` ago."""
        ...

    def kv_events_since(self, cursor: int) -> tuple[Sequence[KVEvent], int]:
        """The KV events delivered to the router since `cursor` (0 at the start), in delivery
        order, and the cursor to pass next time. Only routers that subscribe to KV events call
        it."""
        ...


class Router(Protocol):
    """A routing rule: picks the node for each arriving request.

    `name` is the router's registry name (`round-robin`, `vllm-cache-aware`, ...). `route` is
    called once per request at its arrival, in arrival order; `finished` once per routed
    request when the node answers it (its first token; a prefill node is then done with it),
    which is what a proxy-style router counts its in-flight requests with.
    """

    name: str

    def route(self, request: RoutedRequest, view: FleetView, now_s: float) -> int:
        """The index of the node that gets `request` (0..view.num_nodes-1)."""
        ...

    def finished(self, request_id: str, node: int, now_s: float) -> None:
        """The node answered the request (or failed it)."""
        ...
