"""The fleet routers' decisive behaviour on small hand-made views (issue 48).

Each router is driven through `make_router` and a fake `FleetView` that hands it load figures
and KV events exactly as written here (the replay's delays are the view's business: a router
sees what the view delivers, nothing else). This file: the registry, the load-only routers,
vLLM's `cache_aware` with its tree, and a property over every router. The KV-event routers and
llm-d's picker: `test_routers_kv.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairway.fleet.routers import RouterError, make_router, router_names
from fairway.fleet.routers.prefix_tree import ApproximatePrefixTree
from fairway.fleet.routing import FleetView, KVEvent, NodeLoad, RoutedRequest

BLOCK = 16


@dataclass
class FakeView:
    """A `FleetView` whose loads and delivered KV events the test writes."""

    num_nodes: int
    published: list[NodeLoad] = field(default_factory=list)
    events: list[KVEvent] = field(default_factory=list)

    def loads(self) -> Sequence[NodeLoad]:
        return self.published

    def kv_events_since(self, cursor: int) -> tuple[Sequence[KVEvent], int]:
        return self.events[cursor:], len(self.events)

    def store(self, node: int, *hashes: int) -> None:
        self.events.extend(KVEvent(node, 0.0, h, True) for h in hashes)

    def evict(self, node: int, *hashes: int) -> None:
        self.events.extend(KVEvent(node, 0.0, h, False) for h in hashes)


def load(
    node: int, waiting: int = 0, running: int = 0, kv_usage: float = 0.0, queued: int = 0
) -> NodeLoad:
    return NodeLoad(node, 0.0, waiting, running, kv_usage, 0, queued, total_blocks=1000)


def req(request_id: str, blocks: Sequence[int], prompt_tokens: int | None = None) -> RoutedRequest:
    """A request whose prompt is exactly its full blocks unless `prompt_tokens` says more."""
    tokens = len(blocks) * BLOCK if prompt_tokens is None else prompt_tokens
    return RoutedRequest(request_id, tokens, tuple(blocks), BLOCK)


def route_all(router, view: FleetView, requests: Sequence[RoutedRequest], now_s: float = 0.0):
    return [router.route(r, view, now_s) for r in requests]


# --- the registry ------------------------------------------------------------------------


def test_every_router_of_the_issue_is_registered() -> None:
    wanted = {"round-robin", "least-load", "vllm-cache-aware", "vllm-kv-aware", "dynamo-kv",
              "llm-d", "fairway-work", "random", "power-of-two"}
    assert wanted <= set(router_names())


@pytest.mark.parametrize(
    ("name", "nodes", "params", "message"),
    [
        ("no-such-router", 2, {}, "unknown router 'no-such-router'; choose one of round-robin"),
        ("vllm-cache-aware", 2, {"cache_treshold": 0.5}, "no parameter 'cache_treshold'"),
        ("vllm-cache-aware", 2, {"cache_threshold": 1.5}, "cache_threshold=1.5 is outside"),
        ("dynamo-kv", 2, {"overlap_score_weight": -1.0}, "overlap_score_weight=-1.0"),
        ("llm-d", 2, {"prefix_weight": 3}, "its parameters: queue_scorer_weight"),
        ("round-robin", 2, {"cache_threshold": 0.5}, "router 'round-robin'"),
        ("least-load", 0, {}, "at least one node"),
        ("power-of-two", 1, {}, "at least 2 nodes"),
    ],
)
def test_make_router_rejects_bad_names_and_params(name, nodes, params, message) -> None:
    with pytest.raises(RouterError, match=message):
        make_router(name, nodes, 0, **params)


def test_make_router_overrides_a_default_by_its_source_name() -> None:
    router = make_router("vllm-cache-aware", 4, cache_threshold=0.5)
    assert router.config.cache_threshold == 0.5
    assert router.config.balance_abs_threshold == 64  # the others keep 0.1.17's defaults


def test_a_view_of_another_fleet_is_refused() -> None:
    with pytest.raises(RouterError, match="view shows 3 nodes"):
        make_router("vllm-kv-aware", 2).route(req("b", [1]), FakeView(3), 0.0)


# --- load-only routers --------------------------------------------------------------------


def test_least_load_counts_its_own_in_flight_requests_ties_to_lowest_index() -> None:
    router, view = make_router("least-load", 3), FakeView(3, [load(0, waiting=99)])
    # The published queue of node 0 is ignored: the router counts what it routed.
    assert route_all(router, view, [req(f"r{i}", [i]) for i in range(4)]) == [0, 1, 2, 0]
    router.finished("r1", 1, 1.0)
    assert router.route(req("r4", [4]), view, 1.0) == 1
    assert router.in_flight.requests == [2, 1, 1]


def test_finished_refuses_a_broken_contract() -> None:
    router, view = make_router("least-load", 2), FakeView(2)
    router.route(req("a", [1]), view, 0.0)
    with pytest.raises(RouterError, match="routed to 0"):
        router.finished("a", 1, 0.0)
    router.finished("a", 0, 0.0)
    with pytest.raises(RouterError, match="not in flight"):
        router.finished("a", 0, 0.0)
    with pytest.raises(RouterError, match="routed twice"):
        router.route(req("b", [1]), view, 0.0)
        router.route(req("b", [1]), view, 0.0)
    assert router.in_flight.requests == [1, 0]


def test_power_of_two_takes_the_less_loaded_of_two_distinct_nodes() -> None:
    # With two nodes the two draws are always both nodes: the less loaded always wins.
    router = make_router("power-of-two", 2, seed=3)
    view = FakeView(2, [load(0, waiting=5, running=2), load(1, running=1)])
    assert route_all(router, view, [req(f"r{i}", [i]) for i in range(5)]) == [1] * 5
    # Its own in-flight count adds to the published load: 1 + 5 = 6 < 7.
    assert router.route(req("r5", [5]), view, 0.0) == 1


def test_consistent_hash_keeps_a_tenant_or_a_prompt_on_one_node() -> None:
    router, view = make_router("consistent-hash", 8), FakeView(8)
    tenants = [RoutedRequest(f"t{i}", 64, (i,), BLOCK, tenant=f"tenant-{i % 5}") for i in range(40)]
    nodes = route_all(router, view, tenants)
    assert all(nodes[i] == nodes[i % 5] for i in range(40))  # the key is the tenant, not blocks
    assert len(set(nodes[:5])) > 1
    again = make_router("consistent-hash", 8)  # the ring does not depend on the seed or history
    assert again.route(req("p", PREFIX), view, 0.0) == router.route(req("q", PREFIX), view, 0.0)


def test_random_is_reproducible_from_its_seed() -> None:
    picks = [route_all(make_router("random", 5, seed=7), FakeView(5),
                       [req(f"r{i}", [i]) for i in range(20)]) for _ in range(2)]
    assert picks[0] == picks[1] and len(set(picks[0])) > 1


# --- vLLM's cache_aware ---------------------------------------------------------------------

PREFIX = [1, 2, 3, 4]


def test_cache_aware_sends_a_shared_prefix_to_its_holder_even_when_busier() -> None:
    router, view = make_router("vllm-cache-aware", 2), FakeView(2)
    assert router.route(req("p", PREFIX), view, 0.0) == 0  # no match: least loaded
    assert router.route(req("q", [10, 11]), view, 0.0) == 1
    assert router.route(req("r", [20, 21]), view, 0.0) == 0  # loads (1, 1): lowest index
    # Node 0 now has 2 in flight, node 1 has 1; the prompt sharing 4 of 5 blocks follows them.
    assert router.route(req("s", [*PREFIX, 99]), view, 0.0) == 0
    assert router.decisions["prefix_hit"] == 1


def test_cache_aware_at_or_below_the_threshold_goes_to_the_least_loaded() -> None:
    router, view = make_router("vllm-cache-aware", 2, cache_threshold=0.5), FakeView(2)
    route_all(router, view, [req("p", PREFIX), req("q", [10]), req("r", [20])])  # -> 0, 1, 0
    # Match rate 2/4 = 0.5 is not above 0.5: the least loaded node (1), not the holder (0).
    assert router.route(req("s", [1, 2, 30, 31]), view, 0.0) == 1
    # 3/4 = 0.75 is above it: the holder.
    assert router.route(req("t", [1, 2, 3, 40]), view, 0.0) == 0
    assert router.decisions == {"load_imbalance": 0, "prefix_hit": 1, "prefix_miss": 4}


def test_cache_aware_match_rate_counts_the_partial_last_block() -> None:
    router, view = make_router("vllm-cache-aware", 2, cache_threshold=0.5), FakeView(2)
    route_all(router, view, [req("p", [1, 2]), req("q", [9]), req("r", [8])])  # -> 0, 1, 0
    # 2 blocks (32 tokens) matched of a 70-token prompt: 0.46, not above 0.5: least loaded.
    assert router.route(req("s", [1, 2], prompt_tokens=70), view, 0.0) == 1
    # Of a 60-token prompt: 0.53, the holder (the creator of the deepest node, 0).
    assert router.route(req("t", [1, 2], prompt_tokens=60), view, 0.0) == 0


def test_cache_aware_switches_to_least_load_past_both_imbalance_thresholds() -> None:
    router = make_router("vllm-cache-aware", 2)
    view = FakeView(2)
    # The same prompt follows its holder until node 0 has 65 in flight and node 1 none:
    # 65 - 0 > 64 and 65 > 1.5 x 0.
    nodes = route_all(router, view, [req(f"x{i}", PREFIX) for i in range(66)])
    assert nodes == [0] * 65 + [1]
    assert router.decisions["load_imbalance"] == 1


def test_cache_aware_needs_the_relative_threshold_too() -> None:
    router = make_router("vllm-cache-aware", 2, balance_abs_threshold=2)
    view = FakeView(2)
    for i in range(6):  # X and Y alternate: (6, 6)
        assert router.route(req(f"x{i}", [1, 2]), view, 0.0) == 0
        assert router.route(req(f"y{i}", [7, 8]), view, 0.0) == 1
    assert route_all(router, view, [req(f"x{i}", [1, 2]) for i in range(6, 9)]) == [0, 0, 0]
    # (9, 6): 9 - 6 > 2 but 9 > 1.5 x 6 is false: still balanced, the prompt follows node 0.
    assert router.route(req("x9", [1, 2]), view, 0.0) == 0
    # (10, 6): both thresholds passed: least loaded.
    assert router.route(req("x10", [1, 2]), view, 0.0) == 1


def test_cache_aware_evicts_its_tree_every_interval() -> None:
    # Budget: 128 characters = 32 tokens = 2 blocks per worker.
    params = {"cache_threshold": 0.6, "eviction_interval_secs": 10.0, "max_tree_size": 128}
    before, after = make_router("vllm-cache-aware", 2, **params), make_router(
        "vllm-cache-aware", 2, **params)
    for router in (before, after):
        # [1, 2, 3, 4] then [1, 2] on node 0 split the tree into [1, 2] (newer) and [3, 4].
        route_all(router, FakeView(2), [req("p", PREFIX), req("p2", [1, 2]), req("q", [50])])
        router.finished("q", 1, 1.0)  # node 0 keeps 2 in flight, node 1 none
    # Before the first pass the whole prompt matches (4/4): its holder, node 0.
    assert before.route(req("s", PREFIX), FakeView(2), 9.9) == 0
    # The pass at t=10 drops node 0's least recent leaf, [3, 4]: 2/4 = 0.5 is not above 0.6.
    assert after.route(req("s", PREFIX), FakeView(2), 10.0) == 1
    assert after.tree.sizes == [2, 1 + 4]


def test_prefix_tree_answers_the_creator_and_evicts_leaves_first() -> None:
    tree = ApproximatePrefixTree(3)
    tree.insert([1, 2, 3], 2)
    tree.insert([1, 2, 3], 0)
    tree.insert([1, 2, 9], 1)
    assert tree.match([1, 2, 3, 4]) == (3, 2)  # the tenant that created the deepest node
    assert tree.match([1, 2, 9]) == (3, 1)
    assert tree.match([5]) == (0, 0)
    assert tree.sizes == [3, 3, 3]
    tree.insert([7, 8], 0)  # newer than [1, 2, 3] for tenant 0
    tree.evict_by_size(2)
    # Tenant 0 kept its newest prompt; the older one went leaf by leaf, root-side last.
    assert tree.sizes == [2, 2, 2]
    assert tree.match([7, 8]) == (2, 0)
    # Tenants 1 and 2 lost their leaves (9 and 3); block 2 answers its creator, tenant 2.
    assert tree.match([1, 2, 3]) == (2, 2)
    tree.evict_by_size(0)
    assert tree.sizes == [0, 0, 0]
    assert tree.match([1, 2, 3]) == (0, 0)


# --- every router, any sequence ----------------------------------------------------------

operations = st.lists(
    st.tuples(
        st.sampled_from(["route", "finish"]),
        st.lists(st.integers(0, 6), max_size=6),  # block hashes (small alphabet: shared prefixes)
        st.integers(0, 40),  # extra prompt tokens past the full blocks
        st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6), st.booleans()), max_size=4),
        st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5000), st.floats(0, 1)),
                 min_size=4, max_size=4),
    ),
    max_size=30,
)


@pytest.mark.parametrize("name", router_names())
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations, seed=st.integers(0, 3))
def test_any_sequence_routes_to_a_valid_node_and_counts_stay_non_negative(name, ops, seed) -> None:
    router = make_router(name, 4, seed)
    view = FakeView(4)
    open_requests: dict[str, int] = {}
    now = 0.0
    for i, (op, blocks, extra, events, figures) in enumerate(ops):
        now += 7.0
        view.events.extend(KVEvent(node, now, h, stored) for node, h, stored in events)
        view.published = [load(n, waiting=w, kv_usage=kv, queued=q)
                          for n, (w, q, kv) in enumerate(figures)]
        if op == "finish" and open_requests:
            request_id = min(open_requests)
            router.finished(request_id, open_requests.pop(request_id), now)
        else:
            request = req(f"r{i}", blocks, prompt_tokens=len(blocks) * BLOCK + extra + 1)
            node = router.route(request, view, now)
            assert 0 <= node < 4
            open_requests[request.request_id] = node
        in_flight = getattr(router, "in_flight", None)
        if in_flight is not None:
            assert min(in_flight.requests) >= 0 and min(in_flight.tokens) >= 0
            assert in_flight.requests == [list(open_requests.values()).count(n) for n in range(4)]
