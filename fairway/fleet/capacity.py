"""Capacity at an SLO: the highest load a fleet serves within a TTFT SLO, and the fewest nodes.

Two searches over fleet replays (`fairway.fleet.replay.fleet_replay`), one per router x policy
cell, each probe one replay:

* `capacity_grid` / `capacity_at_slo`: N nodes fixed, the load varied. The load is
  `load_fleet_trace`'s: each node's share of the offered rate as a multiple of one node's
  capacity (the trace is the preset built at N x capacity x load). Bracketing from `start_load`
  (x `growth` up while the SLO is met, / `growth` down while it is missed, within
  [`min_load`, `max_load`]), then bisection until the bracket is at most `tolerance` wide. The
  capacity is the highest load that met the SLO: a lower bound, within `tolerance` of the lowest
  load that missed it.
* `nodes_grid` / `nodes_needed`: the offered rate fixed, the nodes varied. The trace is built
  once at L single-node capacities (`load_fleet_trace(spec, num_nodes=1, load=L)`: its rate is
  num_nodes x load = L) and replayed on N nodes: each node then gets L / N. Doubling from
  ceil(L) nodes until the SLO is met (up to `max_nodes`), halving below while it is, then
  integer bisection: the answer is the fewest nodes that met it.

Both assume the SLO's verdict is monotone: a fleet that meets the SLO at a load meets it at
every lower load, and with N nodes at every N' > N at the same rate. Replays are deterministic
but a preset rebuilt at another rate is another draw of its arrivals, and a router's choices
change with the load, so near the boundary this holds only roughly: the search reports *a*
boundary (a load that met, one within `tolerance` above that missed), and every probe it ran,
so a reader can see the evidence. A cell that misses the SLO at `min_load` (or on `max_nodes`)
reports status "never" and no number; one that still meets it at `max_load` reports
"at-least" with `max_load` as a lower bound.

The hardware is fixed across a search, as a real fleet's is: each node gets the KV cache that
`fairway bench --nodes` gives a node at load 1 (`node_memory`: what a single replay of the preset
at one node's capacity gives its engine, `fairway.fleet.traces.node_blocks`) at every load and
on any number of nodes (never below a probe trace's own floor: its longest prompt must fit), or
the `num_blocks` given. Sizing per load, as `fairway bench --nodes --load` does, would give a
busier fleet more memory (the agent sessions' reusable content doubles with the load).

The SLO (`SLO`) is over the fleet-wide TTFT of every request of the trace: a request that failed
(no first token) counts as a TTFT above every bound, so failures count against both
percentiles, and a probe with more than 1% failures misses the default p99.

The cells of a search round run in parallel through `fairway.replay.sweep.run_jobs` (local
worker processes, or Ray), one `FleetJob` per probe; `evaluate` replaces that (tests inject a
fake replay). Must not import vllm.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fairway.errors import FairwayConfigError
from fairway.fleet.result import FleetResult
from fairway.replay.results import ReplayResult

if TYPE_CHECKING:
    from fairway.traces.format import Trace

logger = logging.getLogger(__name__)

#: The issue's default SLO: p99 TTFT at most 10 s and median at most 1 s.
DEFAULT_P99_S = 10.0
DEFAULT_MEDIAN_S = 1.0
#: Bisection stops when the bracket is at most this wide (in load, x one node's capacity).
DEFAULT_TOLERANCE = 0.05
DEFAULT_START_LOAD = 1.0
DEFAULT_MIN_LOAD = 0.05
DEFAULT_MAX_LOAD = 4.0
#: Bracketing steps: x growth up, / growth down.
DEFAULT_GROWTH = 2.0

#: Search outcomes: the boundary was bracketed; the SLO was never met (no number); it was met at
#: the largest value tried (the number is a lower bound).
FOUND, NEVER, AT_LEAST = "found", "never", "at-least"


class CapacityError(FairwayConfigError):
    """A bad SLO, load, tolerance or node count for a capacity search."""


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value > 0):
        raise CapacityError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CapacityError(f"{name} must be an integer >= 1, got {value!r}")
    return value


# --- the SLO --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SLO:
    """A TTFT SLO over a whole fleet replay: p99 <= `p99_s` and median <= `median_s`."""

    p99_s: float = DEFAULT_P99_S
    median_s: float = DEFAULT_MEDIAN_S

    def __post_init__(self) -> None:
        _positive("the SLO's p99 (s)", self.p99_s)
        _positive("the SLO's median (s)", self.median_s)
        if self.median_s > self.p99_s:
            raise CapacityError(f"the SLO's median bound ({self.median_s:g} s) is above its p99 "
                                f"bound ({self.p99_s:g} s)")

    def describe(self) -> str:
        return f"TTFT p99 <= {self.p99_s:g} s, median <= {self.median_s:g} s"


@dataclass(frozen=True)
class SLOCheck:
    """One replay against an SLO.

    Attributes:
        requests: requests in the replay.
        failed: of those, the ones without a first token (TTFT above every bound).
        ttft_p50_s / ttft_p99_s: the percentiles with failures counted as infinite TTFTs; None
            when failures reach the percentile (or no request).
        meets: both percentiles within the SLO.
    """

    requests: int
    failed: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    meets: bool


def _percentile(ordered: Sequence[float], q: float) -> float:
    """numpy's linear ("type 7") percentile of sorted values that may end in +inf: inf when the
    interpolation touches an infinite value with a non-zero weight."""
    pos = q / 100 * (len(ordered) - 1)
    lo = math.floor(pos)
    frac = pos - lo
    if frac == 0:
        return ordered[lo]
    a, b = ordered[lo], ordered[lo + 1]
    return math.inf if math.isinf(b) else a + (b - a) * frac


def check(result: FleetResult | ReplayResult, slo: SLO) -> SLOCheck:
    """`result`'s fleet-wide TTFT percentiles against `slo`, failed requests as infinite."""
    replay = result.replay if isinstance(result, FleetResult) else result
    ttfts = sorted(math.inf if r.ttft_s is None else r.ttft_s for r in replay.requests)
    if not ttfts:
        return SLOCheck(0, 0, None, None, False)
    p50, p99 = _percentile(ttfts, 50), _percentile(ttfts, 99)
    failed = sum(math.isinf(t) for t in ttfts)
    return SLOCheck(len(ttfts), failed, p50 if math.isfinite(p50) else None,
                    p99 if math.isfinite(p99) else None,
                    p50 <= slo.median_s and p99 <= slo.p99_s)


