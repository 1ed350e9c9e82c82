"""`vllm-kv-aware`: vLLM's router `kv_aware` policy: KV events plus a token cost for prefill.

Source: vllm-project/router. What was read: `src/policies/kv_aware.rs` at commits 71af994 and
dda6063 (an earlier form: longest KV-event prefix, least load when nothing matches),
`src/kv_index/scorer.rs` at cc14dbb (`PrefixScorer`: the contiguous leading-block run per
worker), `docs/kv_aware.md` at bf9bdb0; and release 0.1.17 itself through its wheel:
`vllm_router/router_args.py` (`router_temperature` 0.0 "softmax temperature for kv_aware in
regular mode (0 selects minimum cost)"; `kv_penalty_host` 0.8, `kv_penalty_external` 0.6,
`kv_penalty_disk` 0.3, "transfer credits" for blocks held in slower tiers; `--help`: "Prefill
remains token-cost based") and the names its binary carries (`kv_aware::KvAwarePolicy`,
`kv_aware::SlotCounters`, `kv_aware::PrefillWorkEstimate { new_prefill_tokens }`,
`KvAwareOps::estimate_prefill_work`; `credited_prefix_tokens`, `prefill_score` and
`active_prefill_tokens` in its prefill/decode router's decision logs and load samples).

The rule, as reconstructed from those names (the 0.1.17 `kv_aware.rs` is not in the index):
for each worker, the request's new prefill tokens there (prompt tokens minus the device-tier
prefix the worker's KV events show, `credited_prefix_tokens`) plus the prefill tokens the router
itself already sent the worker and not yet seen answered (its slot counters); the least cost
wins at temperature 0, a softmax over costs above it. This is Dynamo's prefill term in tokens
(the vLLM router's newer policies follow Dynamo's cost model) without Dynamo's decode term.

Not verified, and guessed: the exact cost (the sum above); the tie-break (here: the longer
cached prefix, then the lowest index); the softmax form for a temperature above 0 (Dynamo's);
the penalties (a fleet replay node has only the device tier, so they never apply and are not
parameters); the speculative index entries of the earlier form (not modelled).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from fairway.fleet.routers.base import build_config, check_at_least, softmax_sample
from fairway.fleet.routers.block_index import KVEventIndex
from fairway.fleet.routers.inflight import InFlight
from fairway.fleet.routing import FleetView, RoutedRequest


@dataclass(frozen=True, slots=True)
class KvAwareConfig:
    """`kv_aware`'s parameters that act in a one-tier fleet, with 0.1.17's default."""

    router_temperature: float = 0.0
    """0: the least cost; above: softmax sampling over the costs."""


def new_prefill_tokens(prompt_tokens: int, matched_blocks: int, block_size: int) -> int:
    """The prompt tokens a worker would still compute after the prefix it caches."""
    return max(0, prompt_tokens - matched_blocks * block_size)


class VllmKvAware:
    """vLLM's router `kv_aware`: least (new prefill tokens + pending prefill tokens)."""

    name = "vllm-kv-aware"

    def __init__(self, num_nodes: int, seed: int = 0, **params: Any) -> None:
        self.config = build_config(self.name, KvAwareConfig(), params)
        check_at_least(self.name, self.config, 0, "router_temperature")
        self.num_nodes = num_nodes
        self.index = KVEventIndex(num_nodes)
        self.in_flight = InFlight(num_nodes)
        self._rng = random.Random(seed)

    def route(self, request: RoutedRequest, view: FleetView, now_s: float) -> int:
        self.index.sync(view)
        matched = self.index.matched_blocks(request.block_hashes)
        new_tokens = [
            new_prefill_tokens(request.prompt_tokens, blocks, request.block_size)
            for blocks in matched
        ]
        costs = [self.in_flight.tokens[node] + new_tokens[node] for node in range(self.num_nodes)]
        if self.config.router_temperature > 0:
            node = softmax_sample(costs, self.config.router_temperature, self._rng)
        else:
            node = min(range(self.num_nodes), key=lambda n: (costs[n], -matched[n], n))
        self.in_flight.add(request.request_id, node, new_tokens[node])
        return node

    def finished(self, request_id: str, node: int, now_s: float) -> None:
        self.in_flight.remove(request_id, node)
