"""The fleet replay: N nodes of vLLM's real Scheduler behind a router, on one virtual clock."""

from __future__ import annotations

import importlib.util
import json
import random
from dataclasses import dataclass, field

import pytest

from fairway import cli
from fairway.fleet.replay import NODE_TAG, fleet_replay
from fairway.fleet.routing import FleetSignals, FleetView, KVEvent, NodeLoad, RoutedRequest
from fairway.profiling.table import from_points
from fairway.replay.sim import replay
from fairway.traces.format import Trace, TraceHeader, TraceRequest, write_trace

pytestmark = pytest.mark.integration

OVERHEAD_S = 0.01
PROFILE = from_points(
    [(n, OVERHEAD_S + n / 1e4 + (n / 1e4) ** 2) for n in (128, 1_000, 2_048, 4_096, 8_192)],
    constants={"overhead_s": OVERHEAD_S},
)
DOC = ("doc", 1_000)


def make_trace(*reqs: TraceRequest) -> Trace:
    return Trace(TraceHeader("test", 0, None, {}, len(reqs)), tuple(reqs))


def busy_trace(n: int = 60, seed: int = 3, span_s: float = 6.0) -> Trace:
    """`n` requests in `span_s` on four shared documents: queues form, hits and misses mix."""
    rng = random.Random(seed)
    reqs, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(n / span_s)
        doc = rng.randrange(4)
        reqs.append(TraceRequest(f"r{i:03d}", round(t, 6), (
            (f"doc{doc}", 512 + 256 * doc), (f"q{i}", rng.randrange(32, 400)))))
    return make_trace(*reqs)


@dataclass
class Recording:
    """A router that sends request i to `choose(i, request, view)` and records what it saw."""

    num_nodes: int
    choose: object = None
    reads_events: bool = False
    name: str = "recording"
    routed: dict[str, tuple[float, int]] = field(default_factory=dict)
    seen_loads: list[tuple[float, NodeLoad]] = field(default_factory=list)
    events: list[tuple[float, KVEvent]] = field(default_factory=list)
    finished_calls: list[tuple[str, int, float]] = field(default_factory=list)
    requests: dict[str, RoutedRequest] = field(default_factory=dict)
    #: Every call's kind and time, in call order.
    calls: list[tuple[str, float]] = field(default_factory=list)
    cursor: int = 0

    def route(self, request: RoutedRequest, view: FleetView, now_s: float) -> int:
        if self.reads_events:
            fresh, self.cursor = view.kv_events_since(self.cursor)
            self.events += [(now_s, e) for e in fresh]
        self.seen_loads += [(now_s, load) for load in view.loads()]
        self.requests[request.request_id] = request
        node = (len(self.routed) % self.num_nodes if self.choose is None
                else self.choose(len(self.routed), request, self))
        self.routed[request.request_id] = (now_s, node)
        self.calls.append(("route", now_s))
        return node

    def finished(self, request_id: str, node: int, now_s: float) -> None:
        self.finished_calls.append((request_id, node, now_s))
        self.calls.append(("finished", now_s))


def fields_of(result):
    return [r.to_dict() for r in result.requests]


@pytest.mark.parametrize("policy", ["fcfs", "fairway"])
def test_a_one_node_fleet_is_the_single_replay_field_for_field(policy):
    trace = busy_trace()
    single = replay(trace, policy, profile=PROFILE, num_blocks=300)
    fleet = fleet_replay(trace, policy, num_nodes=1, router="round-robin", profile=PROFILE,
                         num_blocks=300)
    got = fields_of(fleet.replay)
    for r in got:
        assert r["tags"].pop(NODE_TAG) == 0
    assert got == fields_of(single)
    assert fleet.replay.simulated_s == single.simulated_s
    engine = dict(fleet.replay.settings["engine"])
    assert engine == single.settings["engine"]
    assert fleet.nodes[0].requests == len(trace)


def test_every_request_is_answered_once_on_the_node_it_was_routed_to():
    trace = busy_trace()
    router = Recording(3)
    fleet = fleet_replay(trace, "fairway", num_nodes=3, router=router, profile=PROFILE,
                         num_blocks=300)
    assert fleet.replay.n_errors == 0
    assert sorted(rid for rid, _, _ in router.finished_calls) == sorted(router.routed)
    assert len(router.finished_calls) == len(trace)
    by_id = {r.request_id: r for r in fleet.replay.requests}
    for rid, node, when in router.finished_calls:
        assert by_id[rid].tags[NODE_TAG] == node == router.routed[rid][1]
        assert when == by_id[rid].first_token_s
    assert [n.requests for n in fleet.nodes] == [20, 20, 20]
    assert fleet.balance()["requests"] == 1.0
    assert fleet.replay.settings["fleet"]["num_nodes"] == 3
    # in time order: the router hears of each answer before it routes a later request, and
    # never of one from its future
    times = [now for _, now in router.calls]
    assert times == sorted(times)
    assert [kind for kind, _ in router.calls].count("finished") == len(trace)


