"""`llm-d`: llm-d's endpoint picker (EPP) with its default scheduling profile.

Source: llm-d/llm-d-inference-scheduler, which now carries the gateway-api-inference-extension
framework it builds on (module `github.com/llm-d/llm-d-router`; read at commit 520af478, tag
`gaie-1.5-sync-1211`):
- the default profile, `config/charts/epplib/templates/_config.yaml` (`default-plugins.yaml`):
  `queue-scorer` weight 2, `kv-cache-utilization-scorer` weight 2, `prefix-cache-scorer`
  weight 3, and the picker the config loader adds when a profile names none
  (`pkg/epp/config/loader/defaults.go`): `max-score-picker`;
- `pkg/epp/framework/plugins/scheduling/scorer/queuedepth/queue.go`: score = (max waiting -
  waiting) / (max waiting - min waiting) over the candidates, 1.0 for all when they are equal
  (waiting = the scraped `vllm:num_requests_waiting`);
- `.../scorer/kvcacheutilization/kvcache_utilization.go`: score = 1 - KV cache usage (0..1);
- `.../scorer/prefix/plugin.go`: score = matched blocks / prompt blocks, from
  `.../requestcontrol/dataproducer/approximateprefix/{plugin,indexer,hashing,types}.go`: an
  approximate index of the prompts the EPP routed, one LRU of block hashes per server (capacity
  = the server's KV cache blocks when `autoTune` and the server reports them, else
  `lruCapacityPerServer` 31,250), prompts hashed into at most `maxPrefixBlocksToMatch` 256
  blocks, matched greedily (`block_index.BlockIndex.greedy_run`), and the routed prompt added to
  the chosen server's LRU after the pick (`PreRequest`);
- `.../picker/maxscore/picker.go`: the highest weighted sum; equal sums broken at random (it
  shuffles, then sorts stably; here a generator seeded by the replay's seed).

A pick reads the nodes' published figures (`NodeLoad`, as late as the view's
`metrics_delay_s`; a node that published nothing yet counts as idle and empty) and the EPP's own
prefix index; never KV events.

Modelled at block granularity: llm-d hashes the request text in blocks of `blockSizeTokens` x 4
characters (its `averageCharactersPerToken`), with the prompt's partial tail as one more block;
here `RoutedRequest.block_hashes` (full blocks only) in both the match and the denominator.
Not verified: that a deployment runs this profile unchanged (llm-d's guides ship others, e.g.
`deploy/config/epp-config.yaml`: prefix only, weight 2).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fairway.fleet.routers.base import build_config, check_at_least, loads_by_node
from fairway.fleet.routers.block_index import BlockIndex
from fairway.fleet.routing import FleetView, NodeLoad, RoutedRequest


@dataclass(frozen=True, slots=True)
class LlmDConfig:
    """The default profile's weights and the prefix producer's parameters (llm-d's names in
    snake case: `lruCapacityPerServer` is `lru_capacity_per_server`)."""

    queue_scorer_weight: float = 2.0
    kv_cache_utilization_scorer_weight: float = 2.0
    prefix_cache_scorer_weight: float = 3.0
    auto_tune: bool = True
    """Size each server's LRU from the KV cache blocks it reports."""
    lru_capacity_per_server: int = 31_250
    """LRU capacity (blocks) of a server that reports none, or of all when not auto-tuned."""
    max_prefix_blocks_to_match: int = 256
    """Blocks of a prompt that are hashed and matched (the rest is ignored)."""


class ApproximatePrefixIndex:
    """llm-d's approximate prefix index: per server, an LRU of the block hashes routed to it."""

    def __init__(self, num_nodes: int) -> None:
        self.blocks = BlockIndex(num_nodes)
        self._lru: list[OrderedDict[int, None] | None] = [None] * num_nodes
        self.capacity = [0] * num_nodes

    def add(self, node: int, block_hashes: Sequence[int], capacity: int) -> None:
        """Record that `node` was sent these blocks; its LRU is sized on first use, as the
        Go indexer sizes it when it creates it."""
        lru = self._lru[node]
        if lru is None:
            lru = self._lru[node] = OrderedDict()
            self.capacity[node] = capacity
        for block_hash in block_hashes:
            if block_hash in lru:
                lru.move_to_end(block_hash)
                continue
            lru[block_hash] = None
            self.blocks.add(node, block_hash)
            if len(lru) > self.capacity[node]:
                evicted, _ = lru.popitem(last=False)
                self.blocks.discard(node, evicted)


def queue_scores(waiting: Sequence[int]) -> list[float]:
    """`queue-scorer`: min-max normalised, shorter queue higher; all equal -> 1.0."""
    low, high = min(waiting), max(waiting)
    if low == high:
        return [1.0] * len(waiting)
    return [(high - count) / (high - low) for count in waiting]


class LlmD:
    """llm-d's EPP: max of 2 x queue + 2 x (1 - KV usage) + 3 x prefix match share."""

    name = "llm-d"

    def __init__(self, num_nodes: int, seed: int = 0, **params: Any) -> None:
        self.config = build_config(self.name, LlmDConfig(), params)
        check_at_least(
            self.name, self.config, 0, "queue_scorer_weight",
            "kv_cache_utilization_scorer_weight", "prefix_cache_scorer_weight",
        )
        check_at_least(
            self.name, self.config, 1, "lru_capacity_per_server", "max_prefix_blocks_to_match"
        )
        self.num_nodes = num_nodes
        self.index = ApproximatePrefixIndex(num_nodes)
        self._rng = random.Random(seed)

    def scores(self, request: RoutedRequest, loads: list[NodeLoad | None]) -> list[float]:
        """Each node's weighted score for `request`."""
        config = self.config
        hashes = request.block_hashes[: config.max_prefix_blocks_to_match]
        matched = self.index.blocks.greedy_run(hashes)
        queue = queue_scores([0 if load is None else load.waiting_requests for load in loads])
        total = []
        for node, load in enumerate(loads):
            kv_free = 1.0 if load is None else 1.0 - load.kv_usage
            prefix = matched[node] / len(hashes) if hashes else 0.0
            total.append(
                config.queue_scorer_weight * queue[node]
                + config.kv_cache_utilization_scorer_weight * kv_free
                + config.prefix_cache_scorer_weight * prefix
            )
        return total

    def route(self, request: RoutedRequest, view: FleetView, now_s: float) -> int:
        loads = loads_by_node(view, self.num_nodes)
        scores = self.scores(request, loads)
        best = max(scores)
        node = self._rng.choice([n for n, score in enumerate(scores) if score == best])
        load = loads[node]
        capacity = self.config.lru_capacity_per_server
        if self.config.auto_tune and load is not None and load.total_blocks > 0:
            capacity = load.total_blocks
        hashes = request.block_hashes[: self.config.max_prefix_blocks_to_match]
        self.index.add(node, hashes, capacity)
        return node

    def finished(self, request_id: str, node: int, now_s: float) -> None:
        """The EPP's scorers read published figures; it keeps no per-request count."""
