"""Capacity at an SLO: the SLO check, the bisection over load, the nodes search, their errors;
every replay faked (an injected evaluator), so no engine runs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fairway.fleet import capacity
from fairway.fleet.capacity import (
    AT_LEAST,
    FOUND,
    NEVER,
    SLO,
    CapacityError,
    Cell,
    FleetEvaluator,
    Probe,
    capacity_at_slo,
    capacity_grid,
    check,
    meets,
    nodes_grid,
    nodes_needed,
    ratio,
)
from fairway.fleet.result import FleetResult
from fairway.fleet.traces import load_fleet_trace
from fairway.replay.engine_sizing import size_cache
from fairway.replay.results import ReplayResult, RequestResult
from fairway.traces.format import Trace, TraceHeader, TraceRequest


def replay_of(ttfts: list[float | None]) -> ReplayResult:
    """A replay whose requests have these TTFTs (None: failed)."""
    requests = [
        RequestResult(f"r{i}", 1.0, None, 100, 1.0, None if t is None else 1.0 + t, 0,
                      None if t is not None else "failed")
        for i, t in enumerate(ttfts)
    ]
    return ReplayResult("p", "t", {}, requests, 0.0, None)


def fleet_of(ttfts: list[float | None], router: str = "r", nodes: int = 1) -> FleetResult:
    return FleetResult(replay_of(ttfts), router, nodes)


# --- the SLO --------------------------------------------------------------------------------------


def test_percentiles_are_numpys_linear_ones_on_answered_requests():
    ttfts = [0.1 * i ** 1.5 for i in range(37)]
    got = check(replay_of(ttfts), SLO())
    p50, p99 = np.percentile(ttfts, [50, 99])
    assert got.ttft_p50_s == pytest.approx(p50)
    assert got.ttft_p99_s == pytest.approx(p99)
    assert (got.requests, got.failed) == (37, 0)


def test_both_bounds_must_hold():
    slo = SLO(p99_s=10.0, median_s=1.0)
    assert meets(fleet_of([0.5] * 99 + [9.0]), slo)
    assert not meets(fleet_of([1.5] * 100), slo)  # median over
    assert not meets(fleet_of([0.5] * 90 + [11.0] * 10), slo)  # p99 over
    assert meets(fleet_of([1.5] * 100), SLO(p99_s=10.0, median_s=2.0))


def test_failed_requests_count_as_infinite_ttfts():
    # 101 requests: the p99 is the 100th smallest exactly; one failure stays above it.
    one = check(replay_of([0.5] * 100 + [None]), SLO())
    assert one.meets and one.failed == 1 and one.ttft_p99_s == pytest.approx(0.5)
    # two failures reach the p99: no number, a miss, however fast the rest was
    two = check(replay_of([0.1] * 99 + [None, None]), SLO())
    assert not two.meets and two.ttft_p99_s is None and two.ttft_p50_s == pytest.approx(0.1)
    # a replay where every request failed misses, and so does an empty one
    assert not meets(replay_of([None] * 5), SLO())
    assert not meets(replay_of([]), SLO())


@pytest.mark.parametrize("kwargs", [
    {"p99_s": 0.0}, {"p99_s": -1.0}, {"median_s": math.nan}, {"p99_s": math.inf},
    {"median_s": True}, {"p99_s": "10"}, {"p99_s": 1.0, "median_s": 2.0},
])
def test_bad_slos_are_refused(kwargs):
    with pytest.raises(CapacityError):
        SLO(**kwargs)


# --- the load search ------------------------------------------------------------------------------


class FakeFleet:
    """A fleet whose cell `(router, policy)` meets the default SLO exactly up to load
    `boundary[cell]`: every request's TTFT is load / boundary seconds (the median bound binds).
    Records each round's probes."""

    def __init__(self, boundary: dict[tuple[str, str], float]) -> None:
        self.boundary = boundary
        self.rounds: list[list[Probe]] = []

    def __call__(self, probes):
        self.rounds.append(list(probes))
        return [fleet_of([p.load / self.boundary[p.cell.router, p.cell.policy]] * 50,
                         p.cell.router, p.num_nodes) for p in probes]


