"""KV-block accounting: soft eviction protection and requests too big for the whole cache."""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.integration

SHARED = list(range(1, 161))  # 160 tokens = a 10-block chain


def _pressure(offline, helpers, protect: bool):
    """39 usable blocks: chain P (10) then an unrelated chain B (5) cached, so P is older (LRU).

    Waiting: a cold 30-block request C at the FCFS head, then W that shares P.
    """
    sched = offline.make_offline_scheduler(
        "fcfs", num_blocks=40, max_num_batched_tokens=2_048, fairway_options={"protect": protect}
    )
    sched.add_request(offline.make_request("P", SHARED, 1.0))
    offline.run_until_idle(sched)
    sched.add_request(offline.make_request("B", helpers.tokens(5_000, 80), 2.0))
    offline.run_until_idle(sched)
    sched.add_request(offline.make_request("C", helpers.tokens(9_000, 480), 3.0, max_tokens=5))
    sched.add_request(offline.make_request("W", SHARED + helpers.tokens(7_000, 16), 4.0))
    return sched


@pytest.mark.parametrize(("protect", "kept_tokens"), [(False, 64), (True, 144)])
def test_soft_protection_keeps_the_waiting_requests_prefix(offline, helpers, protect, kept_tokens):
    sched = _pressure(offline, helpers, protect)
    pool = sched.kv_cache_manager.block_pool
    free_before = pool.get_num_free_blocks()
    out, _ = offline.step(sched)
    assert list(out.num_scheduled_tokens) == ["C"]  # C is admitted; W does not fit any more
    # C took 30 blocks: plain LRU evicts P's tail; protection evicts B and one block of P.
    assert sched.fairway_mirror.fresh_cached_tokens(sched.requests["W"]) == kept_tokens
    assert pool.get_num_free_blocks() == free_before - 30  # no pins: free count is honest
    assert (sched.fairway_totals.protected_blocks > 0) == protect


def test_protection_order_and_no_ref_count_change(offline, helpers):
    """Hit blocks go to the MRU end, top request's first block last; ref counts untouched."""
    sched = offline.make_offline_scheduler(
        "lpm", num_blocks=200, max_num_seqs=1, fairway_options={"protect": True}
    )
    sched.add_request(offline.make_request("P", SHARED, 1.0))
    offline.run_until_idle(sched)
    sched.add_request(offline.make_request("R", helpers.tokens(9_000, 16), 2.0, max_tokens=50))
    offline.step(sched)  # R fills the only slot: nothing else is admitted
    sched.add_request(offline.make_request("W1", SHARED[:80] + helpers.tokens(7_000, 5), 3.0))
    sched.add_request(offline.make_request("W2", SHARED + helpers.tokens(8_000, 5), 3.0))
    pool = sched.kv_cache_manager.block_pool
    refs = [b.ref_cnt for b in pool.blocks]
    offline.step(sched)
    r_blocks = set(sched.kv_cache_manager.get_block_ids("R")[0])  # R may grow a block
    assert [b.ref_cnt for b in pool.blocks if b.block_id not in r_blocks] == [
        n for b, n in zip(pool.blocks, refs, strict=True) if b.block_id not in r_blocks
    ]
    free = pool.free_block_queue.get_all_free_blocks()
    chain = sched.fairway_mirror.hit_blocks(sched.requests["W2"])
    assert len(chain) == 10
    # lpm puts W2 (10 blocks) before W1 (5 blocks, a sub-chain): the MRU end is W2's chain,
    # first block last.
    assert [b.block_id for b in free[-10:]] == [b.block_id for b in reversed(chain)]
    assert all(b.ref_cnt == 0 for b in chain)
    # A second step with nothing changed moves nothing (the steady state is detected).
    moved = sched.fairway_totals.protected_blocks
    offline.step(sched)
    assert sched.fairway_totals.protected_blocks == moved


