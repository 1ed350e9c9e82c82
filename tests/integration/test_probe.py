"""The incremental prefix probe: equal to vLLM's own lookup, through growth and eviction, and
without side effects on vLLM's state."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.integration

BS = 16


def _lookups(sched, request) -> tuple[int, int, int]:
    """(incremental probe, fresh coordinator lookup, vLLM's get_computed_blocks) in tokens."""
    mirror = sched.fairway_mirror
    incremental = mirror.cached_tokens(request)
    fresh = mirror.fresh_cached_tokens(request)
    _, computed, *_ = sched.kv_cache_manager.get_computed_blocks(request)
    return incremental, fresh, computed


def _assert_indexes_match_the_memos(mirror) -> None:
    """Every live memo sits in the growth / eviction index under exactly its own keys."""
    for name, index in (("next_key", mirror.memo.by_next), ("last_key", mirror.memo.by_last)):
        listed = {(id(hit), key) for key, hits in index.items() for hit in hits}
        assert all(hits for hits in index.values()), name  # no empty sets left behind
        own = {
            (id(hit), getattr(hit, name))
            for hit in mirror.memo.hits
            if hit is not None and getattr(hit, name) is not None
        }
        assert listed == own, name


def test_hit_grows_while_the_prefix_is_prefilled(offline, helpers):
    """W waits while S computes the shared prefix chunk by chunk: the memo grows with it."""
    sched = offline.make_offline_scheduler(
        "lpm", num_blocks=200, max_num_batched_tokens=64, max_num_seqs=4
    )
    prefix = helpers.tokens(1, 320)  # 20 blocks
    sched.add_request(offline.make_request("S", prefix, 1.0))
    w = offline.make_request("W", prefix + helpers.tokens(5_000, 16), 2.0)
    sched.add_request(w)
    seen = []
    while "W" in helpers.queue_ids(sched):
        incremental, fresh, computed = _lookups(sched, sched.requests["W"])
        assert incremental == fresh == computed
        seen.append(incremental)
        offline.step(sched)
    assert seen == [0, 64, 128, 192, 256, 320]  # 4 blocks cached per 64-token chunk
    assert sched.fairway_mirror.hit_blocks(w) == []  # memo dropped at admission
    assert len(sched.fairway_mirror) == 0
    assert sched.fairway_mirror.num_full_lookups == 2  # S and W once each; the rest incremental


def _evicting_node(offline, helpers):
    """A node with a cached 20-block prefix (returned) and one request slot, held by R, a long
    decode that eats the free queue: the prefix is evicted tail first, and no waiting request
    starts."""
    sched = offline.make_offline_scheduler(
        "lpm", num_blocks=26, max_num_batched_tokens=512, max_num_seqs=1
    )
    prefix = helpers.tokens(1, 320)  # 20 blocks
    sched.add_request(offline.make_request("P", prefix, 1.0))
    offline.run_until_idle(sched)
    sched.add_request(offline.make_request("R", helpers.tokens(9_000, 16), 2.0, max_tokens=400))
    offline.step(sched)
    return sched, prefix


def test_hit_shrinks_as_the_prefix_is_evicted(offline, helpers):
    """A decoding request eats the free queue; the cached chain goes tail first."""
    sched, prefix = _evicting_node(offline, helpers)
    sched.add_request(offline.make_request("W", prefix + helpers.tokens(5_000, 40), 3.0))
    history = []
    for _ in range(260):
        incremental, fresh, computed = _lookups(sched, sched.requests["W"])
        assert incremental == fresh == computed
        if not history or history[-1] != incremental:
            history.append(incremental)
        offline.step(sched)
        helpers.check_queues(sched)
    assert history[0] == 320 and len(history) >= 10  # shrank block by block
    assert history == sorted(history, reverse=True)
    assert sched.fairway_mirror.num_full_lookups >= 10  # every eviction forced a re-lookup


def _random_workload(offline, helpers, policy, seed):
    """Shared prefixes, a small cache (evictions), arrivals over time; yields before each step."""
    rng = random.Random(seed)
    sched = offline.make_offline_scheduler(
        policy, num_blocks=120, max_num_batched_tokens=128, max_num_seqs=6
    )
    prefixes = [helpers.tokens(10_000 * (g + 1), 16 * rng.randint(4, 30)) for g in range(4)]
    n = 0
    for step_no in range(150):
        for _ in range(rng.choice((0, 0, 0, 1, 3))):
            prompt = rng.choice(prefixes) + helpers.tokens(500_000 + 1_000 * n, rng.randint(1, 300))
            sched.add_request(offline.make_request(f"r{n}", prompt, float(step_no)))
            n += 1
        yield sched, n
        offline.step(sched)
        helpers.check_queues(sched)


def test_incremental_equals_fresh_on_a_random_workload(offline, helpers):
    grew = shrank = 0
    last: dict[str, int] = {}
    for sched, _ in _random_workload(offline, helpers, "fcfs", seed=7):
        for request in list(sched.waiting):
            incremental, fresh, computed = _lookups(sched, request)
            assert incremental == fresh == computed, request.request_id
            previous = last.get(request.request_id)
            grew += previous is not None and incremental > previous
            shrank += previous is not None and incremental < previous
            last[request.request_id] = incremental
        _assert_indexes_match_the_memos(sched.fairway_mirror)
    assert grew and shrank, (grew, shrank)  # both kinds of change were exercised


def test_probing_changes_nothing_in_vllm(offline, helpers):
    sched = offline.make_offline_scheduler("lpm", num_blocks=100, max_num_seqs=2)
    prefix = helpers.tokens(1, 320)
    sched.add_request(offline.make_request("P", prefix, 1.0))
    offline.run_until_idle(sched)
    sched.add_request(offline.make_request("R", helpers.tokens(9_000, 16), 2.0, max_tokens=50))
    sched.add_request(offline.make_request("R2", helpers.tokens(8_000, 16), 2.0, max_tokens=50))
    offline.step(sched)  # R, R2 run and fill both tickets: the rest waits
    waiting = [
        offline.make_request(f"W{i}", prefix[: 16 * (i + 5)] + helpers.tokens(7_000 + i, 8), 3.0)
        for i in range(10)
    ]
    offline.add_requests(sched, waiting)
    kvm = sched.kv_cache_manager
    pool = kvm.block_pool

    def state():
        return (
            [b.ref_cnt for b in pool.blocks],
            [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
            pool.get_num_free_blocks(),
            dataclasses.asdict(kvm.prefix_cache_stats),
            len(pool.cached_block_hash_to_block),
            list(pool.kv_event_queue),
        )

    before = state()
    mirror = sched.fairway_mirror
    hits = [mirror.cached_tokens(r) for r in waiting]  # full lookups (first time)
    hits2 = [mirror.cached_tokens(r) for r in waiting]  # incremental
    fresh = [mirror.fresh_cached_tokens(r) for r in waiting]
    assert hits == hits2 == fresh == [16 * (i + 5) for i in range(10)]
    assert state() == before


def test_probe_is_capped_at_num_tokens_minus_one(offline, helpers):
    sched = offline.make_offline_scheduler("lpm", num_blocks=100)
    prompt = helpers.tokens(1, 64)  # exactly 4 blocks
    sched.add_request(offline.make_request("A", prompt, 1.0))
    offline.run_until_idle(sched)
    again = offline.make_request("B", prompt, 2.0)
    assert sched.fairway_mirror.cached_tokens(again) == 48  # 3 blocks: the last token recomputed
    assert sched.fairway_mirror.fresh_cached_tokens(again) == 48


def _columns_hits(sched) -> dict[str, int]:
    """request id -> h as the policy sees it now (the batch path: snapshot's columns)."""
    snap = sched.fairway_mirror.snapshot(list(sched.waiting))
    return dict(zip(snap.columns.request_ids, snap.columns.cached_tokens.tolist(), strict=True))


def test_batch_checks_equal_fresh_lookups_on_a_random_workload(offline, helpers):
    """The whole-queue set checks (growth, eviction) against vLLM's own lookup, every step."""
    added = 0
    for sched, added in _random_workload(offline, helpers, "lpm", seed=11):  # noqa: B007
        mirror = sched.fairway_mirror
        for request_id, hit in _columns_hits(sched).items():
            assert hit == mirror.fresh_cached_tokens(sched.requests[request_id]), request_id
    assert mirror.num_extensions and mirror.num_full_lookups > added  # grew, and re-looked-up


def _full_node(offline, helpers, policy="lpm", num_waiting=10):
    """Both tickets decode for a long time; `num_waiting` requests with distinct hits wait."""
    sched = offline.make_offline_scheduler(
        policy, num_blocks=400, max_num_batched_tokens=256, max_num_seqs=2
    )
    prefix = helpers.tokens(1, 320)  # 20 blocks
    sched.add_request(offline.make_request("P", prefix, 0.0))
    offline.run_until_idle(sched)
    for i in range(2):
        prompt = helpers.tokens(9_000 + 100 * i, 16)
        sched.add_request(offline.make_request(f"R{i}", prompt, 0.5, max_tokens=300))
    offline.step(sched)
    assert len(sched.running) == 2
    waiting = [  # oldest has the shortest hit: LPM puts the youngest first
        offline.make_request(
            f"W{i}", prefix[: 16 * (i + 1)] + helpers.tokens(7_000 + i, 8), 1.0 + i
        )
        for i in range(num_waiting)
    ]
    offline.add_requests(sched, waiting)
    return sched, waiting


@pytest.mark.parametrize("classify", [False, True])
def test_a_batch_of_arrivals_takes_the_tickets_and_columns_one_by_one_would(classify):
    """`QueueTable.add_many` (the probe's batch of noted arrivals) against `add` per request:
    the same tickets in the same order, the same columns, counters and free list, through the
    table's growth, oversized and preempted requests and tenant / priority classes."""
    from vllm.v1.request import RequestStatus

    from fairway.vllm.queue_table import QueueTable

    @dataclasses.dataclass(eq=False)
    class Arrival:
        status: RequestStatus
        tenant: int
        priority: int

    rng = random.Random(7)
    statuses = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
    batch = [Arrival(rng.choice(statuses), rng.randrange(3), rng.randrange(2)) for _ in range(150)]
    arrivals = [rng.uniform(0, 9) for _ in batch]
    tokens = [rng.choice((100, 5_000, 9_000)) for _ in batch]

    def table() -> QueueTable:
        tickets = QueueTable(max_tokens=8_000,
                           classify=(lambda r: (r.tenant, r.priority)) if classify else None)
        for r in batch[:20]:  # some tickets taken and some freed first
            tickets.add(r, 0.0, 100)
        for r in batch[:20:3]:
            tickets.remove(tickets.ticket_of[r])
        return tickets

    one, many = table(), table()
    rest = [r for r in batch if r not in one.ticket_of]
    ids = [batch.index(r) for r in rest]
    want = [one.add(r, arrivals[i], tokens[i]) for r, i in zip(rest, ids, strict=True)]
    got = many.add_many(rest, [arrivals[i] for i in ids], [tokens[i] for i in ids])
    assert got == want
    assert many.ticket_of == one.ticket_of and many._free == one._free
    assert (many.num_special, many.num_classified) == (one.num_special, one.num_classified)
    for column in ("_live", "_given", "_arrival", "_prompt", "_tenant", "_priority", "_kind"):
        assert np.array_equal(getattr(many, column), getattr(one, column)), column


def test_a_burst_is_probed_oldest_first_within_the_budget(offline, helpers):
    """Rule: at most `probe_budget` new requests are looked up per step, oldest first; one not
    looked up yet counts as a miss (h = 0). The order is exact after ceil(burst / budget) steps."""
    sched, waiting = _full_node(offline, helpers)
    mirror = sched.fairway_mirror
    mirror.memo.probe_budget = 3
    assert mirror.num_unprobed == 10
    for step_no in range(1, 5):
        offline.step(sched)  # no request slot free: the ordering is skipped, the probe advances
        assert mirror.num_unprobed == max(10 - 3 * step_no, 0)
        for i, request in enumerate(waiting):
            exact = mirror.fresh_cached_tokens(request)
            assert exact == 16 * (i + 1)
            probed = i < 3 * step_no  # arrival time i: oldest first
            assert mirror.known_cached_tokens(request) == (exact if probed else None)
    assert sched.fairway_steps_skipped == 4


def test_the_first_ordered_step_after_a_burst_is_exact_within_budget(offline, helpers):
    """A burst no larger than the budget is ordered exactly at once (LPM: longest hit first)."""
    sched = offline.make_offline_scheduler(
        "lpm", num_blocks=400, max_num_batched_tokens=32, max_num_seqs=4
    )
    prefix = helpers.tokens(1, 320)
    sched.add_request(offline.make_request("P", prefix, 0.0))
    offline.run_until_idle(sched)
    for i in range(8):
        prompt = prefix[: 16 * (i + 1)] + helpers.tokens(7_000 + 100 * i, 40)
        sched.add_request(offline.make_request(f"W{i}", prompt, 1.0 + i))
    out, _ = offline.step(sched)
    assert list(out.num_scheduled_tokens) == ["W7"]  # the longest hit, though the youngest
    views = sched.fairway_last_views
    assert [views[i].request_id for i in sched.fairway_last_order] == [
        f"W{i}" for i in range(7, -1, -1)
    ]
    for view in [v for v in views if v.request_id != "W7"]:  # W7 computed blocks since
        fresh = sched.fairway_mirror.fresh_cached_tokens(sched.requests[view.request_id])
        assert view.cached_tokens == fresh


def test_a_full_node_keeps_the_last_order_and_orders_when_a_slot_frees(offline, helpers):
    sched, waiting = _full_node(offline, helpers, num_waiting=4)
    ordered = sched.fairway_totals.steps_ordered
    offline.step(sched)
    assert helpers.queue_ids(sched) == ["W0", "W1", "W2", "W3"]  # arrival order, not re-sorted
    assert sched.fairway_totals.steps_ordered == ordered
    steps = 0
    while sched.fairway_totals.steps_ordered == ordered and steps < 400:
        offline.step(sched)
        steps += 1
    assert sched.fairway_totals.steps_ordered == ordered + 1  # R0/R1 finished: a slot is free
    views = sched.fairway_last_views
    assert [views[i].request_id for i in sched.fairway_last_order][:1] == ["W3"]


def test_reset_prefix_cache_forgets_every_hit(offline, helpers):
    sched = offline.make_offline_scheduler("lpm", num_blocks=200, max_num_seqs=1)
    prefix = helpers.tokens(1, 160)
    sched.add_request(offline.make_request("P", prefix, 0.0))
    offline.run_until_idle(sched)
    w = offline.make_request("W", prefix + helpers.tokens(5_000, 20), 1.0)
    assert sched.fairway_mirror.cached_tokens(w) == 160
    assert sched.kv_cache_manager.reset_prefix_cache()
    assert sched.fairway_mirror.cached_tokens(w) == 0 == sched.fairway_mirror.fresh_cached_tokens(w)


def _waiting_on_a_cached_prefix(offline, helpers):
    """W waits (nothing is scheduled) on a cached 20-block prefix; the probe has seen it once.

    Returns the scheduler, W, the hash-map dict and the key of W's next block (uncached)."""
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    sched = offline.make_offline_scheduler("lpm", num_blocks=200, max_num_seqs=2)
    prefix = helpers.tokens(1, 320)  # 20 blocks
    sched.add_request(offline.make_request("P", prefix, 0.0))
    offline.run_until_idle(sched)
    w = offline.make_request("W", prefix + helpers.tokens(5_000, 160), 1.0)
    sched.add_request(w)
    mirror = sched.fairway_mirror
    mirror.snapshot(list(sched.waiting))
    assert mirror.known_cached_tokens(w) == 320
    cache = sched.kv_cache_manager.block_pool.cached_block_hash_to_block._cache
    return sched, w, cache, make_block_hash_with_group_id(w.block_hashes[20], 0)


def _cache_fake_block(sched, cache, key) -> None:
    """Put a free block under `key` in the hash map, as if vLLM had just cached it there (the
    entry: the block, or its id where vLLM 0.34 keeps ids)."""
    from fairway.vllm import internals

    block = sched.kv_cache_manager.block_pool.blocks[150]
    cache[key] = block.block_id if internals.shape().map_holds_ids else block


def _put_back(cache, key) -> None:
    """Pop `key` and insert it again with its block: vLLM's eviction does this when it finds
    another block under the hash; the key moves to the dict's end."""
    cache[key] = cache.pop(key)


def test_growth_is_found_by_walking_the_newly_cached_keys(offline, helpers):
    sched, w, cache, key = _waiting_on_a_cached_prefix(offline, helpers)
    mirror = sched.fairway_mirror
    mirror.memo.growth.since_full_check = 0
    _cache_fake_block(sched, cache, key)
    mirror.snapshot(list(sched.waiting))
    assert mirror.known_cached_tokens(w) == 336 == mirror.fresh_cached_tokens(w)
    assert mirror.memo.growth.since_full_check == 1  # found by the walk, not by the full check


def test_a_newest_key_put_back_at_the_end_forces_the_full_check(offline, helpers):
    """The walk meets the remembered newest key first, but the key behind it is not the one
    remembered: a key was cached before the put-back, so every next key is checked."""
    sched, w, cache, key = _waiting_on_a_cached_prefix(offline, helpers)
    mirror = sched.fairway_mirror
    mirror.memo.growth.since_full_check = 5
    newest = mirror.memo.growth.newest[0]
    _cache_fake_block(sched, cache, key)
    _put_back(cache, newest)
    assert next(reversed(cache)) is newest
    mirror.snapshot(list(sched.waiting))
    assert mirror.known_cached_tokens(w) == 336 == mirror.fresh_cached_tokens(w)
    assert mirror.memo.growth.since_full_check == 1  # the full check ran (reset to 0) this step


def test_a_growth_the_walk_cannot_see_is_found_within_full_check_every_steps(offline, helpers):
    """The stated bound: both remembered keys put back in order after a new key was cached hide
    it from the walk; the periodic check of every next key finds it at the latest
    `FULL_CHECK_EVERY` steps later."""
    from fairway.vllm.cache_growth import FULL_CHECK_EVERY

    sched, w, cache, key = _waiting_on_a_cached_prefix(offline, helpers)
    mirror = sched.fairway_mirror
    mirror.memo.growth.since_full_check = 0
    newest, _, second = mirror.memo.growth.newest
    _cache_fake_block(sched, cache, key)
    _put_back(cache, second)
    _put_back(cache, newest)
    seen = []
    for _ in range(FULL_CHECK_EVERY + 1):
        mirror.snapshot(list(sched.waiting))
        seen.append(mirror.known_cached_tokens(w))
    assert mirror.fresh_cached_tokens(w) == 336
    assert seen[0] == 320  # hidden from the walk
    assert seen[-1] == 336 and 0 < seen.index(336) <= FULL_CHECK_EVERY


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(0, 60))
def test_moving_a_head_to_the_front_equals_the_permutation(data, n):
    """`arrange`'s list-slice path builds the same queue as indexing by the whole order."""
    from fairway.policies.queue import check_order
    from fairway.vllm.queue_table import move_to_front

    head = data.draw(st.lists(st.integers(0, max(0, n - 1)), unique=True, max_size=n))
    head = [i for i in head if i < n]
    order = np.array(head + sorted(set(range(n)) - set(head)), dtype=np.intp)
    current = [object() for _ in range(n)]
    order, moved = check_order(order, n)
    assert moved <= len(head) and sorted(order[moved:].tolist()) == order[moved:].tolist()
    assert move_to_front(current, order[:moved].tolist()) == [current[i] for i in order]


@pytest.mark.parametrize("shared_blocks", [1, 25, 40])
def test_a_long_growth_in_one_step_ends_where_the_chain_ends(offline, helpers, shared_blocks):
    """S computes `shared_blocks` blocks of W's 40-block prefix in one step: W's memo extends by
    that much at once (the galloping search) and equals vLLM's own lookup."""
    sched = offline.make_offline_scheduler(
        "lpm", num_blocks=200, max_num_batched_tokens=2_048, max_num_seqs=1
    )
    prefix = helpers.tokens(1, 640)  # 40 blocks
    w = offline.make_request("W", prefix + helpers.tokens(5_000, 16), 2.0)
    s = offline.make_request(
        "S", prefix[: 16 * shared_blocks] + helpers.tokens(9_000, 8), 1.0, max_tokens=50
    )
    sched.add_request(s)
    sched.add_request(w)
    mirror = sched.fairway_mirror
    offline.step(sched)  # S (older) takes the only slot and computes its whole prompt
    before = mirror.num_extensions
    offline.step(sched)  # S decodes; the pre-pass sees W's next block cached: one extension
    assert "W" in helpers.queue_ids(sched)
    assert mirror.num_extensions == before + 1
    assert _lookups(sched, sched.requests["W"]) == (16 * shared_blocks,) * 3


class _CountingCache(dict):
    """A hash map that counts membership reads (the probe's cost unit)."""

    reads = 0

    def __contains__(self, key: object) -> bool:
        self.reads += 1
        return super().__contains__(key)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), hi=st.integers(0, 600))
