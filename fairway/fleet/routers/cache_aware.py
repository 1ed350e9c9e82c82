"""`vllm-cache-aware`: vLLM's router `cache_aware` policy (it descends from SGLang's router).

Source: vllm-project/router, `src/policies/cache_aware.rs` and `src/tree.rs` (read at commits
2f2db0d and 16917f4 of `cache_aware.rs`, 1dbe507 of `tree.rs`); defaults from the 0.1.17 wheel's
`vllm_router/router_args.py` (`RouterArgs`): `cache_threshold` 0.3, `balance_abs_threshold` 64,
`balance_rel_threshold` 1.5, `eviction_interval_secs` 120, `max_tree_size` 2**25 ("per-worker
character budget in each model tree", its `--help` says).

The rule, per request:
1. Load = the router's own in-flight count per worker (`Worker::load()`). The fleet is
   imbalanced when `max - min > balance_abs_threshold` AND `max > balance_rel_threshold * min`;
   then the request goes to the least loaded worker (first of equal minima: lowest index).
2. Otherwise the prompt is matched against the approximate tree of routed prompts
   (`fairway.fleet.routers.prefix_tree`): match rate = matched / prompt length. Above
   `cache_threshold` (strictly) the request goes to the worker that holds the deepest match.
3. At or below it, to the least loaded worker. The file's header comment says "the worker with
   the smallest tree size (most available cache capacity)", but the code of both versions read
   calls `min_by_key(worker.load())`: the least loaded worker, and that is what runs here. The
   0.1.17 binary's symbols agree (its `Tree` has no smallest-tenant method).
4. Whichever branch chose, the prompt is inserted into the tree for the chosen worker.
5. Every `eviction_interval_secs` (a background thread started with the policy; here at the
   first arrival at or after each multiple of the interval), each worker whose tree holds more
   than `max_tree_size` characters loses its least recently used leaves until it fits.

Modelled at block granularity: the Rust tree matches characters of the request text; here
blocks of `RoutedRequest.block_hashes` (see `prefix_tree`), the match rate is matched blocks x
block size / prompt tokens, and `max_tree_size` characters are taken as `max_tree_size /
CHARS_PER_TOKEN` tokens (4 characters a token, the figure llm-d's prefix producer also uses).

Not verified: the 0.1.17 source itself (the indexed versions are a little older and newer; its
binary names the same functions and defaults); whether 0.1.17 reads load as in-flight requests
(both versions read do); the holder chosen when the creator of the deepest node left it
(Rust: first in a hash map's order; here the lowest index).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fairway.fleet.routers.base import (
    build_config,
    check_at_least,
    check_range,
    check_view,
    lowest_index_min,
)
from fairway.fleet.routers.inflight import InFlight
from fairway.fleet.routers.prefix_tree import ApproximatePrefixTree
from fairway.fleet.routing import FleetView, RoutedRequest

#: Characters per token, to read `max_tree_size` (characters) in tokens.
CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class CacheAwareConfig:
    """`cache_aware`'s parameters under their vLLM router names, with 0.1.17's defaults."""

    cache_threshold: float = 0.3
    """Match rate (0..1) above which the request follows its prefix."""
    balance_abs_threshold: int = 64
    """Imbalance needs max - min in-flight requests above this..."""
    balance_rel_threshold: float = 1.5
    """... and max above this times min."""
    eviction_interval_secs: float = 120.0
    """Seconds between tree evictions (0: never)."""
    max_tree_size: int = 2**25
    """Characters each worker may hold in the tree after an eviction."""


#: Which branch chose a request: the labels of the 0.1.17 binary's "Cache prefix decision".
DECISIONS = ("load_imbalance", "prefix_hit", "prefix_miss")


class VllmCacheAware:
    """vLLM's router `cache_aware`: prefix affinity unless the in-flight counts are imbalanced."""

    name = "vllm-cache-aware"

    def __init__(self, num_nodes: int, seed: int = 0, **params: Any) -> None:
        self.config = build_config(self.name, CacheAwareConfig(), params)
        check_range(self.name, "cache_threshold", self.config.cache_threshold, 0.0, 1.0)
        check_at_least(
            self.name, self.config, 0, "balance_abs_threshold", "balance_rel_threshold",
            "eviction_interval_secs", "max_tree_size",
        )
        self.num_nodes = num_nodes
        self.tree = ApproximatePrefixTree(num_nodes)
        self.in_flight = InFlight(num_nodes)
        self.decisions = dict.fromkeys(DECISIONS, 0)
        interval = self.config.eviction_interval_secs
        self._next_eviction_s = interval if interval > 0 else math.inf
        self._block_size = 0

    def _imbalanced(self) -> bool:
        loads = self.in_flight.requests
        low, high = min(loads), max(loads)
        return (
            high - low > self.config.balance_abs_threshold
            and high > low * self.config.balance_rel_threshold
        )

    def _evict_due(self, now_s: float) -> None:
        """Run the eviction passes whose time came since the last arrival (one is enough:
        nothing was inserted between two passes that fall before the same arrival)."""
        if now_s < self._next_eviction_s:
            return
        interval = self.config.eviction_interval_secs
        passes = 1 + math.floor((now_s - self._next_eviction_s) / interval)
        self._next_eviction_s += interval * passes
        if self._block_size:
            budget_tokens = self.config.max_tree_size / CHARS_PER_TOKEN
            self.tree.evict_by_size(int(budget_tokens // self._block_size))

    def route(self, request: RoutedRequest, view: FleetView, now_s: float) -> int:
        check_view(view, self.num_nodes)
        self._evict_due(now_s)
        self._block_size = request.block_size
        if self._imbalanced():
            decision = "load_imbalance"
            node = lowest_index_min(self.in_flight.requests)
        else:
            matched, holder = self.tree.match(request.block_hashes)
            rate = 0.0
            if request.prompt_tokens > 0:
                rate = min(1.0, matched * request.block_size / request.prompt_tokens)
            if rate > self.config.cache_threshold:
                decision, node = "prefix_hit", holder
            else:
                decision = "prefix_miss"
                node = lowest_index_min(self.in_flight.requests)
        self.decisions[decision] += 1
        self.tree.insert(request.block_hashes, node)
        self.in_flight.add(request.request_id, node)
        return node

    def finished(self, request_id: str, node: int, now_s: float) -> None:
        self.in_flight.remove(request_id, node)
