"""Fleet traces: the shipped presets at a fleet's rate.

A preset is built against a capacity (tokens/s): its load shape's factors multiply it. A fleet of N
nodes has N times one node's capacity, so the preset built against N x capacity x load sends N
times the requests a single node gets at that load, with the same mix, over the same span: what
E2 does for one node's loads (`benchmarks/e2_p99_scenarios.py`). Mooncake's presets keep their
recorded arrivals and take no shape: their own `load` parameter time-scales the arrivals to a
mean load of capacity, so the preset's load x N x load gives N times the rate (the same
requests, N times as fast). Any trace other than a preset at N x 1 is built from the source data.
A trace file is used as it is.

Each node of the fleet gets the KV cache a single replay of the preset at one node's rate gives
its engine (`node_blocks`): a node's memory is the hardware's, not a share of the fleet's
traffic, so adding nodes adds memory, and a fleet of one is the single replay.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fairway.errors import TraceError
from fairway.replay.engine_sizing import DEFAULT_BATCHED_TOKENS, DEFAULT_CACHE_FRACTION


def fleet_trace_label(spec: str, quick: bool, num_nodes: int, load: float) -> str:
    """The report's name of a fleet trace: the preset (or file) name, then `-N<nodes>` and,
    unless 1, `-x<load>` (`sec-a-quick-N4-x1.2`)."""
    from fairway.replay.bench import trace_label

    label = f"{trace_label(spec, quick)}-N{num_nodes}"
    return label if load == 1.0 else f"{label}-x{load:g}"


def load_fleet_trace(spec: str, *, num_nodes: int, load: float = 1.0, quick: bool = False,
                     cache_dir: str | Path | None = None) -> Any:
    """Preset `spec` at the rate of `num_nodes` nodes at `load` x capacity each, or the trace
    file `spec` as it is.

    Raises:
        TraceError: `load` not a number > 0, a file with a load other than 1 (a file cannot be
            rebuilt at another rate), or what `load_trace_spec` raises (unknown preset, data
            missing for a build).
    """
    from fairway.replay.bench import load_trace_spec
    from fairway.traces.build import default_capacity_tps, preset_arguments

    if isinstance(load, bool) or not (isinstance(load, int | float) and math.isfinite(load)
                                      and load > 0):
        raise TraceError(f"--load must be a number > 0, got {load!r}")
    scale = num_nodes * float(load)
    if Path(spec).exists():
        if load != 1.0:
            raise TraceError(
                f"--load {load:g} scales a preset's rate; {spec} is a trace file, replayed as it "
                "is (build it at the rate you want with `fairway trace build`)"
            )
        return load_trace_spec(spec, quick=quick, cache_dir=cache_dir)
    if scale == 1.0:
        return load_trace_spec(spec, quick=quick, cache_dir=cache_dir)
    args = preset_arguments(spec)  # an unknown preset raises with the known ones
    if args["shape"] is None:  # recorded arrivals: the preset's own load time-scales them
        preset_load = float(args["params"].get("load", 1.0))
        return load_trace_spec(spec, quick=quick, cache_dir=cache_dir,
                               load=round(preset_load * scale, 9))
    return load_trace_spec(spec, quick=quick, cache_dir=cache_dir,
                           capacity_tps=default_capacity_tps() * scale,
                           **_request_cap(args, scale))


def _request_cap(args: dict[str, Any], scale: float) -> dict[str, Any]:
    """The family's `max_requests` (a guard against a runaway load, 20,000 for one node) raised
    by `scale` when it has one and the preset does not set it: N nodes take N times the
    requests. Empty otherwise (a preset's own trace keeps its parameters)."""
    from fairway.traces.build import make_params

    if scale <= 1.0 or "max_requests" in args["params"]:
        return {}
    default = getattr(make_params(args["family"], args["params"]), "max_requests", None)
    return {} if default is None else {"max_requests": math.ceil(default * scale)}


def node_blocks(spec: str, fleet_trace: Any, *, load: float = 1.0, quick: bool = False,
                cache_dir: str | Path | None = None,
                cache_fraction: float = DEFAULT_CACHE_FRACTION, block_size: int = 16,
                max_num_batched_tokens: int = DEFAULT_BATCHED_TOKENS) -> int | None:
    """Each node's KV blocks for preset `spec` at `load`: what `size_cache` gives the single
    replay of the preset at one node's rate (capacity x load), at least the floor of the fleet
    trace (its largest prompt with two step budgets beside it). None for a trace file: the fleet
    replay sizes it (`fairway.fleet.replay.node_cache`)."""
    from fairway.replay.engine_sizing import size_cache

    if Path(spec).exists():
        return None
    one_node = load_fleet_trace(spec, num_nodes=1, load=load, quick=quick, cache_dir=cache_dir)
    single = size_cache(one_node, cache_fraction=cache_fraction, block_size=block_size,
                        max_num_batched_tokens=max_num_batched_tokens)
    floor = size_cache(fleet_trace, cache_fraction=cache_fraction, block_size=block_size,
                       max_num_batched_tokens=max_num_batched_tokens).floor_blocks
    return max(single.num_blocks, floor)
