"""`fairway bench --nodes N --router R`: the router x policy (x load) grid of fleet replays.

Each cell is one `fleet_replay` (a `FleetJob`), run through the sweep machinery of `fairway
bench` (`fairway.replay.sweep`: local worker processes, or Ray tasks with `--ray`). The traces
are the given presets at the fleet's rate (`fairway.fleet.traces`). Output, in a new directory:
`replays/<trace>--<policy>--<router>.json` (each `FleetResult`), `fleet.md` and `fleet.json`
(the table: per trace, router and policy the fleet-wide TTFT p50/p90/p99, hit share, tokens
computed, node balance and the worst node's p99) and `bench.json` (config, machine, settings).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fairway.errors import FairwayConfigError
from fairway.fleet import result as fleet_io
from fairway.fleet.result import FleetResult
from fairway.fleet.routing import FleetSignals

if TYPE_CHECKING:
    from fairway.options import FairwayOptions
    from fairway.replay.bench import BenchConfig
    from fairway.traces.format import Trace

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FleetJob:
    """One fleet replay of a sweep (`fairway.replay.sweep.Job`).

    Attributes:
        trace_name: the fleet trace's label.
        trace: the workload, at the fleet's rate.
        policy: every node's policy (name or `FairwayOptions`).
        router: the router's registry name.
        num_nodes: the fleet's size.
        policy_params: more policy parameters (with a name).
        router_params: the router's parameters.
        options: other keyword arguments of `fleet_replay` (profile, cache_fraction, ...).
    """

    trace_name: str
    trace: Trace
    policy: str | FairwayOptions
    router: str
    num_nodes: int
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    router_params: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def policy_name(self) -> str:
        return self.policy if isinstance(self.policy, str) else self.policy.policy

    @property
    def key(self) -> tuple[str, str]:
        return self.trace_name, f"{self.policy_name} @ {self.router}"

    def describe(self) -> str:
        return f"{self.trace_name} @ {self.policy_name} @ {self.router}"

    def check(self) -> None:
        """The policy and the router exist and take their parameters."""
        from fairway.fleet.routers import make_router
        from fairway.options import FairwayOptions

        FairwayOptions.for_replay(self.policy, self.policy_params)
        make_router(self.router, self.num_nodes, 0, **dict(self.router_params))

    def run(self) -> FleetResult:
        from fairway.fleet.replay import fleet_replay

        return fleet_replay(
            self.trace, self.policy, num_nodes=self.num_nodes, router=self.router,
            router_params=dict(self.router_params) or None,
            policy_params=dict(self.policy_params), trace_name=self.trace_name,
            **dict(self.options),
        )


@dataclass(frozen=True)
class FleetBenchConfig:
    """`fairway bench`'s flags with `--nodes`: the bench's own, and the fleet's.

    Attributes:
        bench: traces, policies, engine size, output, workers (`fairway bench`'s flags).
        num_nodes: `--nodes`.
        routers: `--router` (repeatable).
        loads: `--load` (repeatable): each node's load, a multiple of its capacity.
        signals: the router's delays.
    """

    bench: BenchConfig
    num_nodes: int
    routers: tuple[str, ...]
    loads: tuple[float, ...] = (1.0,)
    signals: FleetSignals = FleetSignals()


@dataclass
class FleetBenchOutcome:
    """What a fleet bench run produced."""

    out_dir: Path
    results: list[FleetResult]
    markdown: str
    paths: dict[str, Path] = field(default_factory=dict)
    wall_s: float = 0.0


def check_routers(names: Sequence[str], num_nodes: int) -> list[str]:
    """The router names, each built once to check it (an unknown one lists the known)."""
    from fairway.fleet.routers import make_router

    if len(set(names)) != len(names):
        raise FairwayConfigError(f"a router is given twice: {list(names)}")
    for name in names:
        make_router(name, num_nodes, 0)
    return list(names)


def fleet_jobs(config: FleetBenchConfig) -> tuple[list[FleetJob], list[tuple[str, Trace]]]:
    """The grid's jobs (trace x load x router x policy) and its traces, checked."""
    from fairway.fleet.traces import fleet_trace_label, load_fleet_trace, node_blocks
    from fairway.replay.bench import options_by_policy, ordered_policies, replay_options
    from fairway.replay.engine_sizing import check_prompt_lengths

    bench = config.bench
    if bench.kv_offloading_gib is not None:
        raise FairwayConfigError("--kv-offloading-size is not modelled in the fleet replay "
                                 "(--nodes); drop one of them")
    routers = check_routers(config.routers, config.num_nodes)
    selected = ordered_policies(bench.policies)
    options = replay_options(bench)
    fairway = options_by_policy(bench, selected)
    options["signals"] = config.signals
    traces: list[tuple[str, Trace]] = []
    trace_options: dict[str, dict[str, Any]] = {}
    for spec in bench.traces:
        for load in config.loads:
            label = fleet_trace_label(spec, bench.quick, config.num_nodes, load)
            if any(label == name for name, _ in traces):
                raise FairwayConfigError(f"trace {label!r} given twice")
            trace = load_fleet_trace(spec, num_nodes=config.num_nodes, load=load,
                                     quick=bench.quick, cache_dir=bench.trace_cache)
            check_prompt_lengths(trace, label)
            traces.append((label, trace))
            trace_options[label] = dict(options)
            if bench.num_blocks is None:  # a node's memory: the single replay's at its rate
                blocks = node_blocks(
                    spec, trace, load=load, quick=bench.quick, cache_dir=bench.trace_cache,
                    cache_fraction=bench.cache_fraction,
                    max_num_batched_tokens=bench.max_num_batched_tokens,
                )
                if blocks is not None:
                    trace_options[label]["num_blocks"] = blocks
    jobs = [
        FleetJob(name, trace, fairway[policy], router, config.num_nodes,
                 options=trace_options[name])
        for name, trace in traces
        for router in routers
        for policy in selected
    ]
    return jobs, traces


def run_fleet_bench(config: FleetBenchConfig) -> FleetBenchOutcome:
    """Run the grid, save every result as it arrives, write the table; return them."""
    from fairway.replay.bench import new_out_dir
    from fairway.replay.sweep import check_jobs, run_jobs

    started = time.perf_counter()
    bench = config.bench
    jobs, traces = fleet_jobs(config)
    check_jobs(jobs)  # bad names or parameters fail before anything is written
    out_dir = new_out_dir(bench.out, "bench")
    raw_dir = out_dir / "replays"
    logger.info("bench: %d fleet replays (%d traces x %d routers x %d policies) on %d nodes "
                "-> %s", len(jobs), len(traces), len(config.routers),
                len(jobs) // max(1, len(traces) * len(config.routers)), config.num_nodes,
                out_dir)
    found = run_jobs(
        jobs, workers=bench.workers, ray_address=bench.ray,
        fresh_processes=bench.fresh_processes, progress=bench.progress,
        on_result=lambda r: fleet_io.save(r, raw_dir / fleet_io.file_name(r)),
    )
    return write_fleet_report(found, out_dir, config, time.perf_counter() - started)


# --- the table ------------------------------------------------------------------------------------


def _s(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds:.2f}"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def fleet_markdown(rows: Sequence[Mapping[str, Any]], num_nodes: int) -> str:
    """One table per trace: a row per router x policy."""
    lines = [
        f"# Fleet replay: {num_nodes} nodes\n",
        "KV blocks per node: `--num-blocks`, else what a single replay of the preset at one "
        "node's rate gives its engine (a trace file: `--cache-fraction` / N of its reusable "
        "content). "
        "TTFT in seconds, fleet-wide; hit share: requests with at least half their prompt "
        "cached at admission; tokens: prefill tokens computed (millions); balance: the busiest "
        "node over the mean (1.00: even), by tokens computed and by requests; worst node p99: "
        "the highest p99 of any node.\n",
    ]
    for trace in dict.fromkeys(row["trace"] for row in rows):
        blocks = next(r["kv_blocks"] for r in rows if r["trace"] == trace)
        lines += [
            f"## {trace} ({blocks} kv blocks per node)\n",
            "| router | policy | requests | errors | p50 | p90 | p99 | hit share | tokens (M) | "
            "balance tokens | balance requests | worst node p99 |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['router']} | {r['policy']} | {r['requests']} | {r['errors']} | "
            f"{_s(r['ttft_p50_s'])} | {_s(r['ttft_p90_s'])} | {_s(r['ttft_p99_s'])} | "
            f"{_share(r['hit_share'])} | {r['tokens_computed'] / 1e6:.2f} | "
            f"{_ratio(r['balance_tokens'])} | {_ratio(r['balance_requests'])} | "
            f"{_s(r['node_p99_max_s'])} |"
            for r in rows if r["trace"] == trace
        ]
        lines.append("")
    return "\n".join(lines)


def write_fleet_report(results: Sequence[FleetResult], out_dir: Path,
                       config: FleetBenchConfig | None, wall_s: float) -> FleetBenchOutcome:
    """`fleet.md`, `fleet.json` (the rows and each node's figures) and `bench.json`."""
    from fairway.replay.bench import environment_info, write_json

    rows = [r.summary() for r in results]
    num_nodes = results[0].num_nodes if results else (config.num_nodes if config else 0)
    markdown = fleet_markdown(rows, num_nodes)
    paths = {"markdown": out_dir / "fleet.md"}
    paths["markdown"].write_text(markdown, encoding="utf-8")
    paths["json"] = write_json(out_dir / "fleet.json", {
        "format": "fairway.fleet_report/1",
        "rows": rows,
        "nodes": {f"{r.replay.trace_name}--{r.replay.policy}--{r.router}":
                  [asdict(n) for n in r.nodes] for r in results},
    })
    paths["bench"] = write_json(out_dir / "bench.json", {
        "config": asdict(config) if config is not None else None,
        "environment": environment_info(),
        "wall_s": round(wall_s, 3),
        "settings": {f"{r.replay.trace_name}--{r.replay.policy}--{r.router}": r.replay.settings
                     for r in results},
    })
    return FleetBenchOutcome(out_dir, list(results), markdown, paths, wall_s)