@pytest.mark.parametrize("boundary", [0.37, 1.0, 1.63, 2.9, 0.051])
def test_bisection_brackets_the_boundary_within_the_tolerance(boundary):
    fake = FakeFleet({("rr", "fcfs"): boundary})
    got = capacity_at_slo("spec", "rr", "fcfs", 8, tolerance=0.05, evaluate=fake)
    assert got.status == FOUND
    assert got.met is not None and got.missed is not None
    assert got.met <= boundary < got.missed
    assert got.missed - got.met <= 0.05
    assert got.value == got.met
    # every probe's verdict is the fake's, at the load it says, on 8 nodes
    for record, probe in zip(got.probes, [r[0] for r in fake.rounds], strict=True):
        assert probe.num_nodes == 8 and probe.load == pytest.approx(record.value)
        assert record.check.meets == (record.value <= boundary)
    assert got.probes[0].value == 1.0  # starts at the start load


def test_a_finer_tolerance_takes_more_probes_and_lands_closer():
    coarse = capacity_at_slo("s", "rr", "fcfs", 4, tolerance=0.2,
                             evaluate=FakeFleet({("rr", "fcfs"): 1.3}))
    fine = capacity_at_slo("s", "rr", "fcfs", 4, tolerance=0.01,
                           evaluate=FakeFleet({("rr", "fcfs"): 1.3}))
    assert len(fine.probes) > len(coarse.probes)
    assert 1.3 - fine.value <= 0.01 < 1.3 - coarse.value <= 0.2


def test_cells_are_probed_together_one_probe_each_per_round():
    bounds = {("a", "fcfs"): 0.5, ("a", "fairway"): 1.2, ("b", "fcfs"): 3.0,
              ("b", "fairway"): 0.01}
    fake = FakeFleet(bounds)
    got = capacity_grid("s", ["a", "b"], ["fcfs", "fairway"], 4, evaluate=fake)
    assert [(o.cell.router, o.cell.policy) for o in got] == list(bounds)
    assert len(fake.rounds[0]) == 4  # the first round asks every cell at once
    for probes in fake.rounds:
        assert len({p.cell for p in probes}) == len(probes)
    assert sum(len(r) for r in fake.rounds) == sum(len(o.probes) for o in got)
    for o in got:
        b = bounds[o.cell.router, o.cell.policy]
        if o.status == FOUND:
            assert o.met <= b < o.missed


def test_each_round_reports_the_outcomes_so_far():
    seen = []
    final = capacity_at_slo("s", "rr", "fcfs", 4, tolerance=0.1,
                            evaluate=FakeFleet({("rr", "fcfs"): 1.3}),
                            on_round=lambda n, found: seen.append((n, found[0])))
    assert [n for n, _ in seen] == list(range(1, len(final.probes) + 1))
    assert [len(o.probes) for _, o in seen] == [n for n, _ in seen]
    assert seen[0][1].status == AT_LEAST and seen[0][1].value == 1.0  # after one round: >= 1
    assert seen[-1][1].value == final.value and seen[-1][1].status == FOUND


def test_a_cell_that_never_meets_the_slo_reports_no_number():
    fake = FakeFleet({("rr", "fcfs"): 0.01, ("rr", "fairway"): 1.5})
    got = capacity_grid("s", ["rr"], ["fcfs", "fairway"], 8, min_load=0.05, evaluate=fake)
    fcfs, fairway = got
    assert fcfs.status == NEVER and fcfs.value is None and fcfs.met is None
    assert fcfs.missed == 0.05  # it went down to min_load and missed there too
    assert all(not p.check.meets for p in fcfs.probes)
    assert ratio(got, "rr", "fairway") is None  # no ratio against a missing number
    assert fairway.status == FOUND


