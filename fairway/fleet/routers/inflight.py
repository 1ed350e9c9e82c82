"""A proxy router's own count of the requests it routed and that are not answered yet.

vLLM's router counts a worker's load this way (`Worker::load()`: incremented when it forwards a
request, decremented when the response ends), and its `kv_aware` policy and Dynamo's KV router
keep the prompt tokens they charged each worker in the same kind of ledger. It is the router's
own bookkeeping, exact and undelayed, unlike the figures the nodes publish.

The ledger refuses a broken contract instead of clamping: a request routed twice, or finished
twice, or finished on a node it was not routed to, is a bug of the caller that a silent
`max(0, ...)` would hide (and the counts could then never go below zero for the wrong reason).
"""

from __future__ import annotations

from dataclasses import dataclass

from fairway.fleet.routers.base import RouterError


@dataclass(frozen=True, slots=True)
class InFlightEntry:
    """What the router charged a node for one request: the node and a token count (0 for the
    routers that count requests only)."""

    node: int
    tokens: int


class InFlight:
    """Per node: the routed, unanswered requests and the tokens charged for them."""

    def __init__(self, num_nodes: int) -> None:
        self._entries: dict[str, InFlightEntry] = {}
        self.requests = [0] * num_nodes
        self.tokens = [0] * num_nodes

    def add(self, request_id: str, node: int, tokens: int = 0) -> None:
        """`request_id` now runs on `node`, charged `tokens`."""
        if request_id in self._entries:
            raise RouterError(f"request {request_id!r} was routed twice")
        self._entries[request_id] = InFlightEntry(node, tokens)
        self.requests[node] += 1
        self.tokens[node] += tokens

    def remove(self, request_id: str, node: int) -> InFlightEntry:
        """`request_id` was answered on `node`: its charge is released and returned."""
        entry = self._entries.pop(request_id, None)
        if entry is None:
            raise RouterError(f"request {request_id!r} finished but is not in flight")
        if entry.node != node:
            self._entries[request_id] = entry
            raise RouterError(
                f"request {request_id!r} finished on node {node}; it was routed to {entry.node}"
            )
        self.requests[node] -= 1
        self.tokens[node] -= entry.tokens
        return entry

    def __len__(self) -> int:
        return len(self._entries)
