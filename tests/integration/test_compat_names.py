"""Every private vLLM name Fairway uses exists, with the shape Fairway relies on.

Run against a new vLLM before bumping the pin (`make compat`); a failure here names the internal
that moved, instead of a confusing error deep inside a scheduling step.
"""

from __future__ import annotations

import inspect
from collections import deque

import pytest

pytestmark = pytest.mark.integration


def test_live_scheduler_has_every_internal(offline):
    from fairway.vllm import internals

    for async_scheduling in (False, True):
        sched = offline.make_offline_scheduler("fcfs", async_scheduling=async_scheduling)
        assert internals.check_internals(sched) == []


def test_protect_reads_only_checked_internals():
    """Every vLLM internal that protect.py reads (through the `internals` functions it calls,
    each access marked "vLLM internal(s): ...") is in the start-up check list, so a vLLM that
    renames one fails at start-up, not in a scheduling step."""
    import re
    from pathlib import Path

    from fairway.vllm import internals, protect

    called = set(re.findall(r"internals\.(\w+)\(", Path(protect.__file__).read_text()))
    text = "".join(inspect.getsource(getattr(internals, name)) for name in sorted(called))
    marked = {
        name.strip()
        for names in re.findall(r"vLLM internals?: ([^\n]*)", text)
        for name in re.findall(r"[A-Z]\w+\.\w+", names)
    }
    assert "FreeKVCacheBlockQueue.remove" in marked and "KVCacheBlock.ref_cnt" in marked
    assert marked - set(internals.INTERNAL_NAMES) == set()


def test_queue_is_a_deque():
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue, SchedulingPolicy

    assert issubclass(FCFSRequestQueue, deque)
    assert SchedulingPolicy("fcfs") is SchedulingPolicy.FCFS


def test_scheduler_surface():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler

    assert issubclass(AsyncScheduler, Scheduler)
    assert "throttle_prefills" in inspect.signature(Scheduler.schedule).parameters
    init = inspect.signature(Scheduler.__init__).parameters
    for name in ("vllm_config", "kv_cache_config", "structured_output_manager", "block_size"):
        assert name in init
    fields = SchedulerOutput.__dataclass_fields__
    assert "num_scheduled_tokens" in fields and "scheduled_new_reqs" in fields
    for method in ("update_from_output", "finish_requests", "add_request", "has_requests"):
        assert callable(getattr(Scheduler, method))


def test_kv_cache_surface():
    from vllm.v1.core.block_pool import BlockHashToBlockMap, BlockPool
    from vllm.v1.core.kv_cache_coordinator import KVCacheCoordinator, UnitaryKVCacheCoordinator
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import (
        FreeKVCacheBlockQueue,
        KVCacheBlock,
        make_block_hash_with_group_id,
    )
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager

    params = list(inspect.signature(KVCacheCoordinator.find_longest_cache_hit).parameters)
    assert params[1:3] == ["block_hashes", "max_cache_hit_length"]
    assert issubclass(UnitaryKVCacheCoordinator, KVCacheCoordinator)
    assert FullAttentionManager.find_longest_cache_hit
    assert callable(KVCacheManager.prefix_cache_lookup_enabled)
    assert callable(KVCacheManager.get_computed_blocks)
    assert callable(BlockPool.get_cached_block) and callable(BlockHashToBlockMap.get_one_block)
    for name in ("remove", "append", "get_all_free_blocks"):
        assert callable(getattr(FreeKVCacheBlockQueue, name))
    block = KVCacheBlock(1)
    for name in ("ref_cnt", "block_hash", "is_null", "prev_free_block", "next_free_block"):
        assert hasattr(block, name)
    assert make_block_hash_with_group_id(b"x" * 32, 0) != make_block_hash_with_group_id(
        b"x" * 32, 1
    )
    queue = FreeKVCacheBlockQueue([KVCacheBlock(0), KVCacheBlock(1)])
    assert queue.fake_free_list_tail.prev_free_block.block_id == 1  # protect.py's MRU check


def test_request_surface(offline):
    from vllm.v1.request import RequestStatus

    request = offline.make_request("r", list(range(40)), 5.0)
    assert request.request_id == "r" and request.arrival_time == 5.0
    assert request.num_tokens == 40 and request.num_prompt_tokens == 40
    assert len(request.block_hashes) == 2 and request.num_computed_tokens == 0
    assert request.status == RequestStatus.WAITING
    assert RequestStatus.PREEMPTED and RequestStatus.FINISHED_ERROR
    assert hasattr(request, "is_prefill_chunk") and hasattr(request, "num_preemptions")


def test_error_finish_path(offline):
    """`grammar_compile_error_reqs` (a set in 0.32, a dict of RequestError from 0.33) is drained
    by update_from_output into FINISHED_ERROR."""
    from fairway.vllm import internals

    sched = offline.make_offline_scheduler(None)
    sched.add_request(offline.make_request("e", list(range(40)), 5.0))
    internals.report_request_error(sched, "e", "why")
    out = sched.schedule()
    sched.update_from_output(out, offline.fake_model_output(sched, out))
    assert "e" not in sched.requests


@pytest.mark.parametrize(
    "qualname",
    [
        "fairway.vllm.FairwayScheduler",
        "fairway.vllm.scheduler.FairwayScheduler",
        "fairway.vllm.FairwayAsyncScheduler",
        "fairway.vllm.scheduler.FairwayAsyncScheduler",
    ],
)
def test_scheduler_cls_names_resolve_as_vllm_does(qualname):
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from fairway.vllm import scheduler

    cls = resolve_obj_by_qualname(qualname)
    assert cls is getattr(scheduler, qualname.rsplit(".", 1)[1])