def test_a_router_never_sees_a_load_younger_than_the_metrics_delay():
    signals = FleetSignals(metrics_delay_s=0.3, kv_event_delay_s=0.1)
    router = Recording(2)
    fleet_replay(busy_trace(span_s=2.0), "fcfs", num_nodes=2, router=router, profile=PROFILE,
                 num_blocks=300, signals=signals)
    ages = [now - load.published_s for now, load in router.seen_loads]
    assert min(ages) >= signals.metrics_delay_s
    assert any(load.waiting_requests or load.running_requests for _, load in router.seen_loads)
    assert any(load.queued_uncached_tokens > 0 for _, load in router.seen_loads)
    assert len({load.published_s for _, load in router.seen_loads}) > 10  # not only the first


def test_kv_events_reach_the_router_late_with_the_requests_keys():
    trace = make_trace(
        TraceRequest("first", 0.0, (DOC, ("q1", 100))),
        TraceRequest("other", 0.0, (("x", 600),)),
        TraceRequest("second", 5.0, (DOC, ("q2", 100))),
    )

    def to_the_node_holding_the_prefix(i, request, router):
        if i < 2:
            return 1 - i  # first -> node 1, other -> node 0
        held = {0: set(), 1: set()}
        for _, event in router.events:
            (held[event.node].add if event.stored else held[event.node].discard)(event.block_hash)
        return max(held, key=lambda node: len(held[node] & set(request.block_hashes)))

    signals = FleetSignals(kv_event_delay_s=0.2)
    router = Recording(2, to_the_node_holding_the_prefix, reads_events=True)
    fleet = fleet_replay(trace, "fcfs", num_nodes=2, router=router, profile=PROFILE,
                         num_blocks=300, signals=signals)
    by_id = {r.request_id: r for r in fleet.replay.requests}
    assert router.routed["second"][1] == 1 and by_id["second"].tags[NODE_TAG] == 1
    assert by_id["second"].cached_tokens == 992  # the shared document's full blocks
    first, second = router.requests["first"], router.requests["second"]
    assert len(first.block_hashes) == 1_100 // 16 and first.block_size == 16
    assert first.block_hashes[:62] == second.block_hashes[:62]  # 992 tokens shared
    stored = {e.block_hash for _, e in router.events if e.stored and e.node == 1}
    assert set(first.block_hashes) <= stored
    assert all(now - e.time_s >= signals.kv_event_delay_s for now, e in router.events)
    assert fleet.replay.settings["fleet"]["router_read_kv_events"] is True


def test_a_session_turn_is_routed_at_its_release():
    trace = make_trace(
        TraceRequest("a", 0.0, (DOC,), tags={"parent": None, "think_s": 0.0}),
        TraceRequest("b", 0.05, (DOC, ("q2", 100)), tags={"parent": "a", "think_s": 1.0}),
    )
    router = Recording(2)
    fleet = fleet_replay(trace, "fcfs", num_nodes=2, router=router, profile=PROFILE,
                         num_blocks=300)
    by_id = {r.request_id: r for r in fleet.replay.requests}
    assert router.routed["b"][0] == by_id["b"].arrival_s == by_id["a"].first_token_s + 1.0
    assert by_id["b"].tags[NODE_TAG] == 1 and by_id["b"].cached_tokens == 0  # another node
    assert fleet.replay.settings["arrivals"] == "closed-loop"


def test_fairway_bench_on_a_fleet_writes_the_table(tmp_path, capsys):
    trace = write_trace(busy_trace(40), tmp_path / "busy.jsonl")
    out = tmp_path / "out"
    code = cli.main(["bench", "--trace", str(trace), "--nodes", "2", "--router", "round-robin",
                     "--policy", "fcfs", "--policy", "fairway", "--workers", "0",
                     "--num-blocks", "300", "--out", str(out), "--no-progress"])
    assert code == 0
    table = json.loads((out / "fleet.json").read_text())
    rows = {(r["router"], r["policy"]): r for r in table["rows"]}
    assert set(rows) == {("round-robin", "fcfs"), ("round-robin", "fairway")}
    assert all(r["requests"] == 40 and r["errors"] == 0 for r in rows.values())
    assert all(r["balance_requests"] == 1.0 for r in rows.values())
    assert "| round-robin | fairway | 40 | 0 |" in (out / "fleet.md").read_text()
    assert len(list((out / "replays").glob("busy-N2--*--round-robin.json"))) == 2
    assert "busy-N2" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_a_fleet_on_ray_gives_the_same_replays_as_in_process(tmp_path):
    """`fairway bench --nodes N --ray local` (issue 48's grid on Ray): the same request-by-request
    results as the in-process run; only the wall times differ."""
    trace = write_trace(busy_trace(30), tmp_path / "busy.jsonl")

    def run(out, *where):
        code = cli.main(["bench", "--trace", str(trace), "--nodes", "2", "--router",
                         "vllm-cache-aware", "--policy", "fcfs", "--policy", "fairway",
                         "--num-blocks", "300", "--out", str(out), "--no-progress", *where])
        assert code == 0
        found = {}
        for path in sorted((out / "replays").glob("*.json")):
            result = json.loads(path.read_text())
            found[path.name] = (result["nodes"], sorted(
                (r["request_id"], r["first_token_s"], r["tags"][NODE_TAG])
                for r in result["replay"]["requests"]))
        return found

    in_process = run(tmp_path / "in-process", "--workers", "0")
    on_ray = run(tmp_path / "ray", "--ray", "local")
    assert len(in_process) == 2
    assert on_ray == in_process
