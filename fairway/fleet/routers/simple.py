"""Routers that ignore the prompt's cache: round robin, random, least load, power of two
choices, consistent hashing.

Source: vLLM's router, vllm-project/router, `src/policies/{round_robin,random,power_of_two,
cache_aware}.rs` (read at commits fa999f9 for `power_of_two.rs`, 2f2db0d for `cache_aware.rs`),
whose release 0.1.17 (the wheel's `vllm_router/router_args.py`) lists the policies
`round_robin`, `random`, `power_of_two`, `cache_aware`, ...

- `round-robin` (`round_robin`): the next worker in turn, whatever its load or cache.
- `random` (`random`): a uniformly random worker (seeded here, for a reproducible replay).
- `least-load`: the worker with the fewest requests the router itself has in flight (routed,
  not answered), ties to the lowest index. vLLM's router 0.1.17 has no policy of that name; this
  is the shortest-queue branch of its `cache_aware` (`select_worker_min_load`:
  `min_by_key(worker.load())`, which keeps the first of equal minima), where `Worker::load()` is
  the router's own in-flight counter. So it is `cache_aware` with the cache half turned off;
  `power_of_two` reads loads too, but samples two workers.
- `power-of-two` (`power_of_two`): two distinct random workers, the one with the lower load;
  equal loads go to the first drawn. Its load is the router's in-flight count plus the worker's
  polled load (`cached_loads`, refreshed by a background load monitor). Not verified: what the
  polled figure is; here the node's published waiting + running requests (`NodeLoad`, as late
  as the view's `metrics_delay_s`). Like the source, it refuses a fleet of one node.
- `consistent-hash` (`consistent_hash`, `src/policies/{consistent_hash,hash_key}.rs` at 080589a
  and 335c57e): a hash ring with 160 virtual nodes per worker; the key is the first of the
  session headers the client sent (`x-session-id`, `x-user-id`, `x-tenant-id`, ...), else a
  session field of the body, else the request body itself. A replayed request carries its
  tenant (as `x-tenant-id`) or nothing, so: the tenant, else the prompt (its block hashes and
  length). The ring's hash is BLAKE2b here, not the source's FurcHash + MurmurHash64A: the same
  key always lands on the same node, but not on the node the Rust ring would pick.
"""

from __future__ import annotations

import bisect
import hashlib
import random

from fairway.fleet.routers.base import RouterError, loads_by_node, lowest_index_min
from fairway.fleet.routers.inflight import InFlight
from fairway.fleet.routing import FleetView, NodeLoad, RoutedRequest


class RoundRobin:
    """Node 0, 1, ..., N-1, 0, ... in arrival order."""

    name = "round-robin"

    def __init__(self, num_nodes: int, seed: int = 0) -> None:
        self.num_nodes = num_nodes
        self._next = 0

    def route(self, request: RoutedRequest, view: FleetView, now_s: float) -> int:
        node = self._next
        self._next = (node + 1) % self.num_nodes
        return node

    def finished(self, request_id: str, node: int, now_s: float) -> None:
        """Round robin keeps no per-request state."""


class RandomRouter:
    """A uniformly random node, from a generator seeded by the replay's seed."""

    name = "random"

    def __init__(self, num_nodes: int, seed: int = 0) -> None:
        self.num_nodes = num_nodes
        self._rng = random.Random(seed)

    def route(self, request: RoutedRequest, view: FleetView, now_s: float) -> int:
        return self._rng.randrange(self.num_nodes)

    def finished(self, request_id: str, node: int, now_s: float) -> None:
        """Random keeps no per-request state."""


class LeastLoad:
    """The node with the fewest requests in flight by the router's own count."""

    name = "least-load"

    def __init__(self, num_nodes: int, seed: int = 0) -> None:
        self.num_nodes = num_nodes
        self.in_flight = InFlight(num_nodes)

    def route(self, request: RoutedRequest, view: FleetView, now_s: float) -> int:
        node = lowest_index_min(self.in_flight.requests)
        self.in_flight.add(request.request_id, node)
        return node

    def finished(self, request_id: str, node: int, now_s: float) -> None:
        self.in_flight.remove(request_id, node)


class PowerOfTwo:
    """The less loaded of two distinct random nodes (in-flight + published load)."""

    name = "power-of-two"

    def __init__(self, num_nodes: int, seed: int = 0) -> None:
        if num_nodes < 2:
            raise RouterError("router 'power-of-two' needs at least 2 nodes (as vLLM's router)")
        self.num_nodes = num_nodes
        self._rng = random.Random(seed)
        self.in_flight = InFlight(num_nodes)

    def _load(self, node: int, view_loads: list[NodeLoad | None]) -> int:
        published = view_loads[node]
        polled = 0 if published is None else published.waiting_requests + published.running_requests
        return self.in_flight.requests[node] + polled

    def route(self, request: RoutedRequest, view: FleetView, now_s: float) -> int:
        view_loads = loads_by_node(view, self.num_nodes)
        first = self._rng.randrange(self.num_nodes)
        second = self._rng.randrange(self.num_nodes - 1)
        second += second >= first  # a second draw distinct from the first, uniformly
        node = first if self._load(first, view_loads) <= self._load(second, view_loads) else second
        self.in_flight.add(request.request_id, node)
        return node

    def finished(self, request_id: str, node: int, now_s: float) -> None:
        self.in_flight.remove(request_id, node)



#: Virtual nodes per worker on the ring (`VIRTUAL_NODES_PER_WORKER`).
VIRTUAL_NODES_PER_WORKER = 160


def ring_hash(key: str) -> int:
    """A stable 64-bit hash of `key` (Python's `hash` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class ConsistentHash:
    """The node owning the request's key on a ring of virtual nodes."""

    name = "consistent-hash"

    def __init__(self, num_nodes: int, seed: int = 0) -> None:
        self.num_nodes = num_nodes
        ring = sorted(
            (ring_hash(f"node-{node}:{i}"), node)
            for node in range(num_nodes)
            for i in range(VIRTUAL_NODES_PER_WORKER)
        )
        self._points = [point for point, _ in ring]
        self._owners = [node for _, node in ring]

    @staticmethod
    def key(request: RoutedRequest) -> str:
        """The tenant when the request names one, else its prompt."""
        if request.tenant:
            return f"header:x-tenant-id:{request.tenant}"
        return f"request:{request.prompt_tokens}:{','.join(map(str, request.block_hashes))}"

    def route(self, request: RoutedRequest, view: FleetView, now_s: float) -> int:
        at = bisect.bisect_left(self._points, ring_hash(self.key(request)))
        return self._owners[at % len(self._owners)]

    def finished(self, request_id: str, node: int, now_s: float) -> None:
        """Consistent hashing keeps no per-request state."""
