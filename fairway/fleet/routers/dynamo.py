"""`dynamo-kv`: NVIDIA Dynamo's KV router (`--router-mode kv`).

Source: ai-dynamo/dynamo, `lib/llm/src/kv_router/scheduler.rs` (commit db19bd2:
`DefaultWorkerSelector::select_worker`, `softmax_sample`), `lib/llm/src/kv_router/sequence.rs`
(commit 581ee33: `ActiveSequences`), `KvRouterConfig::default()` (`overlap_score_weight` 1.0,
`router_temperature` 0.0, `use_kv_events` true, `router_track_active_blocks` true), and the
router docs (`docs/router/kv_cache_routing.md`).

The rule, per request, for each worker w:

    logit(w) = overlap_score_weight x potential_prefill_tokens(w) / block_size
               + potential_decode_blocks(w)

- `potential_prefill_tokens(w)` = the prompt tokens w would compute (prompt tokens minus the
  cached prefix, `overlap(w)` blocks x block size, floored at 0) + the prefill tokens of the
  requests the router sent w that are still active (`ActiveSequences::active_tokens`).
- `potential_decode_blocks(w)` = the distinct blocks of the requests the router sent w that are
  still active (`active_blocks`: a block shared by two active prompts counts once) + the
  request's blocks not among them (`new_blocks`).
- `overlap(w)`: the prompt's leading blocks w caches, from the radix-tree indexer that KV events
  fill (`KvIndexer`; here `block_index.KVEventIndex`, which answers the same leading run).
- Temperature 0: the least logit; ties go to the worker with the smallest indexer tree (fewest
  cached blocks), and if those are equal too, to a random one of them (seeded here).
  Above 0: `softmax_sample` over the logits normalised by their range.

So the load half is Dynamo's own prediction, not the nodes' published load: the router adds a
request's tokens and blocks to the worker when it routes it and frees them when the worker
answers (`add_request` / `free`; on a prefill node the answer, its first token, is the end of
its work there, so `finished` frees both). It never reads `NodeLoad`.

Not verified: how the worker-side accounting changes with the newer prefill-load options
(`--router-prefill-load-model`, the credit flags of Dynamo 1.x docs); this is the
`overlap_score_weight` form documented since 0.4. The order among workers of equal logit and
equal tree size before the random pick (Rust iterates a hash map) does not matter here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from fairway.fleet.routers.base import (
    build_config,
    check_at_least,
    min_cost_nodes,
    softmax_sample,
)
from fairway.fleet.routers.block_index import BlockIndex, KVEventIndex
from fairway.fleet.routers.inflight import InFlight
from fairway.fleet.routing import FleetView, RoutedRequest


@dataclass(frozen=True, slots=True)
class DynamoKvConfig:
    """`KvRouterConfig`'s routing parameters under their Dynamo names, with their defaults."""

    overlap_score_weight: float = 1.0
    """Weight of the prefill blocks in the logit (0: load balancing on active blocks only)."""
    router_temperature: float = 0.0
    """0: the least logit; above: softmax sampling over the logits."""


class DynamoKv:
    """Dynamo's KV router: least weighted prefill blocks + decode blocks, by its own accounting."""

    name = "dynamo-kv"

    def __init__(self, num_nodes: int, seed: int = 0, **params: Any) -> None:
        self.config = build_config(self.name, DynamoKvConfig(), params)
        check_at_least(self.name, self.config, 0, "overlap_score_weight", "router_temperature")
        self.num_nodes = num_nodes
        self.index = KVEventIndex(num_nodes)
        self.in_flight = InFlight(num_nodes)  # tokens = the prefill tokens charged
        # The blocks of the active requests, counted per request using them (`unique_blocks`).
        self.active = BlockIndex(num_nodes)
        self._hashes_of: dict[str, tuple[int, ...]] = {}
        self._rng = random.Random(seed)

    def logits(self, request: RoutedRequest, overlaps: list[int]) -> list[float]:
        """Each worker's logit for `request` given its overlap blocks."""
        weight = self.config.overlap_score_weight
        held = self.active.held(request.block_hashes)
        result = []
        for node in range(self.num_nodes):
            cached = overlaps[node] * request.block_size
            prefill_tokens = self.in_flight.tokens[node] + max(0, request.prompt_tokens - cached)
            new_blocks = len(request.block_hashes) - held[node]
            decode_blocks = self.active.sizes[node] + new_blocks
            result.append(weight * prefill_tokens / request.block_size + decode_blocks)
        return result

    def _pick(self, logits: list[float]) -> int:
        if self.config.router_temperature > 0:
            return softmax_sample(logits, self.config.router_temperature, self._rng)
        tied = min_cost_nodes(logits)
        if len(tied) == 1:
            return tied[0]
        sizes = [self.index.blocks.sizes[node] for node in tied]
        if all(size == sizes[0] for size in sizes):
            return self._rng.choice(tied)
        return tied[sizes.index(min(sizes))]

    def route(self, request: RoutedRequest, view: FleetView, now_s: float) -> int:
        self.index.sync(view)
        overlaps = self.index.matched_blocks(request.block_hashes)
        node = self._pick(self.logits(request, overlaps))
        cached = overlaps[node] * request.block_size
        self.in_flight.add(request.request_id, node, max(0, request.prompt_tokens - cached))
        for block_hash in request.block_hashes:
            self.active.add(node, block_hash)
        self._hashes_of[request.request_id] = request.block_hashes
        return node

    def finished(self, request_id: str, node: int, now_s: float) -> None:
        self.in_flight.remove(request_id, node)
        for block_hash in self._hashes_of.pop(request_id):
            self.active.remove(node, block_hash)