def test_a_search_from_any_guess_finds_the_cached_prefix(data, hi):
    """`cached_prefix_near` returns the cached prefix's length whatever the guess (1-2 reads
    when it is right, O(log distance) otherwise); `at_least` trusts a guess known cached."""
    from fairway.vllm.prefix_search import GROUP0_SUFFIX, cached_prefix_near

    length = data.draw(st.integers(0, hi), label="cached blocks")
    guess = data.draw(st.integers(0, hi), label="guess")
    hashes = [i.to_bytes(4, "big") for i in range(hi + 5)]
    cache = _CountingCache({h + GROUP0_SUFFIX: None for h in hashes[:length]})
    assert cached_prefix_near(cache, hashes, guess, hi) == length
    distance = abs(length - guess)
    assert cache.reads <= (2 if distance == 0 else 4 * distance.bit_length() + 2)
    if guess <= length:
        assert cached_prefix_near(cache, hashes, guess, hi, at_least=True) == length


def test_a_new_request_is_looked_up_from_the_hit_of_its_first_block(offline, helpers):
    """Requests sharing a first block share the hint of the last one's hit length; a hint that
    is too long or too short still gives vLLM's own result."""
    sched = offline.make_offline_scheduler(
        "lpm", num_blocks=300, max_num_batched_tokens=2_048, max_num_seqs=1
    )
    prefix = helpers.tokens(1, 640)  # 40 blocks
    sched.add_request(offline.make_request("P", prefix[:320], 1.0))  # caches 20 blocks
    offline.run_until_idle(sched)
    mirror = sched.fairway_mirror
    cases = [("A", prefix[:320] + helpers.tokens(7_000, 40), 320), ("B", prefix[:128] +
             helpers.tokens(8_000, 40), 128), ("C", prefix[:320] + helpers.tokens(9_000, 16), 320)]
    for name, prompt, expected in cases:
        request = offline.make_request(name, prompt, 2.0)
        sched.add_request(request)
        assert _lookups(sched, request) == (expected,) * 3, name
    # the hint is keyed by the first block and holds the last hit found (C's)
    assert mirror.memo.hints[sched.requests["C"].block_hashes[0]] == 20