def meets(result: FleetResult | ReplayResult, slo: SLO) -> bool:
    """Whether `result` meets `slo` (`check`)."""
    return check(result, slo).meets


# --- the searches ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One router x policy of a grid."""

    router: str
    policy: str

    @property
    def label(self) -> str:
        return f"{self.policy} @ {self.router}"


@dataclass(frozen=True)
class Probe:
    """One replay of a search: `cell` on `num_nodes` nodes, offered `rate` single-node
    capacities (each node's load: rate / num_nodes)."""

    cell: Cell
    num_nodes: int
    rate: float

    @property
    def load(self) -> float:
        return self.rate / self.num_nodes


@dataclass(frozen=True)
class ProbeRecord:
    """A probe's value (load or nodes), its SLO check and its fleet table row."""

    value: float
    check: SLOCheck
    summary: Mapping[str, Any]


@dataclass
class Outcome:
    """A cell's search: what it found and every probe on the way.

    Attributes:
        cell: the router x policy.
        kind: "load" (`capacity_grid`) or "nodes" (`nodes_grid`).
        status: `FOUND`, `NEVER` (no value meets the SLO: `value` None) or `AT_LEAST` (the
            largest load tried met it: `value` is a lower bound).
        value: the capacity (highest load that met) or the fewest nodes that met.
        met / missed: the bracket: the best value that met, the nearest that missed (None:
            none did).
        probes: in the order run.
    """

    cell: Cell
    kind: str
    status: str
    value: float | None
    met: float | None
    missed: float | None
    probes: list[ProbeRecord] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "router": self.cell.router, "policy": self.cell.policy, "kind": self.kind,
            "status": self.status, "value": self.value, "met": self.met, "missed": self.missed,
            "probes": [{"value": p.value, **asdict(p.check), "summary": dict(p.summary)}
                       for p in self.probes],
        }


class LoadSearch:
    """Bracketing then bisection over the load; the verdict assumed non-increasing in it."""

    kind = "load"

    def __init__(self, start: float, min_load: float, max_load: float, tolerance: float,
                 growth: float) -> None:
        self.start, self.min_load, self.max_load = start, min_load, max_load
        self.tolerance, self.growth = tolerance, growth
        self.met: float | None = None  # highest load that met the SLO
        self.missed: float | None = None  # lowest load that missed it

    def next(self) -> float | None:
        """The next load to probe, or None when done."""
        met, missed = self.met, self.missed
        if met is None and missed is None:
            return self.start
        if missed is None:
            assert met is not None
            return None if met >= self.max_load else min(met * self.growth, self.max_load)
        if met is None:
            return None if missed <= self.min_load else max(missed / self.growth, self.min_load)
        if missed - met <= self.tolerance:
            return None
        return round((met + missed) / 2, 9)

    def record(self, value: float, ok: bool) -> None:
        if ok:
            self.met = value if self.met is None else max(self.met, value)
        else:
            self.missed = value if self.missed is None else min(self.missed, value)

    def outcome(self, cell: Cell, probes: list[ProbeRecord]) -> Outcome:
        if self.met is None:
            return Outcome(cell, self.kind, NEVER, None, None, self.missed, probes)
        status = AT_LEAST if self.missed is None else FOUND
        return Outcome(cell, self.kind, status, self.met, self.met, self.missed, probes)


