"""The routers that read KV events or published figures (issue 48): vLLM's router `kv_aware`,
Dynamo's KV router, llm-d's endpoint picker, Fairway's `fairway-work`, and the block indexes
they share. Each reads only what the fake view delivers: a block stored and then removed no
longer counts once the removal is delivered."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from test_routers import FakeView, load, req

from fairway.fleet.routers import make_router
from fairway.fleet.routers.base import loads_by_node, softmax_sample
from fairway.fleet.routers.block_index import BlockIndex, hit_tokens
from fairway.fleet.routers.llm_d import ApproximatePrefixIndex, queue_scores
from fairway.fleet.routing import KVEvent

PROMPT = [1, 2, 3, 4]  # 64 tokens


class NoEventsView(FakeView):
    """A view that fails the test if the router asks for KV events."""

    def kv_events_since(self, cursor: int) -> tuple[Sequence[KVEvent], int]:
        raise AssertionError("this router must not read KV events")


# --- the shared block index ----------------------------------------------------------------


def test_leading_run_stops_at_a_gap_greedy_run_does_not() -> None:
    index = BlockIndex(3)
    for node, hashes in ((0, [1, 2, 4]), (1, [1, 2, 3, 4]), (2, [2, 3])):
        for h in hashes:
            index.add(node, h)
    assert index.leading_run([1, 2, 3, 4]) == [2, 4, 0]
    # llm-d walks while any node holds the block and counts each node's blocks on the way.
    assert index.greedy_run([1, 2, 3, 4]) == [3, 4, 2]
    assert index.greedy_run([9, 1]) == [0, 0, 0]
    assert index.sizes == [3, 4, 2]


def test_a_block_cached_twice_stays_until_both_copies_are_removed() -> None:
    index = BlockIndex(1)
    index.add(0, 7)
    index.add(0, 7)
    index.remove(0, 7)
    assert index.leading_run([7]) == [1] and index.sizes == [1]
    index.remove(0, 7)
    index.remove(0, 7)  # a removal the index never saw stored: ignored
    assert index.leading_run([7]) == [0] and index.sizes == [0]


def test_hit_tokens_leave_the_last_prompt_token_to_compute() -> None:
    assert hit_tokens(4, 16, 64) == 63
    assert hit_tokens(2, 16, 64) == 32
    assert hit_tokens(0, 16, 1) == 0


# --- vLLM's kv_aware -----------------------------------------------------------------------


def test_kv_aware_follows_the_kv_events_and_forgets_a_removed_block() -> None:
    router, view = make_router("vllm-kv-aware", 2), FakeView(2)
    view.store(1, *PROMPT)
    assert router.route(req("a", PROMPT), view, 0.0) == 1  # cost 0 + 0 vs 0 + 64
    view.evict(1, 1)  # block 1 removed: node 1's leading run is now 0
    # Node 1 was charged 0 new tokens for "a": both cost 64, equal hits, lowest index.
    assert router.route(req("b", PROMPT), view, 0.0) == 0


def test_kv_aware_counts_the_prefill_tokens_it_sent_until_answered() -> None:
    router, view = make_router("vllm-kv-aware", 2), FakeView(2, [load(1, waiting=50)])
    assert router.route(req("a", [10, 11]), view, 0.0) == 0
    assert router.route(req("b", [20, 21]), view, 0.0) == 1  # node 0 has 32 tokens pending
    assert router.in_flight.tokens == [32, 32]
    router.finished("a", 0, 1.0)
    assert router.route(req("c", [30], prompt_tokens=40), view, 1.0) == 0
    # A hit outweighs pending work only as far as the tokens go: node 1 caches 2 of c's
    # blocks (cost 32 + 48 - 32 = 48) against node 0's 40 pending + 48.
    view.store(1, 40, 41)
    assert router.route(req("d", [40, 41, 42], prompt_tokens=48), view, 1.0) == 1


# --- Dynamo's KV router ------------------------------------------------------------------


def test_dynamo_weighs_prefill_blocks_against_its_own_active_blocks() -> None:
    router, view = make_router("dynamo-kv", 2), FakeView(2)
    # Dynamo never reads the published load: node 0 looks swamped, node 1 idle.
    view.published = [load(0, waiting=500, kv_usage=0.99), load(1)]
    view.store(0, *PROMPT)
    # logit(0) = 1.0 x 0/16 + 4 new blocks = 4; logit(1) = 64/16 + 4 = 8.
    assert router.logits(req("x", PROMPT), [4, 0]) == [4.0, 8.0]
    assert router.route(req("a", PROMPT), view, 0.0) == 0
    # Its own count, not the published one: node 0 carries a's 4 active blocks, so a cold
    # prompt costs 64/16 + 4 + 4 = 12 there against 64/16 + 0 + 4 = 8 on node 1.
    assert router.route(req("b", [5, 6, 7, 8]), view, 0.0) == 1
    # Blocks shared with an active request count once (c reuses a's on node 0); node 1 holds
    # b's 64 prefill tokens and 4 blocks.
    assert router.logits(req("c", PROMPT), [4, 0]) == [0 + 4 + 0, (64 + 64) / 16 + 4 + 4]
    router.finished("a", 0, 1.0)
    router.finished("b", 1, 1.0)
    assert router.logits(req("c", PROMPT), [4, 0]) == [4.0, 8.0]


def test_dynamo_forgets_a_removed_block_and_ties_go_random_when_trees_are_equal() -> None:
    picks = set()
    for seed in range(12):
        router, view = make_router("dynamo-kv", 2, seed=seed), FakeView(2)
        view.store(1, *PROMPT)
        view.evict(1, *PROMPT)
        picks.add(router.route(req("a", PROMPT), view, 0.0))
    assert picks == {0, 1}


def test_dynamo_with_overlap_weight_zero_ignores_the_cache() -> None:
    router, view = make_router("dynamo-kv", 2, overlap_score_weight=0.0), FakeView(2)
    view.store(1, *PROMPT)
    # Both logits are the 4 new decode blocks; the tie goes to the smaller tree: node 0.
    assert router.route(req("a", PROMPT), view, 0.0) == 0


# --- llm-d's endpoint picker -------------------------------------------------------------


def test_queue_scores_are_min_max_normalised() -> None:
    assert queue_scores([10, 0, 5]) == [0.0, 1.0, 0.5]
    assert queue_scores([3, 3]) == [1.0, 1.0]


def test_llm_d_weighs_prefix_3_against_queue_2_and_kv_2() -> None:
    router = make_router("llm-d", 2)
    view = NoEventsView(2, [load(0), load(1)])
    first = router.route(req("a", PROMPT), view, 0.0)  # equal scores: a seeded random pick
    other = 1 - first
    # The holder's longer queue costs 2, its full prefix match earns 3: it stays.
    view.published = [load(first, waiting=1), load(other, waiting=0)]
    assert router.scores(req("x", PROMPT), loads_by_node(view, 2))[first] == pytest.approx(5.0)
    assert router.route(req("b", PROMPT), view, 0.0) == first
    # With 60% of its KV cache in use as well (2 x 0.4 = 0.8): 3.8 < 4, the other node.
    view.published = [load(first, waiting=1, kv_usage=0.6), load(other)]
    assert router.route(req("c", PROMPT), view, 0.0) == other


def test_llm_d_ties_are_random_but_seeded() -> None:
    def picks(seed: int) -> list[int]:
        router = make_router("llm-d", 4, seed=seed)
        return [router.route(req(f"r{i}", [100 + i]), NoEventsView(4), 0.0) for i in range(12)]

    assert picks(1) == picks(1)
    assert len(set(picks(1))) > 1


def test_llm_d_prefix_index_is_an_lru_of_the_server_kv_size() -> None:
    index = ApproximatePrefixIndex(2)
    index.add(0, [1, 2, 3, 4], capacity=3)
    # The oldest block (the prompt's first) left: no node holds block 1, the walk stops at once.
    assert index.blocks.greedy_run([1, 2, 3, 4]) == [0, 0]
    assert index.blocks.greedy_run([2, 3, 4]) == [3, 0]
    index.add(0, [2, 9], capacity=99)  # the LRU keeps the size it was created with
    assert index.capacity[0] == 3 and index.blocks.sizes[0] == 3
    assert index.blocks.greedy_run([2, 3]) == [1, 0]  # 3 was the least recent


# --- Fairway's fairway-work ---------------------------------------------------------------


def test_fairway_work_takes_the_least_queued_work_after_the_hit() -> None:
    router, view = make_router("fairway-work", 2), FakeView(2)
    view.published = [load(0, queued=1000), load(1, queued=900)]
    view.store(1, *PROMPT)
    # 1000 + 64 against 900 + (64 - 63): node 1.
    assert router.work(req("x", PROMPT), view) == [(1064, 0), (901, 63)]
    assert router.route(req("a", PROMPT), view, 0.0) == 1
    view.published = [load(0, queued=1000), load(1, queued=1100)]
    assert router.route(req("b", PROMPT), view, 0.0) == 0  # 1064 < 1101
    view.published = [load(0, queued=1000), load(1, queued=900)]
    view.evict(1, 2)  # its run is now 1 block: 900 + 48
    assert router.work(req("x", PROMPT), view)[1] == (948, 16)


def test_fairway_work_ties_go_to_the_longer_hit_then_the_lowest_index() -> None:
    router, view = make_router("fairway-work", 3), FakeView(3)
    view.published = [load(0, queued=100), load(1, queued=82), load(2, queued=100)]
    view.store(1, 1, 2)  # hit 32: 82 + 64 - 32 = 114
    view.store(2, 1)  # hit 16: 100 + 64 - 16 = 148
    assert [w for w, _ in router.work(req("x", PROMPT), view)] == [164, 114, 148]
    view.published = [load(0, queued=50), load(1, queued=82), load(2, queued=66)]
    # 114, 114, 114: the longer hit (node 1, 32 tokens) wins.
    assert router.route(req("a", PROMPT), view, 0.0) == 1
    view.published = [load(0, queued=50), load(1, queued=50)]  # node 2 published nothing
    assert router.route(req("b", [7]), view, 0.0) == 2  # 0 + 16 < 50 + 16


def test_a_temperature_above_zero_samples_lower_costs_more_often() -> None:
    rng = random.Random(0)
    picks = [softmax_sample([0.0, 10.0, 10.0], 0.1, rng) for _ in range(200)]
    assert picks.count(0) > 190  # exp(-10) per costly node
    even = [softmax_sample([3.0, 3.0], 0.1, rng) for _ in range(200)]
    assert 60 < even.count(0) < 140
    router, view = make_router("dynamo-kv", 2, seed=1, router_temperature=1.0), FakeView(2)
    view.store(1, *PROMPT)
    nodes = [router.route(req(f"r{i}", PROMPT), view, 0.0) for i in range(40)]
    assert set(nodes) == {0, 1}  # sampled, not the argmin every time