def test_a_cell_that_meets_at_max_load_reports_a_lower_bound():
    got = capacity_at_slo("s", "rr", "fcfs", 2, max_load=3.0,
                          evaluate=FakeFleet({("rr", "fcfs"): 10.0}))
    assert got.status == AT_LEAST and got.value == 3.0 and got.missed is None
    assert [p.value for p in got.probes] == [1.0, 2.0, 3.0]


def test_non_monotone_verdicts_still_end_between_a_met_and_a_missed_probe():
    """The search assumes monotone verdicts; where they are not, it reports *a* boundary
    (a load that met, one within the tolerance above that missed), not necessarily the
    highest load that meets."""

    class Bumpy(FakeFleet):
        def __call__(self, probes):
            self.rounds.append(list(probes))
            ok = [p.load <= 1.0 or 2.5 <= p.load <= 2.6 for p in probes]
            return [fleet_of([0.5 if good else 5.0] * 20) for good in ok]

    got = capacity_at_slo("s", "rr", "fcfs", 4, evaluate=Bumpy({}))
    assert got.status == FOUND and got.value == 1.0  # 2.5-2.6 is never seen
    by_value = {p.value: p.check.meets for p in got.probes}
    assert by_value[got.met] and not by_value[got.missed]


def test_ratio_is_policy_over_fcfs_behind_the_same_router():
    got = capacity_grid("s", ["a", "b"], ["fcfs", "fairway"], 4, tolerance=0.01,
                        evaluate=FakeFleet({("a", "fcfs"): 1.0, ("a", "fairway"): 1.5,
                                            ("b", "fcfs"): 2.0, ("b", "fairway"): 2.0}))
    assert ratio(got, "a", "fairway") == pytest.approx(1.5, abs=0.02)
    assert ratio(got, "b", "fairway") == pytest.approx(1.0, abs=0.01)
    assert ratio(got, "c", "fairway") is None


@pytest.mark.parametrize("kwargs", [
    {"tolerance": 0.0}, {"tolerance": -0.1}, {"min_load": 0.0}, {"max_load": math.nan},
    {"min_load": 2.0, "max_load": 1.0}, {"start_load": 5.0}, {"start_load": 0.01},
    {"growth": 1.0}, {"growth": 0.5},
])
def test_bad_search_settings_are_refused_before_any_replay(kwargs):
    fake = FakeFleet({})
    with pytest.raises(CapacityError):
        capacity_at_slo("s", "rr", "fcfs", 4, evaluate=fake, **kwargs)
    assert fake.rounds == []


def test_bad_grids_and_node_counts_are_refused():
    fake = FakeFleet({})
    for nodes in (0, -1, 1.5, True):
        with pytest.raises(CapacityError):
            capacity_at_slo("s", "rr", "fcfs", nodes, evaluate=fake)
    with pytest.raises(CapacityError):
        capacity_grid("s", [], ["fcfs"], 4, evaluate=fake)
    with pytest.raises(CapacityError):
        capacity_grid("s", ["rr", "rr"], ["fcfs"], 4, evaluate=fake)
    for load in (0, -2.0, math.inf):
        with pytest.raises(CapacityError):
            nodes_needed("s", "rr", "fcfs", load, evaluate=fake)
    with pytest.raises(CapacityError):
        nodes_needed("s", "rr", "fcfs", 4.0, max_nodes=0, evaluate=fake)
    assert fake.rounds == []


