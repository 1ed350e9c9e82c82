"""What every router module shares: its error, its config builder, the loads by node, and the
two ways a cost-based router turns costs into one node.

Kept apart from the registry (`fairway.fleet.routers`) so that the router modules can import it
without importing the registry that imports them.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from fairway.errors import FairwayError
from fairway.fleet.routing import FleetView, NodeLoad


class RouterError(FairwayError, ValueError):
    """An unknown router name, a bad router parameter, or a call that breaks the router
    contract (a view of another fleet size, a request finished twice)."""


ConfigT = TypeVar("ConfigT")


def build_config(router: str, defaults: ConfigT, params: Mapping[str, Any]) -> ConfigT:
    """`defaults` with `params` overriding fields by their real names; an unknown name is a
    `RouterError` that lists the known ones (the defaults stay the source's, in one place)."""
    assert dataclasses.is_dataclass(defaults) and not isinstance(defaults, type)
    known = [field.name for field in dataclasses.fields(defaults)]
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise RouterError(
            f"router {router!r} has no parameter {', '.join(map(repr, unknown))}; "
            f"its parameters: {', '.join(known)}"
        )
    return dataclasses.replace(defaults, **params)


def check_range(router: str, name: str, value: float, low: float, high: float) -> None:
    """A `RouterError` naming the parameter unless `low <= value <= high`."""
    if not (low <= value <= high) or math.isnan(value):
        raise RouterError(f"router {router!r}: {name}={value!r} is outside [{low}, {high}]")


def check_at_least(router: str, config: object, low: float, *names: str) -> None:
    """`check_range(name, value, low, inf)` for each of `config`'s fields `names`."""
    for name in names:
        check_range(router, name, getattr(config, name), low, math.inf)


def check_view(view: FleetView, num_nodes: int) -> None:
    """A router is built for one fleet size; a view of another fleet is a caller's bug."""
    if view.num_nodes != num_nodes:
        raise RouterError(
            f"the view shows {view.num_nodes} nodes, the router was built for {num_nodes}"
        )


def loads_by_node(view: FleetView, num_nodes: int) -> list[NodeLoad | None]:
    """The view's newest published figures indexed by node; None for a node that has published
    nothing yet (the start of a replay), which the load-reading routers take as idle."""
    check_view(view, num_nodes)
    table: list[NodeLoad | None] = [None] * num_nodes
    for load in view.loads():
        if not 0 <= load.node < num_nodes:
            raise RouterError(f"a load figure names node {load.node}, not in 0..{num_nodes - 1}")
        table[load.node] = load
    return table


def lowest_index_min(values: Sequence[float]) -> int:
    """The first index holding the least value: Rust's `Iterator::min_by_key`, which vLLM's
    router uses for its least-loaded choices, keeps the first of equal minima."""
    best = 0
    for index, value in enumerate(values):
        if value < values[best]:
            best = index
    return best


def min_cost_nodes(costs: Sequence[float]) -> list[int]:
    """Every node at the least cost, in index order (temperature 0: the ties, for the caller's
    own tie-break)."""
    least = min(costs)
    return [node for node, cost in enumerate(costs) if cost == least]


def softmax_sample(costs: Sequence[float], temperature: float, rng: random.Random) -> int:
    """Dynamo's `softmax_sample` for a temperature above 0: costs normalised by their range,
    negated, divided by the temperature, and sampled (lower cost, higher probability); equal
    costs are sampled uniformly."""
    low, high = min(costs), max(costs)
    if low == high:
        return rng.randrange(len(costs))
    scaled = [-(cost / (high - low)) / temperature for cost in costs]
    top = max(scaled)
    weights = [math.exp(value - top) for value in scaled]
    return rng.choices(range(len(costs)), weights=weights)[0]