def test_requests_on_one_evicted_chain_are_looked_up_once(offline, helpers):
    """Three waiting requests share a cached prefix that is evicted tail first: each eviction
    costs one search for all three (their chain hashes are the same up to the tail), and every
    memo still equals vLLM's own lookup."""
    sched, prefix = _evicting_node(offline, helpers)
    names = ("W1", "W2", "W3")
    for k, name in enumerate(names):
        prompt = prefix + helpers.tokens(5_000 + 100 * k, 40)
        sched.add_request(offline.make_request(name, prompt, 3.0 + k))
    mirror = sched.fairway_mirror
    offline.step(sched)  # the three are probed (looked up once each)
    shrinks = 0
    for _ in range(260):
        before = [mirror.known_cached_tokens(sched.requests[n]) for n in names]
        offline.step(sched)
        lookups = mirror.num_full_lookups
        mirror.advance()  # what the next step's pre-pass does first
        after = [mirror.known_cached_tokens(sched.requests[n]) for n in names]
        for name, hit in zip(names, after, strict=True):
            assert hit == mirror.fresh_cached_tokens(sched.requests[name]), name
        assert len(set(after)) == 1
        _assert_indexes_match_the_memos(mirror)
        if after != before:
            shrinks += 1
            assert mirror.num_full_lookups == lookups + 1
    assert shrinks >= 10 and after[0] < 320


