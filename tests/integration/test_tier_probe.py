"""The offload-tier probe through vLLM's real Scheduler with its `OffloadingConnector` configured:
its tier hit is what the connector then loads, request for request; a request whose tier blocks
are in flight is ordered behind the rest and never holds the step; a tier Fairway cannot read
leaves the order tier-blind with one warning; an empty tier changes nothing.

The connector's worker half needs a GPU; `_Worker` answers its jobs instead (loads done within
the step, stores one step later, or held), as the replay's simulated worker does with times.
"""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.integration

BS = 16


def _scheduler(offline, policy="fairway", *, num_blocks=40, tier_blocks=400, options=None,
               **kwargs):
    from fairway.vllm import offload_worker

    sched = offline.make_offline_scheduler(
        policy, num_blocks=num_blocks, log_stats=False, fairway_options=options,
        kv_transfer_config=offload_worker.transfer_config(tier_blocks), **kwargs,
    )
    offload_worker.check_tier_blocks(sched, tier_blocks)
    return sched


class _Worker:
    """The connector's worker half, answered at once: a load completes in the step that
    scheduled it, a store in the next step (unless `hold_stores`)."""

    def __init__(self) -> None:
        self.stores: list[int] = []
        self.hold_stores = False
        self.loads: dict[str, int] = {}  # request id -> tokens loaded (last load)

    def answer(self, output, model_output):
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata,
        )
        from vllm.v1.outputs import KVConnectorOutput

        meta = output.kv_connector_metadata
        done: dict[int, int] = {}
        received: set[str] = set()
        for job_id, job in meta.load_jobs.items():
            done[job_id] = 1
            received.add(job.req_id)
            self.loads[job.req_id] = len(job.dst_spec.block_ids) * BS
        if not self.hold_stores:
            done |= dict.fromkeys(self.stores, 1)
            self.stores = []
        self.stores += list(meta.store_jobs)
        model_output.kv_connector_output = KVConnectorOutput(
            finished_recving=received,
            kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=done),
        )
        return model_output

    def step(self, offline, sched):
        output = sched.schedule()
        model_output = self.answer(output, offline.fake_model_output(sched, output))
        sched.update_from_output(output, model_output)
        return output


def _record_lookups(sched, *, with_gpu: bool = False) -> dict[str, tuple]:
    """Wrap the tier probe's lookup: request id -> (tier tokens, deferred) at the last step
    ((GPU hit, tier tokens, deferred) `with_gpu`)."""
    tier = sched.fairway_mirror.tier
    assert tier is not None
    seen: dict[str, tuple[int, bool]] = {}
    original = tier.lookup

    def lookup(requests, slots, gpu, *args):
        tokens, deferred = original(requests, slots, gpu, *args)
        seen.clear()
        for r, g, t, d in zip(requests, gpu.tolist(), tokens.tolist(), deferred.tolist(),
                              strict=True):
            seen[r.request_id] = (g, t, d) if with_gpu else (t, d)
        return tokens, deferred

    tier.lookup = lookup
    return seen


def _warm_tier(offline, helpers, sched, worker, docs):
    """Prefill each document once (stored to the tier), then enough others to evict them from
    the small GPU cache."""
    for i, doc in enumerate(docs):
        sched.add_request(offline.make_request(f"warm{i}", doc, float(i)))
    for _ in range(60):
        worker.step(offline, sched)
        if not sched.has_unfinished_requests():
            break
    for _ in range(3):  # the last stores complete
        worker.step(offline, sched)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000))
