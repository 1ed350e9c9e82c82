"""Routers that ignore the prompt: round robin.

`round-robin`: vLLM's router `round_robin` policy (vllm-project/router, `policies/round_robin`):
the next worker in turn, whatever its load or cache.
"""

from __future__ import annotations

from fairway.fleet.routing import FleetView, RoutedRequest


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