@pytest.mark.parametrize("first", ["W1", "W3", "W5"])
def test_requests_waiting_for_one_block_are_extended_from_one_search(
    offline, helpers, monkeypatch, first
):
    """Seven waiting requests share their first block; S and S2 cache 25 blocks of it in one
    step (S2 one more block on its own branch). Whichever of them is searched first
    (`extend_group`), each one's memo equals vLLM's own lookup: those on the first's chain take
    its length without a search, the others (chains that part before its end, at its end, a
    shorter cap) are searched."""
    from fairway.vllm import prefix_memo

    sched = offline.make_offline_scheduler(
        "lpm", num_blocks=300, max_num_batched_tokens=2_048, max_num_seqs=2
    )
    prefix = helpers.tokens(1, 640)  # 40 blocks
    branch = helpers.tokens(7_000, 16)  # S2's block 25
    for name, prompt in (("S", prefix[:400]), ("S2", prefix[:400] + branch)):
        own = helpers.tokens(8_000 + len(prompt), 8)  # a partial block: not cached
        sched.add_request(offline.make_request(name, prompt + own, 1.0, max_tokens=50))
    prompts = {
        "W1": prefix + helpers.tokens(9_000, 16),  # 25 blocks, stops at the prefix's block 25
        "W6": prefix + helpers.tokens(9_100, 16),  # as W1: takes W1's end
        "W7": prefix[:560] + helpers.tokens(9_200, 16),  # as W1
        "W2": prefix[:160] + helpers.tokens(9_300, 400),  # parts at block 10
        "W3": prefix[:400] + branch + helpers.tokens(9_400, 16),  # 26: S2's branch
        "W4": prefix[:400] + helpers.tokens(9_500, 32),  # parts at block 25, not cached
        "W5": prefix[:197],  # cap 12 blocks
    }
    for name, prompt in prompts.items():
        sched.add_request(offline.make_request(name, prompt, 2.0))
    expected = {"W1": 400, "W6": 400, "W7": 400, "W2": 160, "W3": 416, "W4": 400, "W5": 192}
    groups, searches = [], []
    original_group = prefix_memo.PrefixMemo.extend_group
    original_search = prefix_memo.cached_prefix_near

    def first_named(self, group):
        group = sorted(group, key=lambda hit: hit.request.request_id != first)
        groups.append([hit.request.request_id for hit in group])
        return original_group(self, group)

    def counted(*args, **kwargs):
        searches.append(args)
        return original_search(*args, **kwargs)

    monkeypatch.setattr(prefix_memo.PrefixMemo, "extend_group", first_named)
    monkeypatch.setattr(prefix_memo, "cached_prefix_near", counted)
    offline.step(sched)  # the pre-pass probes the seven (no hit); S and S2 compute 26 blocks
    assert set(helpers.queue_ids(sched)) == set(prompts)
    searches.clear()
    offline.step(sched)  # the pre-pass sees their first block cached: one group
    assert len(groups) == 1 and sorted(groups[0]) == sorted(prompts) and groups[0][0] == first
    if first == "W1":  # W6 and W7 take W1's end; W2 (parts early), W3, W4, W5 are searched
        assert len(searches) == 5
    _assert_indexes_match_the_memos(sched.fairway_mirror)
    for name in prompts:
        hit = sched.fairway_mirror.known_cached_tokens(sched.requests[name])
        assert (hit, *_lookups(sched, sched.requests[name])) == (expected[name],) * 4, name