class NodeSearch:
    """Doubling then integer bisection over the nodes; the verdict assumed non-decreasing."""

    kind = "nodes"

    def __init__(self, start: int, max_nodes: int) -> None:
        self.start, self.max_nodes = start, max_nodes
        self.missed = 0  # most nodes that missed (0 nodes serve nothing)
        self.met: int | None = None  # fewest nodes that met

    def next(self) -> int | None:
        if self.met is None:
            if self.missed == 0:
                return self.start
            return None if self.missed >= self.max_nodes else min(self.missed * 2,
                                                                  self.max_nodes)
        return None if self.met - self.missed <= 1 else (self.met + self.missed) // 2

    def record(self, value: float, ok: bool) -> None:
        nodes = int(value)
        if ok:
            self.met = nodes if self.met is None else min(self.met, nodes)
        else:
            self.missed = max(self.missed, nodes)

    def outcome(self, cell: Cell, probes: list[ProbeRecord]) -> Outcome:
        if self.met is None:
            return Outcome(cell, self.kind, NEVER, None, None, self.missed, probes)
        return Outcome(cell, self.kind, FOUND, self.met, self.met, self.missed or None, probes)


#: Replays a round's probes, results in probe order (`FleetEvaluator`, or a fake in tests).
Evaluate = Callable[[Sequence[Probe]], Sequence[FleetResult]]


#: Called after each search round with the outcomes so far (a cell not done yet shows its
#: bracket as it stands), e.g. to save them: a long search killed midway keeps its rounds.
OnRound = Callable[[int, list["Outcome"]], object]


def run_searches(searches: Sequence[tuple[Cell, LoadSearch | NodeSearch]],
                 probe_of: Callable[[Cell, float], Probe], evaluate: Evaluate,
                 slo: SLO, on_round: OnRound | None = None) -> list[Outcome]:
    """Advance every cell's search in rounds: each round replays one probe of every cell that is
    not done, together (`evaluate`), until none has a probe left."""
    records: list[list[ProbeRecord]] = [[] for _ in searches]
    round_no = 0
    while True:
        pending = [(i, x) for i, (_, s) in enumerate(searches) if (x := s.next()) is not None]
        if not pending:
            break
        round_no += 1
        probes = [probe_of(searches[i][0], x) for i, x in pending]
        logger.info("capacity search round %d: %d probes", round_no, len(probes))
        results = list(evaluate(probes))
        if len(results) != len(probes):
            raise CapacityError(f"the evaluator returned {len(results)} results for "
                                f"{len(probes)} probes")
        for (i, x), result in zip(pending, results, strict=True):
            verdict = check(result, slo)
            searches[i][1].record(x, verdict.meets)
            records[i].append(ProbeRecord(x, verdict, result.summary()))
        if on_round is not None:
            on_round(round_no, [s.outcome(c, list(records[i]))
                                for i, (c, s) in enumerate(searches)])
    return [s.outcome(cell, records[i]) for i, (cell, s) in enumerate(searches)]


# --- replays --------------------------------------------------------------------------------------


def fleet_trace_at(spec: str, rate: float, *, quick: bool = False,
                   cache_dir: str | None = None) -> Trace:
    """Preset `spec` at `rate` single-node capacities: `load_fleet_trace` with num_nodes 1 and
    load `rate` (its rate is num_nodes x load), the same trace for any number of nodes."""
    from fairway.fleet.traces import load_fleet_trace

    return load_fleet_trace(spec, num_nodes=1, load=rate, quick=quick, cache_dir=cache_dir)


