"""The routers a fleet replay can put in front of its nodes, by registry name.

Each rule is the one its project defines (module docstrings cite the source and its defaults);
a router reads only `fairway.fleet.routing`'s views. `make_router(name, num_nodes, seed)` builds
a fresh instance for one replay (routers keep state: their routing history).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fairway.errors import FairwayError
from fairway.fleet.routers.simple import RoundRobin
from fairway.fleet.routing import Router

#: name -> factory(num_nodes, seed, **params).
_FACTORIES: dict[str, Callable[..., Router]] = {
    RoundRobin.name: RoundRobin,
}


class RouterError(FairwayError, ValueError):
    """An unknown router name or a bad router parameter."""


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