def test_probe_equals_what_the_connector_loads(offline, helpers, seed):
    """Random documents and arrivals. For every request vLLM admits, the probe's GPU + tier hit
    at the step's ordering is what vLLM starts it from (local + loaded tokens), and its tier hit
    is the connector's load, except for the blocks that moved to the GPU within the step
    (blocks of a prefix another request computes in the same step are cached at allocation,
    before this request is looked at: its GPU hit grows by them and its load shrinks by them)."""
    rng = random.Random(seed)
    sched = _scheduler(offline, num_blocks=48, tier_blocks=600, max_num_batched_tokens=256,
                       max_num_seqs=3)
    worker = _Worker()
    seen = _record_lookups(sched, with_gpu=True)
    docs = [helpers.tokens(10_000 * (d + 1), BS * rng.randint(3, 12)) for d in range(5)]
    _warm_tier(offline, helpers, sched, worker, docs)
    exact = moved = 0
    for step in range(80):
        if step < 40 and rng.random() < 0.6:
            for _ in range(rng.randint(1, 3)):
                doc = rng.choice(docs)
                cut = rng.randint(1, len(doc) // BS) * BS
                suffix = helpers.tokens(500_000 + 1_000 * step + rng.randint(0, 999),
                                        rng.randint(1, 40))
                sched.add_request(offline.make_request(
                    f"r{step}-{rng.random():.6f}", doc[:cut] + suffix, float(100 + step)
                ))
        output = worker.step(offline, sched)
        loads = {job.req_id: len(job.dst_spec.block_ids) * BS
                 for job in output.kv_connector_metadata.load_jobs.values()}
        for new in output.scheduled_new_reqs:
            if new.req_id not in seen:
                continue  # arrived after the ordering (not probed this step)
            gpu, tier, deferred = seen[new.req_id]
            assert not deferred, new.req_id  # vLLM did not skip it: it was not in flight
            assert gpu + tier == new.num_computed_tokens, (new.req_id, gpu, tier)
            loaded = loads.get(new.req_id, 0)
            local = new.num_computed_tokens - loaded
            assert local >= gpu and loaded == tier - (local - gpu), (new.req_id, seen[new.req_id])
            exact += local == gpu
            moved += local > gpu
        if step >= 40 and not sched.has_unfinished_requests():
            break
    assert exact > 0


def test_a_tier_hit_is_priced_as_a_load(offline, helpers):
    """A prompt whose prefix left the GPU cache but sits in the tier: the probe reads it, the
    order's h counts it at (1 - load/compute) per token, and vLLM loads exactly that."""
    sched = _scheduler(offline)
    worker = _Worker()
    seen = _record_lookups(sched)
    doc = helpers.tokens(1, 400)  # 25 blocks
    _warm_tier(offline, helpers, sched, worker, [doc, helpers.tokens(1_000, 600)])
    assert sched.fairway_mirror.fresh_cached_tokens(
        offline.make_request("x", doc + [5], 0.0)
    ) < 100  # evicted from the 40-block GPU cache
    sched.add_request(offline.make_request("hit", doc + helpers.tokens(90_000, 20), 50.0))
    sched.add_request(offline.make_request("miss", helpers.tokens(70_000, 100), 50.0))
    output = worker.step(offline, sched)
    tokens, deferred = seen["hit"]
    assert not deferred and tokens >= 300
    assert worker.loads["hit"] == tokens
    assert seen["miss"] == (0, False)
    last = sched.fairway_prepass.last
    weight = sched.fairway_mirror.tier.weight
    assert 0.9 < weight < 1.0  # priced: the shipped A6000 estimate, ~0.025 of a recompute
    by_id = dict(zip(last.columns.request_ids, last.columns.cached_tokens.tolist(), strict=True))
    gpu = by_id["hit"] - round(weight * tokens)
    assert 0 <= gpu < 100 and by_id["miss"] == 0
    # loading (WAITING_FOR_REMOTE_KVS) in this step; computed from gpu + tokens in the next
    assert "hit" not in {r.req_id for r in output.scheduled_new_reqs}
    output = worker.step(offline, sched)
    started = {r.req_id: r.num_computed_tokens for r in output.scheduled_new_reqs}
    assert started.get("hit") == gpu + tokens


def test_a_request_that_skips_the_prefix_cache_gets_no_tier_hit(offline, helpers):
    """`skip_reading_prefix_cache` (0.34: any prefix-cache hit limit): vLLM loads nothing from
    the tier for the request, and the probe counts nothing either. 0.34 dropped the flag from
    `Request` (it reads `skip_reading_external_kv`); read with a default, the probe would count
    the tier's prefix there."""
    sched = _scheduler(offline)
    worker = _Worker()
    seen = _record_lookups(sched)
    doc = helpers.tokens(1, 400)
    _warm_tier(offline, helpers, sched, worker, [doc, helpers.tokens(1_000, 600)])
    tail = helpers.tokens(90_000, 20)
    sched.add_request(offline.make_request("skip", doc + tail, 50.0,
                                           skip_reading_prefix_cache=True))
    sched.add_request(offline.make_request("hit", doc + tail[:10], 50.0))
    worker.step(offline, sched)
    assert seen["skip"] == (0, False)
    hit_tokens = seen["hit"][0]
    assert hit_tokens >= 300  # the same prefix, read from the tier
    for _ in range(4):
        worker.step(offline, sched)
    assert "skip" not in worker.loads and worker.loads.get("hit") == hit_tokens


def test_a_capped_request_is_probed_as_the_connector_loads_it(offline, helpers):
    """`kv_transfer_params={"max_load_tokens": 128}` (`internals.max_load_tokens`): the probe
    counts the 128 tier tokens the connector then loads, not the whole prefix the tier holds
    (>= 300 tokens: `test_a_tier_hit_is_priced_as_a_load`)."""
    sched = _scheduler(offline)
    worker = _Worker()
    seen = _record_lookups(sched)
    doc = helpers.tokens(1, 400)
    _warm_tier(offline, helpers, sched, worker, [doc, helpers.tokens(1_000, 600)])
    sched.add_request(offline.make_request(
        "capped", doc + helpers.tokens(90_000, 20), 50.0,
        extra_args={"kv_transfer_params": {"max_load_tokens": 128}}))
    worker.step(offline, sched)
    assert seen["capped"] == (128, False)
    assert worker.loads == {"capped": 128}


def test_a_request_with_tier_blocks_in_flight_never_holds_the_step(offline, helpers):
    """Its blocks' store has not completed (HIT_PENDING): the connector would defer it, so the
    probe marks it deferred, the order puts it behind the others, and the step admits them."""
    sched = _scheduler(offline, max_num_batched_tokens=512, max_num_seqs=4)
    worker = _Worker()
    seen = _record_lookups(sched)
    doc = helpers.tokens(1, 320)
    sched.add_request(offline.make_request("writer", doc, 0.0))
    worker.hold_stores = True  # the writer's stores stay in flight
    worker.step(offline, sched)
    assert worker.stores
    # the prefix is computed on the GPU; evict it so that only the (pending) tier could serve
    sched.reset_prefix_cache()
    sched.add_request(offline.make_request("pending", doc + helpers.tokens(80_000, 30), 1.0))
    for i in range(3):
        sched.add_request(offline.make_request(f"other{i}", helpers.tokens(60_000 + 1_000 * i,
                                                                            100), 2.0 + i))
    output = worker.step(offline, sched)
    assert seen["pending"][1] is True  # deferred
    ids = {r.req_id for r in output.scheduled_new_reqs}
    assert {"other0", "other1", "other2"} <= ids
    assert "pending" not in ids
    last = sched.fairway_prepass.last
    assert "pending" not in last.columns.request_ids  # not ordered: no plan counts on it
    # once the stores complete, it is a plain tier hit: loaded, then admitted
    worker.hold_stores = False
    for _ in range(6):
        worker.step(offline, sched)
    assert worker.loads.get("pending", 0) >= 300


def test_an_unreadable_tier_is_tier_blind_with_one_warning(offline, helpers, monkeypatch, caplog):
    """An offloading config the probe cannot read: the scheduler starts, warns once, orders
    tier-blind, and every step runs."""
    from fairway.vllm import internals

    def unreadable(tier_scheduler):
        raise internals.FairwayError("the offload tier has 2 KV groups (one is read)")

    monkeypatch.setattr(internals, "offload_group", unreadable)
    with caplog.at_level(logging.WARNING):
        sched = _scheduler(offline)
    warnings = [r for r in caplog.records if "offload tier" in r.getMessage()]
    assert len(warnings) == 1 and "tier-blind" in warnings[0].getMessage()
    assert sched.fairway_mirror.tier is None
    worker = _Worker()
    sched.add_request(offline.make_request("a", helpers.tokens(1, 100), 0.0))
    worker.step(offline, sched)
    assert sched.fairway_totals.policy_fallbacks == 0


def test_a_failing_tier_lookup_falls_back_for_the_step(offline, helpers):
    """The probe raising mid-step: that step keeps vLLM's order (counted), the engine serves."""
    sched = _scheduler(offline)
    worker = _Worker()

    def boom(*args, **kwargs):
        raise RuntimeError("tier lookup failed")

    sched.fairway_mirror.tier.lookup = boom
    sched.add_request(offline.make_request("a", helpers.tokens(1, 100), 0.0))
    sched.add_request(offline.make_request("b", helpers.tokens(500, 100), 0.0))
    output = worker.step(offline, sched)
    assert {r.req_id for r in output.scheduled_new_reqs} == {"a", "b"}
    assert sched.fairway_totals.policy_fallbacks >= 1


@pytest.mark.parametrize("rule", ["priced", "equal", "fixed", "blind"])
def test_an_empty_tier_changes_no_order(offline, helpers, rule):
    """Unique prompts (the tier never holds a waiting request's prefix): with the connector
    and any rule, each step's order is the tier-less scheduler's."""
    rng = random.Random(7)
    prompts = [helpers.tokens(1_000 * i + 1, rng.randint(20, 600)) for i in range(1, 30)]
    orders = []
    for tiered in (False, True):
        if tiered:
            sched = _scheduler(offline, options={"tier": rule}, max_num_batched_tokens=512)
        else:
            sched = offline.make_offline_scheduler(
                "fairway", num_blocks=40, log_stats=False, max_num_batched_tokens=512
            )
        worker = _Worker()
        order = []
        for i, p in enumerate(prompts):
            sched.add_request(offline.make_request(f"q{i}", p, float(i // 3)))
            if i % 3 == 2:
                out = worker.step(offline, sched) if tiered else offline.step(sched)[0]
                order.append(sorted(out.num_scheduled_tokens.items()))
        for _ in range(40):
            out = worker.step(offline, sched) if tiered else offline.step(sched)[0]
            order.append(sorted(out.num_scheduled_tokens.items()))
        orders.append(order)
    assert orders[0] == orders[1]
