"""`TierTransfers`: the offloading worker's copies on the virtual clock (vLLM's metadata types)."""

from __future__ import annotations

import os

import pytest

from fairway.errors import FairwayConfigError
from fairway.profiling.load_cost import LoadCost
from fairway.replay.offload_sim import TierTransfers, blocks_for_gib, gib_of_blocks

os.environ.setdefault("HF_HUB_OFFLINE", "1")
common = pytest.importorskip(
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.common")
from vllm.v1.kv_offload.base import GPULoadStoreSpec  # noqa: E402
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec  # noqa: E402

BLOCK = 16
#: 1 byte per token; loads 1,000 tokens/s, stores 500 tokens/s: a block loads in 16 ms.
COST = LoadCost(kv_bytes_per_token=1, h2d_bytes_per_s=1_000.0, d2h_bytes_per_s=500.0)
LOAD_BLOCK_S = BLOCK / 1_000.0
STORE_BLOCK_S = BLOCK / 500.0


def gpu(n: int) -> GPULoadStoreSpec:
    return GPULoadStoreSpec(list(range(1, n + 1)), group_sizes=[n], block_indices=[0])


def cpu(n: int) -> CPULoadStoreSpec:
    return CPULoadStoreSpec(list(range(n)))


def load(req: str, blocks: int) -> common.TransferJob:
    return common.TransferJob(req, cpu(blocks), gpu(blocks))


def store(req: str, blocks: int) -> common.TransferJob:
    return common.TransferJob(req, gpu(blocks), cpu(blocks))


def meta(loads=None, stores=None, flush=None) -> common.OffloadingConnectorMetadata:
    return common.OffloadingConnectorMetadata(
        load_jobs=dict(loads or {}), store_jobs=dict(stores or {}), jobs_to_flush=flush)


def completed(output) -> dict[int, int]:
    return dict(output.kv_connector_worker_meta.completed_jobs)


def test_queued_loads_run_one_after_the_other():
    tier = TierTransfers(COST, BLOCK)
    assert tier.start_step(meta(loads={1: load("a", 2), 2: load("b", 3)}), 10.0) == 0.0
    assert tier.pending
    assert tier.next_completion() == pytest.approx(10.0 + 2 * LOAD_BLOCK_S)
    assert tier.finish_step(10.0 + 2 * LOAD_BLOCK_S - 1e-9) is None
    first = tier.finish_step(10.0 + 2 * LOAD_BLOCK_S)
    assert first.finished_recving == {"a"} and completed(first) == {1: 1}
    assert tier.next_completion() == pytest.approx(10.0 + 5 * LOAD_BLOCK_S)  # queued behind a
    second = tier.finish_step(11.0)
    assert second.finished_recving == {"b"} and completed(second) == {2: 1}
    assert not tier.pending and tier.next_completion() is None
    assert tier.loaded_by_request == {"a": 2 * BLOCK, "b": 3 * BLOCK}
    assert (tier.counters.loads, tier.counters.loaded_tokens) == (2, 5 * BLOCK)
    assert tier.counters.load_s == pytest.approx(5 * LOAD_BLOCK_S)


def test_a_load_queues_behind_an_unfinished_one_of_an_earlier_step():
    tier = TierTransfers(COST, BLOCK)
    tier.start_step(meta(loads={1: load("a", 10)}), 0.0)  # busy until 0.16
    tier.finish_step(0.05)
    tier.start_step(meta(loads={2: load("b", 1)}), 0.05)
    tier.finish_step(0.1)
    assert tier.next_completion() == pytest.approx(10 * LOAD_BLOCK_S)
    tier.finish_step(10 * LOAD_BLOCK_S)
    assert tier.next_completion() == pytest.approx(11 * LOAD_BLOCK_S)


def test_stores_are_deferred_to_the_next_step_and_reported_without_finished_recving():
    tier = TierTransfers(COST, BLOCK)
    tier.start_step(meta(stores={5: store("a", 1)}), 0.0)
    assert tier.pending and tier.next_completion() is None  # not submitted yet
    assert tier.finish_step(100.0) is None  # nothing submitted, nothing done
    tier.start_step(meta(), 1.0)  # the next step submits it
    assert tier.next_completion() == pytest.approx(1.0 + STORE_BLOCK_S)
    out = tier.finish_step(1.0 + STORE_BLOCK_S)
    assert completed(out) == {5: 1}
    assert not out.finished_recving and not out.finished_sending
    assert not tier.pending
    assert (tier.counters.stores, tier.counters.stored_tokens) == (1, BLOCK)


def test_loads_and_stores_use_separate_links():
    tier = TierTransfers(COST, BLOCK)
    tier.start_step(meta(stores={1: store("a", 4)}), 0.0)
    tier.start_step(meta(loads={2: load("b", 1)}), 0.0)  # the store starts now, beside the load
    assert tier.next_completion() == pytest.approx(LOAD_BLOCK_S)
    out = tier.finish_step(LOAD_BLOCK_S)
    assert out.finished_recving == {"b"} and completed(out) == {2: 1}
    assert tier.next_completion() == pytest.approx(4 * STORE_BLOCK_S)


def test_a_flush_submits_its_store_now_behind_the_deferred_ones_and_waits():
    tier = TierTransfers(COST, BLOCK)
    tier.start_step(meta(stores={1: store("a", 2)}), 0.0)  # deferred
    # next step: job 1 is submitted first, then flushed job 2 (this step's), job 3 waits a step
    delay = tier.start_step(meta(stores={2: store("b", 1), 3: store("c", 5)}, flush={2}), 1.0)
    assert delay == pytest.approx(3 * STORE_BLOCK_S)
    assert tier.counters.flushes == 1 and tier.counters.flush_wait_s == pytest.approx(delay)
    assert tier.counters.stores == 2  # job 3 is still deferred
    out = tier.finish_step(1.0 + delay)
    assert completed(out) == {1: 1, 2: 1}
    assert tier.pending and tier.next_completion() is None


def test_loads_start_after_the_flush_wait():
    tier = TierTransfers(COST, BLOCK)
    tier.start_step(meta(stores={1: store("a", 1)}), 0.0)
    delay = tier.start_step(meta(loads={2: load("b", 1)}, flush={1}), 0.0)
    assert delay == pytest.approx(STORE_BLOCK_S)
    assert tier.next_completion() == pytest.approx(STORE_BLOCK_S)  # the store
    out = tier.finish_step(delay)  # the step's end: the load is still running
    assert completed(out) == {1: 1} and not out.finished_recving
    assert tier.next_completion() == pytest.approx(delay + LOAD_BLOCK_S)


def test_flushing_a_finished_or_unknown_job_waits_nothing():
    tier = TierTransfers(COST, BLOCK)
    tier.start_step(meta(stores={1: store("a", 1)}), 0.0)
    tier.start_step(meta(), 0.0)
    assert tier.start_step(meta(flush={1, 99}), 5.0) == 0.0  # done at 0.032, not yet polled
    assert tier.counters.flushes == 0
    assert completed(tier.finish_step(5.0)) == {1: 1}


def test_no_metadata_and_an_idle_tier():
    tier = TierTransfers(COST, BLOCK)
    assert tier.start_step(None, 0.0) == 0.0
    assert tier.finish_step(1.0) is None
    assert not tier.pending and tier.next_completion() is None


def test_report_carries_vllm_transfer_stats():
    tier = TierTransfers(COST, BLOCK)
    tier.start_step(meta(loads={1: load("a", 2)}), 0.0)
    stats = tier.finish_step(1.0).kv_connector_worker_meta.transfer_stats
    assert stats.load.bytes == 2 * BLOCK * COST.kv_bytes_per_token
    assert stats.load.time == pytest.approx(2 * LOAD_BLOCK_S)
    assert stats.store.is_empty()


def test_gib_sizing():
    cost = LoadCost(kv_bytes_per_token=131_072, h2d_bytes_per_s=1e9, d2h_bytes_per_s=1e9)
    assert blocks_for_gib(1.0, cost, 16) == 512  # 2**30 / (128 KiB x 16)
    assert blocks_for_gib(1.5, cost, 16) == 768
    assert gib_of_blocks(512, cost, 16) == 1.0
    for bad in (0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(FairwayConfigError, match="kv-offloading-size"):
            blocks_for_gib(bad, cost, 16)
    with pytest.raises(FairwayConfigError, match="holds no block"):
        blocks_for_gib(1e-6, cost, 16)


def test_finished_ids_iterate_in_finish_order_whatever_the_hash_seed():
    from types import SimpleNamespace

    from fairway.vllm.offload_worker import FinishOrder, order_finished_ids

    engine = SimpleNamespace(finished_req_ids={"b", "a"})
    order_finished_ids(engine)  # what was there: sorted
    ids = engine.finished_req_ids
    assert isinstance(ids, FinishOrder) and list(ids) == ["a", "b"]
    for rid in ("r9", "r10", "a", "r2"):
        ids.add(rid)
    assert list(ids) == ["a", "b", "r9", "r10", "r2"] and len(ids) == 5 and "r10" in ids
    ids.discard("r9")
    set.add(ids, "c")  # an id added behind its back comes last, sorted
    assert list(ids) == ["a", "b", "r10", "r2", "c"]
    order_finished_ids(engine)
    assert engine.finished_req_ids is ids  # already ordered: kept