def node_memory(spec: str, trace: Trace, options: Mapping[str, Any], *, quick: bool = False,
                cache_dir: str | None = None) -> int | None:
    """Each node's KV blocks for a probe on `trace` (preset `spec` at some rate):
    `options["num_blocks"]` as given, else `node_blocks` at load 1 with the options' cache
    fraction and step budget (the same for every rate), at least `trace`'s floor. None for a
    trace file (the fleet replay sizes it)."""
    from fairway.fleet.traces import node_blocks
    from fairway.replay.engine_sizing import DEFAULT_BATCHED_TOKENS, DEFAULT_CACHE_FRACTION

    given = options.get("num_blocks")
    if given is not None:
        return int(given)
    return node_blocks(
        spec, trace, load=1.0, quick=quick, cache_dir=cache_dir,
        cache_fraction=options.get("cache_fraction", DEFAULT_CACHE_FRACTION),
        block_size=options.get("block_size", 16),
        max_num_batched_tokens=options.get("max_num_batched_tokens", DEFAULT_BATCHED_TOKENS),
    )


@dataclass
class FleetEvaluator:
    """Replays probes as `FleetJob`s through the sweep runner (`run_jobs`), each trace built and
    each node's memory sized (`node_memory`) once per rate.

    Attributes:
        spec: the preset (or trace file: then only its own rate, 1).
        quick, cache_dir: as `load_fleet_trace`.
        options: other keyword arguments of `fleet_replay` (profile, max_num_batched_tokens,
            num_blocks, signals, ...).
        workers, ray, progress: as `run_jobs`.
    """

    spec: str
    quick: bool = False
    cache_dir: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    workers: int = 2
    ray: str | None = None
    progress: bool = False
    _traces: dict[float, tuple[Trace, int | None]] = field(default_factory=dict, repr=False)

    def trace(self, rate: float) -> tuple[Trace, int | None]:
        """The trace at `rate` single-node capacities and each node's KV blocks on it."""
        if rate not in self._traces:
            trace = fleet_trace_at(self.spec, rate, quick=self.quick, cache_dir=self.cache_dir)
            blocks = node_memory(self.spec, trace, self.options, quick=self.quick,
                                 cache_dir=self.cache_dir)
            logger.info("%s at %g capacities: %d requests, %s KV blocks per node", self.spec,
                        rate, len(trace.requests), blocks)
            self._traces[rate] = trace, blocks
        return self._traces[rate]

    def jobs(self, probes: Sequence[Probe]) -> list[Any]:
        from fairway.fleet.bench import FleetJob
        from fairway.fleet.traces import fleet_trace_label

        jobs = []
        for p in probes:
            trace, blocks = self.trace(p.rate)
            options = dict(self.options)
            if blocks is not None:
                options["num_blocks"] = blocks
            name = fleet_trace_label(self.spec, self.quick, p.num_nodes, round(p.load, 6))
            jobs.append(FleetJob(name, trace, p.cell.policy, p.cell.router, p.num_nodes,
                                 options=options))
        return jobs

    def __call__(self, probes: Sequence[Probe]) -> list[FleetResult]:
        from fairway.replay.sweep import run_jobs

        return run_jobs(self.jobs(probes), workers=self.workers, ray_address=self.ray,
                        progress=self.progress)


def _cells(spec: str, routers: Sequence[str], policies: Sequence[str]) -> list[Cell]:
    """The grid's cells; a trace file is refused (a search rebuilds the trace at each rate)."""
    if Path(spec).exists():
        raise CapacityError(f"{spec} is a trace file, replayed only at its own rate; a capacity "
                            "search rebuilds its trace at each rate: give a preset")
    if not routers or not policies:
        raise CapacityError("a capacity search needs at least one router and one policy")
    cells = [Cell(r, p) for r in routers for p in policies]
    if len(set(cells)) != len(cells):
        raise CapacityError(f"a router or policy is given twice: {list(routers)}, "
                            f"{list(policies)}")
    return cells


