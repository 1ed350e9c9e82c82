"""The routers a fleet replay can put in front of its nodes, by registry name.

Each rule is the one its project defines (module docstrings cite the source, the version read,
the defaults and what could not be verified); a router reads only `fairway.fleet.routing`'s
views. `make_router(name, num_nodes, seed, **params)` builds a fresh instance for one replay
(routers keep state: their routing history, their indexes); `params` override the defaults
under the source's own parameter names (`make_router("vllm-cache-aware", 8,
cache_threshold=0.5)`).

| name               | source                                  | reads                          |
|--------------------|-----------------------------------------|--------------------------------|
| `round-robin`      | vLLM router `round_robin`               | nothing                        |
| `random`           | vLLM router `random`                    | nothing                        |
| `least-load`       | vLLM router `cache_aware`'s load branch | own in-flight counts           |
| `power-of-two`     | vLLM router `power_of_two`              | in-flight + published load     |
| `consistent-hash`  | vLLM router `consistent_hash`           | tenant, else the prompt        |
| `vllm-cache-aware` | vLLM router `cache_aware`               | routed prompts, in-flight      |
| `vllm-kv-aware`    | vLLM router `kv_aware`                  | KV events, own token ledger    |
| `dynamo-kv`        | Dynamo KV router                        | KV events, own token/blocks    |
| `llm-d`            | llm-d endpoint picker, default profile  | published load, routed prompts |
| `fairway-work`     | Fairway (issue 48 item 5)               | KV events, published work      |
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fairway.fleet.routers.base import RouterError
from fairway.fleet.routers.cache_aware import VllmCacheAware
from fairway.fleet.routers.dynamo import DynamoKv
from fairway.fleet.routers.fairway_work import FairwayWork
from fairway.fleet.routers.kv_aware import VllmKvAware
from fairway.fleet.routers.llm_d import LlmD
from fairway.fleet.routers.simple import (
    ConsistentHash,
    LeastLoad,
    PowerOfTwo,
    RandomRouter,
    RoundRobin,
)
from fairway.fleet.routing import Router

#: name -> factory(num_nodes, seed, **params).
_FACTORIES: dict[str, Callable[..., Router]] = {
    RoundRobin.name: RoundRobin,
    RandomRouter.name: RandomRouter,
    LeastLoad.name: LeastLoad,
    PowerOfTwo.name: PowerOfTwo,
    ConsistentHash.name: ConsistentHash,
    VllmCacheAware.name: VllmCacheAware,
    VllmKvAware.name: VllmKvAware,
    DynamoKv.name: DynamoKv,
    LlmD.name: LlmD,
    FairwayWork.name: FairwayWork,
}

__all__ = ["RouterError", "make_router", "router_names"]


def router_names() -> list[str]:
    """Every registered router, in registry order."""
    return list(_FACTORIES)


def make_router(name: str, num_nodes: int, seed: int = 0, **params: Any) -> Router:
    """A fresh router `name` for a fleet of `num_nodes` nodes."""
    if num_nodes < 1:
        raise RouterError(f"a fleet needs at least one node, not {num_nodes}")
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise RouterError(
            f"unknown router {name!r}; choose one of {', '.join(router_names())}"
        ) from None
    try:
        return factory(num_nodes, seed, **params)
    except TypeError as exc:
        raise RouterError(f"router {name!r}: {exc}") from None