def test_the_requests_a_step_started_are_the_new_and_the_resumed(offline, helpers):
    """`started_ids`: what the after-step forgets, on the running vLLM's real outputs: the
    requests that left the waiting queue (new and resumed), never a running request's decode.
    0.34 sends a resumed request among the new ones (no `resumed_req_ids`); reading every
    scheduled id there would forget the running decodes' memos too."""
    from fairway.vllm.internals import started_ids

    sched = offline.make_offline_scheduler(
        "fcfs", num_blocks=24, max_num_batched_tokens=256, max_num_seqs=8
    )
    for i in range(4):
        sched.add_request(
            offline.make_request(f"d{i}", helpers.tokens(1_000 * i, 60), float(i), max_tokens=120)
        )
    resumed_seen = 0
    for _ in range(400):
        if not sched.has_requests():
            break
        waiting = {r.request_id for r in sched.waiting}
        preempted = {r.request_id for r in sched.waiting if r.num_preemptions}
        output, _ = offline.step(sched)
        started = list(started_ids(output))
        left = waiting - {r.request_id for r in sched.waiting}
        assert set(started) == left, (started, left)
        assert len(started) == len(set(started))
        resumed_seen += len(preempted & set(started))
    assert resumed_seen, "the scenario must resume a preempted request"