def capacity_grid(
    trace_spec: str, routers: Sequence[str], policies: Sequence[str], num_nodes: int,
    slo: SLO | None = None, *, tolerance: float = DEFAULT_TOLERANCE,
    start_load: float = DEFAULT_START_LOAD, min_load: float = DEFAULT_MIN_LOAD,
    max_load: float = DEFAULT_MAX_LOAD, growth: float = DEFAULT_GROWTH, quick: bool = False,
    cache_dir: str | None = None, options: Mapping[str, Any] | None = None, workers: int = 2,
    ray: str | None = None, progress: bool = False, evaluate: Evaluate | None = None,
    on_round: OnRound | None = None,
) -> list[Outcome]:
    """Each router x policy's capacity at `slo` on `num_nodes` nodes (module docstring).

    Args:
        trace_spec: a preset (rebuilt at each probe's rate).
        routers, policies: registry names; every pair is a cell, searched in parallel.
        num_nodes: the fleet.
        slo: the SLO (None: the default `SLO()`).
        tolerance: the bracket's width at which bisection stops (load units).
        start_load, min_load, max_load, growth: the bracketing.
        quick, cache_dir: as `load_fleet_trace`.
        options: other keyword arguments of `fleet_replay` (cache_fraction and
            max_num_batched_tokens size each node's memory once, `node_memory`).
        workers, ray, progress: as `fairway.replay.sweep.run_jobs`.
        evaluate: replays a round's probes (None: `FleetEvaluator`).
        on_round: called after each round with the outcomes so far (`OnRound`).

    Returns:
        One `Outcome` per cell, routers outer, policies inner.

    Raises:
        CapacityError: bad loads, tolerance, growth or nodes, an empty grid, or a trace file.
    """
    _count("num_nodes", num_nodes)
    slo = slo or SLO()
    tolerance = _positive("tolerance", tolerance)
    min_load, max_load = _positive("min_load", min_load), _positive("max_load", max_load)
    start_load = _positive("start_load", start_load)
    if _positive("growth", growth) <= 1:
        raise CapacityError(f"growth must be > 1, got {growth!r}")
    if not min_load <= start_load <= max_load:
        raise CapacityError(f"the loads must satisfy min_load <= start_load <= max_load, got "
                            f"{min_load:g}, {start_load:g}, {max_load:g}")
    cells = _cells(trace_spec, routers, policies)
    if evaluate is None:
        evaluate = FleetEvaluator(trace_spec, quick, cache_dir, dict(options or {}), workers,
                                  ray, progress)
    searches = [(c, LoadSearch(start_load, min_load, max_load, tolerance, growth))
                for c in cells]
    return run_searches(searches, lambda c, x: Probe(c, num_nodes, num_nodes * x), evaluate,
                        slo, on_round)


def capacity_at_slo(trace_spec: str, router: str, policy: str, num_nodes: int,
                    slo: SLO | None = None, **kwargs: Any) -> Outcome:
    """One cell's capacity at `slo` (`capacity_grid`'s keyword arguments)."""
    return capacity_grid(trace_spec, [router], [policy], num_nodes, slo, **kwargs)[0]


def nodes_grid(
    trace_spec: str, routers: Sequence[str], policies: Sequence[str], offered_load: float,
    slo: SLO | None = None, *, max_nodes: int | None = None, quick: bool = False,
    cache_dir: str | None = None, options: Mapping[str, Any] | None = None, workers: int = 2,
    ray: str | None = None, progress: bool = False, evaluate: Evaluate | None = None,
    on_round: OnRound | None = None,
) -> list[Outcome]:
    """Each router x policy's fewest nodes that meet `slo` at `offered_load` single-node
    capacities (module docstring): the trace is built once at that rate; each node's cache is
    a node's at load 1 (`node_memory`), so more nodes hold more.

    Args:
        max_nodes: the most nodes tried (None: 4 x ceil(offered_load)); a cell that misses the
            SLO there reports `NEVER`.
        The rest: as `capacity_grid`.

    Raises:
        CapacityError: a bad offered load or max_nodes, an empty grid, or a trace file.
    """
    rate = _positive("offered_load", offered_load)
    slo = slo or SLO()
    start = math.ceil(rate)
    max_nodes = 4 * start if max_nodes is None else _count("max_nodes", max_nodes)
    cells = _cells(trace_spec, routers, policies)
    if evaluate is None:
        evaluate = FleetEvaluator(trace_spec, quick, cache_dir, dict(options or {}), workers,
                                  ray, progress)
    searches = [(c, NodeSearch(min(start, max_nodes), max_nodes)) for c in cells]
    return run_searches(searches, lambda c, n: Probe(c, int(n), rate), evaluate, slo,
                        on_round)


def nodes_needed(trace_spec: str, router: str, policy: str, offered_load: float,
                 slo: SLO | None = None, **kwargs: Any) -> Outcome:
    """One cell's fewest nodes at `offered_load` (`nodes_grid`'s keyword arguments)."""
    return nodes_grid(trace_spec, [router], [policy], offered_load, slo, **kwargs)[0]


def ratio(outcomes: Sequence[Outcome], router: str, policy: str,
          reference: str = "fcfs") -> float | None:
    """`policy`'s capacity over `reference`'s behind `router`: None when either has no number
    (`NEVER`) or either is missing (an `AT_LEAST` value enters as its lower bound)."""
    found = {(o.cell.router, o.cell.policy): o.value for o in outcomes}
    a, b = found.get((router, policy)), found.get((router, reference))
    return None if a is None or b is None or b <= 0 else a / b