def test_a_trace_file_is_refused_it_cannot_be_rebuilt_at_another_rate(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("")
    with pytest.raises(CapacityError, match="give a preset"):
        capacity_at_slo(str(path), "rr", "fcfs", 4, evaluate=FakeFleet({}))
    with pytest.raises(CapacityError, match="give a preset"):
        nodes_needed(str(path), "rr", "fcfs", 2.0, evaluate=FakeFleet({}))


def test_an_evaluator_that_loses_results_is_an_error():
    with pytest.raises(CapacityError, match="1 probes"):
        capacity_at_slo("s", "rr", "fcfs", 4, evaluate=lambda probes: [])


# --- the nodes search -----------------------------------------------------------------------------


@pytest.mark.parametrize(("rate", "boundary"), [(8.0, 1.0), (8.0, 0.7), (3.0, 2.0),
                                                (5.0, 0.9), (2.0, 5.0)])
def test_nodes_needed_is_the_fewest_nodes_that_meet(rate, boundary):
    """Each node gets rate / N; a node meets up to `boundary`: the answer is ceil(rate / b)."""
    fake = FakeFleet({("rr", "fairway"): boundary})
    got = nodes_needed("s", "rr", "fairway", rate, evaluate=fake)
    want = math.ceil(rate / boundary)
    assert got.status == FOUND and got.value == want
    assert all(p.rate == rate for r in fake.rounds for p in r)  # one offered rate throughout
    assert fake.rounds[0][0].num_nodes == math.ceil(rate)  # starts with each node at load 1
    tried = {p.value: p.check.meets for p in got.probes}
    assert tried[want] and (want == 1 or tried.get(want - 1) is False)


def test_nodes_beyond_max_nodes_report_never():
    fake = FakeFleet({("rr", "fcfs"): 0.1, ("rr", "fairway"): 0.5})
    fcfs, fairway = nodes_grid("s", ["rr"], ["fcfs", "fairway"], 4.0, max_nodes=12,
                               evaluate=fake)
    assert fcfs.status == NEVER and fcfs.value is None and fcfs.missed == 12
    assert fairway.status == FOUND and fairway.value == 8


# --- the evaluator's jobs and traces --------------------------------------------------------


def test_the_offered_rate_is_num_nodes_times_load():
    """`load_fleet_trace` at N nodes x load L / N is the trace at 1 node x L: the nodes search
    replays one trace on any number of nodes."""
    one = capacity.fleet_trace_at("hit-heavy", 2.0, quick=True)
    four = load_fleet_trace("hit-heavy", num_nodes=4, load=0.5, quick=True)
    assert [r.arrival_s for r in one.requests] == [r.arrival_s for r in four.requests]
    assert len(one.requests) > len(load_fleet_trace("hit-heavy", num_nodes=1, quick=True)
                                   .requests)


def tiny_trace(prompt: int) -> Trace:
    reqs = tuple(TraceRequest(f"r{i}", float(i), (("doc", 512), (f"q{i}", prompt)))
                 for i in range(4))
    return Trace(TraceHeader("test", 0, None, {}, len(reqs)), reqs)


def test_jobs_keep_each_nodes_cache_fixed_but_never_below_a_traces_floor():
    """Each node's memory is a node's at load 1 (the single replay of the preset at one node's
    capacity) whatever the probe's rate, unless a prompt of the probe's trace needs more."""
    options = {"cache_fraction": 0.3, "max_num_batched_tokens": 2048}
    evaluator = FleetEvaluator("hit-heavy", quick=True, options=options)
    small, big = tiny_trace(100), tiny_trace(20_000)
    one_node = load_fleet_trace("hit-heavy", num_nodes=1, quick=True)
    single = size_cache(one_node, cache_fraction=0.3).num_blocks
    assert capacity.node_memory("hit-heavy", small, options, quick=True) == single
    floor = size_cache(big, max_num_batched_tokens=2048).floor_blocks
    assert floor > single
    assert capacity.node_memory("hit-heavy", big, options, quick=True) == floor
    assert capacity.node_memory("hit-heavy", big, {"num_blocks": 77}) == 77  # given: as given

    evaluator._traces.update({4.0: (small, single), 8.0: (big, floor)})
    a, b = evaluator.jobs([Probe(Cell("rr", "fcfs"), 4, 4.0),
                           Probe(Cell("llm-d", "fairway"), 4, 8.0)])
    assert (a.options["num_blocks"], b.options["num_blocks"]) == (single, floor)
    assert (a.router, a.policy, a.num_nodes) == ("rr", "fcfs", 4)
    assert a.trace_name == "hit-heavy-quick-N4" and b.trace_name == "hit-heavy-quick-N4-x2"
