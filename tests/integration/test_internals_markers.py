"""The `# vLLM internal` markers, the start-up check lists and vLLM's public API agree.

* every marker is inside `fairway.vllm.internals` (the one door);
* every name in `internals.INTERNAL_NAMES` / `STEP_PLAN_INTERNAL_NAMES` is marked somewhere in
  `fairway/vllm` (the lists hold no public or unused names);
* every marked name on the objects those lists check is in a list, or in `UNCHECKED` with the
  reason it needs no start-up check;
* no marker names what vLLM 0.32 offers publicly (`PUBLIC`), and each of those public names
  exists: a rebase that finds one gone reads it here, not in a step.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

VLLM_DIR = Path(__file__).resolve().parents[2] / "fairway" / "vllm"

#: Owners whose names `check_internals` / `check_step_plan_internals` can test.
CHECKED_OWNERS = {
    "Scheduler", "SchedulerConfig", "KVCacheManager", "KVCacheCoordinator", "BlockPool",
    "BlockHashToBlockMap", "FreeKVCacheBlockQueue", "KVCacheBlock", "Request",
}

#: Marked names on those owners that are in no check list, and why.
UNCHECKED = {
    "Scheduler.vllm_config": "vLLM's own __init__ sets it; the mixin reads it before any check",
    "Scheduler.scheduler_config": "check_step_plan_internals reads it to check the config",
    "Scheduler.finished_req_ids": "the offline replay's offload tier only "
    "(offload_worker.order_finished_ids)",
    "Scheduler.kv_event_publisher": "the fleet replay's KV events only (fleet_signals."
    "capture_kv_events); a server publishes its events as vLLM does",
    "BlockPool.enable_kv_cache_events": "the fleet replay only (fleet_signals.stop_kv_events, "
    "a router that reads no events); a server leaves vLLM's setting alone",
    "Request.skip_reading_prefix_cache": "0.32/0.33 only (VllmShape.hit_limit picks it or "
    "skip_reading_external_kv); the self-test checks what it means",
    "Request.skip_reading_external_kv": "0.34 only (VllmShape.hit_limit); the self-test checks "
    "what it means",
    "Request.num_computed_tokens": "a public field; the marker is on schedule()'s timing",
    "KVCacheCoordinator.eagle_group_ids": "0.32 only (drop_eagle_group_ids from 0.33), read "
    "after supports_incremental's coordinator check",
    "KVCacheCoordinator.drop_eagle_group_ids": "0.33 and 0.34 (eagle_group_ids in 0.32)",
    "BlockPool.blocks": "0.34's map entries index it (VllmShape.map_holds_ids); the self-test "
    "reads entries through it",
    "SchedulerConfig.cache_aware_admission_window": "0.34 only: read when the config declares it",
}

#: Names vLLM 0.32 offers publicly, which Fairway reads untagged: name -> where vLLM declares it.
PUBLIC = {
    "Scheduler.connector": "SchedulerInterface.get_kv_connector()",
    "KVCacheManager.prefix_cache_lookup_enabled": "a public KVCacheManager method",
    "SchedulerOutput.num_scheduled_tokens": "SchedulerInterface.schedule()'s result",
    "SchedulerOutput.scheduled_new_reqs": "SchedulerInterface.schedule()'s result",
    "SchedulerOutput.kv_connector_metadata": "SchedulerInterface.schedule()'s result",
    "NewRequestData.num_computed_tokens": "SchedulerOutput.scheduled_new_reqs",
    "EngineCoreOutputs.outputs": "SchedulerInterface.update_from_output()'s result",
    "Request.request_id": "the Request fields the KV connector API reads",
    "Request.arrival_time": "the Request fields (EngineCoreRequest.arrival_time)",
    "Request.priority": "the Request fields the KV connector API reads",
    "Request.sampling_params": "the Request fields the KV connector API reads",
    "Request.num_tokens": "the Request fields the KV connector API reads",
    "Request.num_prompt_tokens": "the Request fields the KV connector API reads",
    "Request.status": "the Request fields the KV connector API reads",
    "Request.num_output_tokens": "the Request fields the KV connector API reads",
    "Request.is_finished": "the Request fields the KV connector API reads",
    "Request.block_hashes": "the Request fields the KV connector API reads",
    "Request.kv_transfer_params": "the Request fields the KV connector API reads",
    "RequestStatus.PREEMPTED": "vLLM's RequestStatus enum",
    "SamplingParams.extra_args": "a documented SamplingParams field (`vllm_xargs`)",
}


def _marked() -> dict[str, list[str]]:
    """Dotted names in the markers of fairway/vllm (with continuation comment lines)."""
    names: dict[str, list[str]] = {}
    for path in sorted(VLLM_DIR.rglob("*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            match = re.search(r"# vLLM internals?:(.*)", line)
            if not match:
                continue
            text = match.group(1)
            j = i + 1
            while j < len(lines) and lines[j].strip().startswith("#") and (
                "vLLM internal" not in lines[j]
            ):
                text += " " + lines[j].strip().lstrip("#")
                j += 1
            # "Owner.a / b / c" is shorthand for Owner.a, Owner.b, Owner.c
            for owner, attr, more in re.findall(
                r"\b([A-Z]\w+)\.(\w+)((?:\s*/\s*[a-z_]\w*\b(?![.(]))*)", text
            ):
                for name in (attr, *re.findall(r"[a-z_]\w*", more)):
                    names.setdefault(f"{owner}.{name}", []).append(f"{path.name}:{i + 1}")
    return names


def test_every_vllm_internal_is_read_through_the_door():
    """No module of `fairway/` outside `fairway.vllm.internals` tags (so reads or writes) a vLLM
    internal: the package is the one door."""
    package = VLLM_DIR.parent
    door = VLLM_DIR / "internals"
    outside: dict[str, list[int]] = {}
    for path in sorted(package.rglob("*.py")):
        if door in path.parents:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"# vLLM internals?:", line):
                outside.setdefault(path.relative_to(package).as_posix(), []).append(i)
    assert outside == {}


def test_check_lists_hold_only_marked_names():
    from fairway.vllm import internals

    marked = _marked()
    listed = set(internals.INTERNAL_NAMES) | set(internals.STEP_PLAN_INTERNAL_NAMES)
    assert sorted(listed - set(marked)) == []


def test_every_checkable_marked_name_is_checked_or_explained():
    from fairway.vllm import internals

    listed = set(internals.INTERNAL_NAMES) | set(internals.STEP_PLAN_INTERNAL_NAMES)
    checkable = {n for n in _marked() if n.split(".")[0] in CHECKED_OWNERS}
    assert sorted(checkable - listed - set(UNCHECKED)) == []
    assert sorted(set(UNCHECKED) - checkable) == []  # no stale explanation
    assert sorted(set(UNCHECKED) & listed) == []


def test_no_marker_names_a_public_api():
    marked = _marked()
    assert {n: marked[n] for n in PUBLIC if n in marked} == {}


def test_the_public_names_exist(offline):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.interface import SchedulerInterface
    from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.request import RequestStatus

    for method in ("get_kv_connector", "get_request_counts", "update_draft_token_ids"):
        assert callable(getattr(SchedulerInterface, method))
    assert callable(KVCacheManager.prefix_cache_lookup_enabled)
    for name in ("num_scheduled_tokens", "scheduled_new_reqs", "scheduled_cached_reqs",
                 "kv_connector_metadata"):
        assert name in SchedulerOutput.__dataclass_fields__
    assert "num_computed_tokens" in NewRequestData.__dataclass_fields__
    assert "outputs" in EngineCoreOutputs.__struct_fields__
    assert {"request_id", "finish_reason", "stop_reason"} <= set(EngineCoreOutput.__struct_fields__)
    assert RequestStatus.PREEMPTED and "extra_args" in SamplingParams.__struct_fields__
    request = offline.make_request("r", list(range(40)), 5.0, priority=2)
    for name, api in PUBLIC.items():
        owner, attr = name.split(".")
        if owner == "Request":
            assert hasattr(request, attr), api
    sched = offline.make_offline_scheduler("fcfs", max_num_seqs=4)
    assert sched.get_kv_connector() is None and sched.get_request_counts() == (0, 0)
