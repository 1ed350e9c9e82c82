"""The one door to vLLM's private names: every name Fairway reads or writes that vLLM does not
offer publicly, behind one small function each.

vLLM's scheduler, KV-cache and connector objects are not a public API: their fields move between
releases. Fairway touches them only through this package, as `from fairway.vllm import
internals; internals.X` (the names below); no other module of `fairway/` reads or writes one,
and none reads one with a `getattr` default: a name that is gone fails loudly, at start-up
(`check_internals`, `selftest`), not as a silent default in a step. Each access is tagged
`# vLLM internal: <name>` (a name, or the behaviour relied on); FAIRWAY.md ("Upgrading vLLM")
lists them, grouped, with what to check on an upgrade. Each function's docstring says why
Fairway needs it. Every function was checked on each supported release, 0.32, 0.33 and 0.34
(`make matrix` runs the tests named below on each); one whose reading differs by release names
the release of each reading, chosen by `versions.VllmShape` from vLLM's class declarations.

The topics, each a submodule, and the tests that cover their names (each submodule's docstring
says which test covers which name):

* `queues`: the waiting deque Fairway orders, the requests by id, the request slots and how far
  vLLM's scan reaches, vLLM 0.34's cache-aware window. `tests/integration/test_selftest.py`,
  `test_head_order.py`, `test_compat_priority.py`, `test_tenant_metrics.py`,
  `test_vllm_window.py`; `tests/unit/test_queue_table.py`.
* `outputs`: what a step started and scheduled, the model runner's answer, request errors.
  `tests/integration/test_selftest.py`, `test_oversized_error.py`, `test_prefill_node.py`,
  `test_sim.py`, `test_metrics_plugin.py`, `test_tenant_metrics.py`.
* `running`: the running list and the step's knobs (the step plan's cap and slots).
  `tests/integration/test_selftest.py`, `test_share_property.py`, `test_spec_decode_cap.py`,
  `test_idle_steps.py`.
* `kv_cache`: the prefix lookup, the block pool's hash map, the free queue.
  `tests/integration/test_selftest.py`, `test_probe.py`, `test_protect.py`.
* `kv_events`: where the scheduler publishes its KV cache events, and the keys they carry (the
  fleet replay only). `tests/integration/test_fleet_replay.py`.
* `offload`: vLLM's KV offloading connector (the CPU tier), for the tier probe and the replay's
  tier. `tests/integration/test_tier_probe.py`, `test_replay_offload.py`,
  `test_internals_offload.py`; `tests/unit/test_offload_sim.py`.
* `versions`: `VllmShape`, what changed between the supported releases.
  `tests/integration/test_selftest.py` (`OLD_READINGS`: each pre-0.33/0.34 reading is caught
  exactly on the releases that changed it).
* here: the start-up checks. `check_internals` and `check_step_plan_internals` test the tagged
  names (`INTERNAL_NAMES`, `STEP_PLAN_INTERNAL_NAMES`) when a Fairway scheduler starts, and
  `selftest` what they mean. `tests/integration/test_compat_names.py` (a live scheduler has
  them all), `test_internals_markers.py` (every tag is in a check list or says why not, and no
  tag names a public API), `test_options.py` (a missing name stops start-up, naming vLLM's
  version).

Not tagged: what vLLM 0.32 declares on its interfaces, i.e. `SchedulerInterface`'s methods
(`get_kv_connector`, `get_request_counts`, `update_draft_token_ids`, ...), the fields of the
objects they and the KV connector API take or return (`Request.request_id` / `arrival_time` /
`priority` / `sampling_params` / `num_tokens` / `num_prompt_tokens` / `num_computed_tokens` /
`num_output_tokens` / `status` / `is_finished()` / `block_hashes` / `kv_transfer_params`,
`SchedulerOutput` with its `NewRequestData` / `CachedRequestData`, `EngineCoreOutputs.outputs`),
the configuration's fields, and the KV cache manager's and block pool's methods
(`prefix_cache_lookup_enabled`, `get_num_free_blocks`); the per-request loops of `prefix_memo`,
`queue_table`, `queue_mirror` and `observe` read those `Request` fields inline.

Imports vLLM only inside the few functions that need its classes, so that modules which only read
vLLM objects (`calibrate`, `observe`) stay importable without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fairway.errors import FairwayError
from fairway.vllm.internals.kv_cache import (
    block_hash_map,
    block_key,
    block_pool,
    block_size_of,
    coordinator_of,
    ends_with,
    entry_block_reader,
    evictable_blocks,
    eviction_head,
    free_block_queue,
    free_blocks,
    group_key_suffix,
    hash_map_dict,
    hash_map_getter,
    keys_are_suffixed,
    kv_cache_manager,
    kv_usage,
    longest_cache_hit,
    move_to_mru_end,
    next_to_evict,
    pool_of,
    prefix_cache_lookup_enabled,
    skips_external_kv,
    supports_incremental,
    usable_blocks,
)
from fairway.vllm.internals.kv_events import (
    event_block_key,
    set_kv_event_publisher,
    stop_kv_events,
)
from fairway.vllm.internals.offload import (
    OffloadTransfers,
    finished_request_ids,
    kv_connector,
    max_load_tokens,
    offload_alignment_bytes,
    offload_busy_requests,
    offload_chunks_being_loaded,
    offload_generation,
    offload_group,
    offload_job_counter,
    offload_job_keys,
    offload_jobs,
    offload_key_suffix,
    offload_lookup,
    offload_lookup_results,
    offload_manager,
    offload_request_context,
    offload_tier_chunks,
    offload_transfers,
    offload_used_chunks,
    offload_worker_output,
    offloading_scheduler,
    set_finished_request_ids,
)
from fairway.vllm.internals.outputs import (
    error_message,
    explain_errors,
    model_runner_output,
    new_requests,
    prefill_by_request,
    prefill_tokens,
    report_request_error,
    reported_ids,
    resumed_ids,
    scheduled_spans,
    scheduled_tokens,
    started_ids,
    step_chunks,
)
from fairway.vllm.internals.queues import (
    cache_aware_admission_window,
    can_admit,
    deferred_count,
    free_slots,
    move_to_front,
    plain_waiting,
    priority_scheduling,
    reorder_queue,
    request_extra_args,
    request_fields,
    request_priority,
    request_tenant,
    requests_by_id,
    scan_bound,
    set_request_priority,
    times_preempted,
    use_fcfs_waiting_queue,
    vllm_config,
    waiting_queue,
)
from fairway.vllm.internals.running import (
    active_limit,
    chunked_prefill,
    decode_tokens_per_step,
    has_running_prefill,
    is_prefill_chunk,
    prefill_cap,
    prompt_tokens_left,
    running_prefills,
    running_requests,
    set_active_limit,
    set_prefill_cap,
    token_budget,
)
from fairway.vllm.internals.versions import VllmShape, _request_attrs, shape

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler

__all__ = [
    "FairwayError", "INTERNAL_NAMES", "OffloadTransfers", "STEP_PLAN_INTERNAL_NAMES", "VllmShape",
    "active_limit", "block_hash_map", "block_key", "block_pool", "block_size_of",
    "cache_aware_admission_window", "can_admit", "check_internals", "check_step_plan_internals",
    "chunked_prefill", "coordinator_of", "decode_tokens_per_step", "deferred_count", "ends_with",
    "entry_block_reader", "error_message", "event_block_key", "evictable_blocks", "eviction_head",
    "explain_errors",
    "finished_request_ids", "free_block_queue", "free_blocks", "free_slots", "group_key_suffix",
    "has_running_prefill", "hash_map_dict", "hash_map_getter", "is_prefill_chunk",
    "keys_are_suffixed", "kv_cache_manager", "kv_connector", "kv_usage", "longest_cache_hit",
    "max_load_tokens", "model_runner_output", "move_to_front", "move_to_mru_end", "new_requests",
    "next_to_evict",
    "offload_alignment_bytes", "offload_busy_requests", "offload_chunks_being_loaded",
    "offload_generation", "offload_group", "offload_job_counter", "offload_job_keys",
    "offload_jobs", "offload_key_suffix", "offload_lookup", "offload_lookup_results",
    "offload_manager", "offload_request_context", "offload_tier_chunks", "offload_transfers",
    "offload_used_chunks", "offload_worker_output", "offloading_scheduler", "plain_waiting",
    "pool_of", "prefill_by_request", "prefill_cap", "prefill_tokens",
    "prefix_cache_lookup_enabled", "priority_scheduling", "prompt_tokens_left", "reorder_queue",
    "report_request_error", "reported_ids", "request_extra_args", "request_fields",
    "request_priority", "request_tenant", "requests_by_id",
    "resumed_ids", "running_prefills", "running_requests", "scan_bound", "scheduled_spans",
    "scheduled_tokens", "set_active_limit", "set_finished_request_ids", "set_kv_event_publisher",
    "set_prefill_cap", "set_request_priority", "shape",
    "skips_external_kv", "started_ids", "step_chunks", "stop_kv_events", "supports_incremental",
    "times_preempted",
    "token_budget", "usable_blocks", "use_fcfs_waiting_queue", "vllm_config", "waiting_queue",
]


# --- start-up self-checks -------------------------------------------------------------------------
# Here, not in a submodule: the lists are the door's table of contents, and a test that patches
# `internals.INTERNAL_NAMES` patches what `check_internals` reads.

#: Every internal the ordering uses (dotted name as found on a live scheduler's objects).
INTERNAL_NAMES: tuple[str, ...] = (
    "Scheduler.waiting",
    "Scheduler.running",
    "Scheduler.requests",
    "Scheduler.deferred_waiting",
    "Scheduler.kv_cache_manager",
    "Scheduler.grammar_compile_error_reqs",
    "Scheduler.max_num_active_reqs",
    "Scheduler.num_waiting_for_streaming_input",
    "Scheduler.lora_config",
    "KVCacheManager.coordinator",
    "KVCacheManager.block_pool",
    "KVCacheCoordinator.find_longest_cache_hit",
    "KVCacheCoordinator.single_type_managers",
    "BlockPool.cached_block_hash_to_block",
    "BlockHashToBlockMap.get_one_block",
    "BlockHashToBlockMap._cache",
    "BlockPool.free_block_queue",
    "BlockPool.num_gpu_blocks",
    "BlockPool.hash_block_size",
    "FreeKVCacheBlockQueue.remove",
    "FreeKVCacheBlockQueue.append",
    "FreeKVCacheBlockQueue.fake_free_list_tail",
    "FreeKVCacheBlockQueue.fake_free_list_head",
    "KVCacheBlock.ref_cnt",
    "KVCacheBlock.block_hash",
    "KVCacheBlock.is_null",
    "KVCacheBlock.prev_free_block",
    "KVCacheBlock.next_free_block",
    "Request.num_preemptions",
)

#: The internals a step plan uses on top (a scheduler lacking one only orders the queue).
STEP_PLAN_INTERNAL_NAMES: tuple[str, ...] = (
    "Scheduler.running",
    "Scheduler.max_num_scheduled_tokens",
    "Scheduler.max_num_active_reqs",
    "Scheduler.adaptive_long_prefill_threshold",
    "SchedulerConfig.long_prefill_token_threshold",
    "SchedulerConfig.enable_chunked_prefill",
    "Request.is_prefill_chunk",
    "Request.num_tokens_with_spec",
    "Request.num_output_placeholders",
)

#: How `check_internals` reaches each owner of `INTERNAL_NAMES` from the scheduler:
#: (owner, its attribute, the owner that attribute holds).
_OWNERS: tuple[tuple[str, str, str], ...] = (
    ("Scheduler", "kv_cache_manager", "KVCacheManager"),
    ("KVCacheManager", "coordinator", "KVCacheCoordinator"),
    ("KVCacheManager", "block_pool", "BlockPool"),
    ("BlockPool", "cached_block_hash_to_block", "BlockHashToBlockMap"),
    ("BlockPool", "free_block_queue", "FreeKVCacheBlockQueue"),
)


def check_internals(scheduler: Scheduler) -> list[str]:
    """Names from `INTERNAL_NAMES` (and the queue type) missing on this live scheduler; what the
    names mean is `selftest`'s job. Requests are checked by class (a scheduler starts empty)."""
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue

    missing: list[str] = []
    if not (hasattr(scheduler, "waiting") and isinstance(scheduler.waiting, FCFSRequestQueue)):
        missing.append("Scheduler.waiting as FCFSRequestQueue (a deque)")
    objects: dict[str, Any] = {"Scheduler": scheduler, "KVCacheBlock": KVCacheBlock(0)}
    for owner, attr, held in _OWNERS:
        parent = objects.get(owner)
        if parent is not None and hasattr(parent, attr):
            objects[held] = getattr(parent, attr)
    request_attrs = _request_attrs()
    for name in INTERNAL_NAMES:
        owner, attr = name.split(".")
        if owner == "Request":
            found = attr in request_attrs
        else:
            obj = objects.get(owner)
            found = obj is not None and hasattr(obj, attr)
        if not found:
            missing.append(name)
    if hasattr(scheduler, "grammar_compile_error_reqs"):
        errors: Any = scheduler.grammar_compile_error_reqs
        if not isinstance(errors, (set, dict)):
            missing.append(
                f"Scheduler.grammar_compile_error_reqs as a set (0.32) or dict (0.33+), found "
                f"{type(errors).__name__}"
            )
    # public fields, checked too: the probe reads them on every waiting request
    for attr in ("request_id", "arrival_time", "num_tokens", "block_hashes", "status"):
        if attr not in request_attrs:
            missing.append(f"Request.{attr}")
    return missing


def check_step_plan_internals(scheduler: Scheduler) -> list[str]:
    """Names from `STEP_PLAN_INTERNAL_NAMES` missing on this live scheduler (requests checked by
    class)."""
    objects = {"Scheduler": scheduler, "SchedulerConfig": scheduler.scheduler_config}
    request_attrs = _request_attrs()
    missing = []
    for name in STEP_PLAN_INTERNAL_NAMES:
        owner, attr = name.split(".")
        if owner == "Request":
            if attr not in request_attrs:
                missing.append(name)
        elif not hasattr(objects[owner], attr):
            missing.append(name)
    return missing