def test_too_big_request_does_not_block_the_queue(offline, helpers, caplog):
    caplog.set_level(logging.ERROR, logger="fairway")
    sched = offline.make_offline_scheduler("fcfs", num_blocks=40, max_num_batched_tokens=2_048)
    # 39 usable blocks = 624 tokens; the oldest request needs 44 blocks.
    sched.add_request(offline.make_request("huge", helpers.tokens(1, 700), 1.0))
    for i in range(3):
        sched.add_request(offline.make_request(f"s{i}", helpers.tokens(2_000 * (i + 1), 50), 2.0))
    out, engine_outputs = offline.step(sched)
    assert set(out.num_scheduled_tokens) == {"s0", "s1", "s2"}
    errors = [o for outs in engine_outputs.values() for o in outs.outputs if o.request_id == "huge"]
    assert len(errors) == 1 and str(errors[0].finish_reason) == "error"
    assert "huge" not in sched.requests
    lines = [r.getMessage() for r in caplog.records if "can never be admitted" in r.getMessage()]
    assert len(lines) == 1
    assert "huge" in lines[0] and "44 KV blocks" in lines[0] and "39 usable" in lines[0]
    assert sched.fairway_totals.oversized_rejected == 1
    offline.run_until_idle(sched)
    assert not sched.requests


def _world(seed):
    """Blocks (some in use), a random prefix tree of cached chains and a shuffled free queue."""
    import random

    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

    rng = random.Random(seed)
    blocks = [KVCacheBlock(i) for i in range(60)]
    for b in blocks[1:]:
        b.set_block_hash(b"h%d" % b.block_id)  # cached
        b.ref_cnt = 0 if rng.random() < 0.8 else 1
    tree = {1: [blocks[1]]}
    for i in range(2, 60):
        tree[i] = tree[rng.choice(list(tree))] + [blocks[i]]
    chains = [tree[rng.choice(list(tree))] for _ in range(8)]
    free = [b for b in blocks[1:] if b.ref_cnt == 0]
    rng.shuffle(free)
    return FreeKVCacheBlockQueue(free), chains


def test_protection_equals_the_naive_reverse_priority_moves():
    """Dedupe + backward walk give exactly the spec: reverse priority order, chain tail first."""
    from fairway.vllm.protect import protect_hit_blocks

    for seed in range(20):
        ours, chains = _world(seed)
        protect_hit_blocks(ours, chains)
        naive, chains = _world(seed)  # the same world, separate block objects
        for chain in reversed(chains):
            for b in reversed(chain):
                if b.ref_cnt == 0:
                    naive.remove(b)
                    naive.append(b)
        assert [b.block_id for b in ours.get_all_free_blocks()] == [
            b.block_id for b in naive.get_all_free_blocks()
        ]


def test_the_queue_is_split_only_while_a_request_is_set_apart(offline, helpers):
    """An oversized request is kept last while it waits; once it is gone, every waiting request
    is ordered again (the probe's count of set-apart requests returns to 0)."""
    sched = offline.make_offline_scheduler(
        "lpm", num_blocks=40, max_num_batched_tokens=64, max_num_seqs=1
    )
    sched.add_request(offline.make_request("huge", helpers.tokens(1, 700), 1.0))
    sched.add_request(offline.make_request("a", helpers.tokens(2_000, 50), 2.0))
    sched.add_request(offline.make_request("b", helpers.tokens(3_000, 50), 3.0))
    mirror = sched.fairway_mirror
    offline.step(sched)  # "a" starts; "huge" is finished with an error by the next update
    assert "huge" not in sched.requests
    snap = mirror.snapshot(list(sched.waiting))  # drops the memo of the request that left
    assert mirror.table.num_special == 0
    assert [r.request_id for r in snap.current] == ["b"]
    assert not snap.oversized and not snap.fixed and len(snap.ordered_tickets) == 1
    offline.run_until_idle(sched)
    assert not sched.requests


