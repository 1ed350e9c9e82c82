"""`fairway-work`: Fairway's own rule (issue 48, item 5): the least queued work after the hit.

No project defines it; it is what a prefix-aware router could do with the one signal none of
them has, the queued uncached work a Fairway node exports (`fairway:queued_uncached_tokens`,
`NodeLoad.queued_uncached_tokens`). For each node:

    work(node) = queued_uncached_tokens(node) + prompt_tokens - hit_tokens(node)

where `hit_tokens` = the prompt's leading blocks the node caches by its KV events (the same
index as `vllm-kv-aware` and `dynamo-kv`) x block size, at most `prompt_tokens - 1` (vLLM
computes at least the last prompt token). The least work wins; ties go to the longer hit, then
to the lowest index. Both signals are as late as the view makes them (`metrics_delay_s`,
`kv_event_delay_s`); a node that published nothing yet has no queued work. Unlike Dynamo's and
vLLM's token-cost routers it keeps no ledger of its own: what it routed since the node last
published is not in the figure, which is the point of comparing it with them.

No parameters; defaults: none.
"""

from __future__ import annotations

from fairway.fleet.routers.base import loads_by_node
from fairway.fleet.routers.block_index import KVEventIndex, hit_tokens
from fairway.fleet.routing import FleetView, RoutedRequest


class FairwayWork:
    """The node with the least queued uncached tokens once this request's hit is counted."""

    name = "fairway-work"

    def __init__(self, num_nodes: int, seed: int = 0) -> None:
        self.num_nodes = num_nodes
        self.index = KVEventIndex(num_nodes)

    def work(self, request: RoutedRequest, view: FleetView) -> list[tuple[int, int]]:
        """Per node: (queued uncached tokens after routing `request` there, hit tokens)."""
        loads = loads_by_node(view, self.num_nodes)
        self.index.sync(view)
        matched = self.index.matched_blocks(request.block_hashes)
        result = []
        for node, load in enumerate(loads):
            hit = hit_tokens(matched[node], request.block_size, request.prompt_tokens)
            queued = 0 if load is None else load.queued_uncached_tokens
            result.append((queued + request.prompt_tokens - hit, hit))
        return result

    def route(self, request: RoutedRequest, view: FleetView, now_s: float) -> int:
        work = self.work(request, view)
        return min(range(self.num_nodes), key=lambda n: (work[n][0], -work[n][1], n))

    def finished(self, request_id: str, node: int, now_s: float) -> None:
        """The rule reads published figures only; it keeps no per-request state."""