def test_a_batch_of_first_lookups_finds_what_one_by_one_finds(offline, helpers):
    """`PrefixMemo.add_many` and the pending batch's `_first_many` (a burst's registration and
    first lookups) against `add` and `_first` per request, on the same cache: the same hits,
    cached-tokens column, growth and eviction keys and indexes, first-block hints, pending order
    and lookup count. The requests cover what the inlined path must get right: a hint that is
    the hit, a hint past the hit (a shorter prefix of the same document), no hint, a hint beyond
    a request's own longest possible hit, a prompt cached whole, a miss, a request that skips
    the prefix cache (prompt logprobs), an oversized one and arrivals out of order."""
    from fairway.vllm.prefix_memo import PrefixMemo

    sched = offline.make_offline_scheduler(
        "fcfs", num_blocks=400, max_num_batched_tokens=4_096, max_num_seqs=8
    )
    doc_a, doc_b = helpers.tokens(1, 640), helpers.tokens(10_000, 320)  # 40 and 20 blocks
    for rid, prompt in (("A", doc_a), ("B", doc_b[:160])):  # B: only its first 10 blocks
        sched.add_request(offline.make_request(rid, prompt + [9], 0.0))
    offline.run_until_idle(sched)
    rng = random.Random(3)
    prompts = [
        doc_a + helpers.tokens(20_000, 40),  # the whole document cached: the hint to come
        doc_a + helpers.tokens(21_000, 100),  # hint right
        doc_a[:300] + helpers.tokens(22_000, 50),  # hint past its hit: gallop down
        doc_b + helpers.tokens(23_000, 30),  # no hint yet, 10 blocks cached
        doc_b[:100],  # hint beyond its own longest hit
        doc_a[:320],  # cached whole (its last token never counts)
        helpers.tokens(30_000, 200),  # a miss
        doc_a + helpers.tokens(24_000, 7),
        helpers.tokens(40_000, 9_000),  # oversized
        doc_b + helpers.tokens(25_000, 60),
    ]
    requests = []
    for i, prompt in enumerate(prompts):
        extra = {"prompt_logprobs": 1} if i == 7 else {}  # vLLM skips its lookup: h = 0
        requests.append(offline.make_request(f"r{i}", prompt, rng.uniform(0, 5), **extra))
    assert not sched.kv_cache_manager.prefix_cache_lookup_enabled(requests[7])
    manager = sched.kv_cache_manager
    one, many = PrefixMemo(manager), PrefixMemo(manager)
    for memo in (one, many):
        memo.resize(len(requests))
    arrivals = [r.arrival_time for r in requests]
    tokens = [r.num_tokens for r in requests]
    max_tokens = 8_000
    for ticket, request in enumerate(requests):
        one.add(request, ticket, arrivals[ticket], tokens[ticket], tokens[ticket] > max_tokens)
    many.add_many(requests, list(range(len(requests))), arrivals, tokens, max_tokens)
    assert [h.request for h in many._pending] == [h.request for h in one._pending]
    assert many._pending_sorted == one._pending_sorted is False
    for hit in sorted(one._pending, key=lambda h: h.arrival):  # what the batch does in one go
        one._first(hit)
    assert many.incremental
    many._probe_pending()
    assert not many._pending
    assert np.array_equal(many.cached, one.cached)
    for a, b in zip(one.hits, many.hits, strict=True):
        assert (a.blocks, a.next_key, a.last_key, a.probed, a.oversized) == (
            b.blocks, b.next_key, b.last_key, b.probed, b.oversized
        ), a.request.request_id
    for name in ("by_next", "by_last"):
        ours = {key: sorted(h.ticket for h in hits) for key, hits in getattr(many, name).items()}
        theirs = {key: sorted(h.ticket for h in hits) for key, hits in getattr(one, name).items()}
        assert ours == theirs, name
    assert many.hints == one.hints and many.num_full_lookups == one.num_full_lookups
    for ticket, request in enumerate(requests):  # and they are vLLM's own hits
        if ticket != 8:
            assert many.cached_tokens(ticket) == many.fresh_cached_tokens(request)
    assert many.cached[2] == 288 and many.cached[5] == 304 and many.cached[7] == 0