# --- `fairway`'s cache half, on by default: checked every step -----------------------------------


def test_fairway_protects_by_default_and_the_option_turns_it_off(offline, helpers):
    """`protect` null is on for `fairway` (its rule's cache half), off for `fcfs`; an explicit
    false turns it off for `fairway` too."""
    from fairway.options import FairwayOptions

    assert FairwayOptions(policy="fairway").protect_enabled
    assert not FairwayOptions(policy="fcfs").protect_enabled
    assert not FairwayOptions(policy="fairway", protect=False).protect_enabled
    for protect, moved in ((None, True), (False, False)):
        options = None if protect is None else {"protect": protect}
        sched = offline.make_offline_scheduler(
            "fairway", num_blocks=40, max_num_batched_tokens=2_048, fairway_options=options
        )
        sched.add_request(offline.make_request("P", SHARED, 1.0))
        offline.run_until_idle(sched)
        sched.add_request(offline.make_request("B", helpers.tokens(5_000, 80), 2.0))
        offline.run_until_idle(sched)
        sched.add_request(offline.make_request("C", helpers.tokens(9_000, 480), 3.0, max_tokens=5))
        sched.add_request(offline.make_request("W", SHARED + helpers.tokens(7_000, 16), 4.0))
        offline.step(sched)
        assert (sched.fairway_totals.protected_blocks > 0) == moved


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 40), st.integers(0, 3)),
                min_size=6, max_size=30))
def test_no_queued_prefix_among_the_blocks_a_step_can_evict(offline, stream):
    """The cache guarantee of docs/design.md ("Cache reuse under load"), through vLLM's real
    Scheduler under `fairway`'s defaults: after the pre-pass of every step, the first A blocks of
    vLLM's free queue (A: the most the step can allocate, the only blocks it can evict) hold no
    cached block of the first K waiting requests in Fairway's order, unless fewer than A free
    blocks are outside their hits; and no request is lost or served twice.

    Stream: (session, new blocks, steps to run before the next arrival); a session's requests
    extend its previous prompt (agent turns), in a cache too small for every session."""
    from fairway.vllm import internals
    from fairway.vllm.prepass import StepPrepass

    sched = offline.make_offline_scheduler(
        "fairway", num_blocks=120, max_num_batched_tokens=256, max_num_seqs=4
    )
    checked: list[int] = []
    real = StepPrepass.protect_blocks

    def checking(self, queue):
        real(self, queue)
        protected = {id(b) for r in queue[: self.top_k] for b in self.mirror.hit_blocks(r)}
        at_risk = (-(-internals.token_budget(sched) // 16) + internals.free_slots(sched)
                   + len(internals.running_requests(sched)))
        free_queue = internals.free_block_queue(sched)
        head, block = [], internals.eviction_head(free_queue)
        while block is not None:
            head.append(block)
            block = internals.next_to_evict(free_queue, block)
        outside = [b for b in head if id(b) not in protected]
        if len(outside) >= at_risk:  # enough unprotected blocks: none protected in the way
            assert not any(id(b) in protected for b in head[:at_risk])
        else:  # a shortage: every unprotected block goes first
            assert all(id(b) not in protected for b in head[: len(outside)])
        checked.append(len(protected))

    prompts: dict[int, list[int]] = {}
    try:
        StepPrepass.protect_blocks = checking
        for n, (session, blocks, steps) in enumerate(stream):
            prompt = prompts.get(session, []) + list(range(10_000 * (n + 1),
                                                           10_000 * (n + 1) + 16 * blocks))
            prompts[session] = prompt
            sched.add_request(offline.make_request(f"r{n}", prompt, float(n)))
            for _ in range(steps):
                offline.step(sched)
        offline.run_until_idle(sched)
    finally:
        StepPrepass.protect_blocks = real
    assert not sched.has_requests()
    assert sched.fairway_totals.policy_fallbacks == 0
    assert checked  # the pre-pass protected in some step
