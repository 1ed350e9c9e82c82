"""Every private vLLM name Fairway reads or writes, behind one function each.

vLLM's scheduler, KV-cache and connector objects are not a public API: their fields move between
releases. Fairway touches them only through the functions here. Each access of a name vLLM does not
offer publicly is tagged `# vLLM internal: <name>` (a name, or the behaviour relied on); FAIRWAY.md
("Upgrading vLLM") lists them, grouped, with what to check on an upgrade. Not tagged: what vLLM
0.32 declares on its interfaces, i.e. `SchedulerInterface`'s methods (`get_kv_connector`,
`get_request_counts`, `update_draft_token_ids`, ...), the fields of the objects they and the KV
connector API take or return (`Request.request_id` / `arrival_time` / `priority` /
`sampling_params` / `num_tokens` / `num_prompt_tokens` / `num_computed_tokens` / `status` /
`block_hashes` / `kv_transfer_params`, `SchedulerOutput` with its `NewRequestData` /
`CachedRequestData`, `EngineCoreOutputs.outputs`), the configuration's fields, and the KV cache
manager's and block pool's methods (`prefix_cache_lookup_enabled`, `get_num_free_blocks`); the
per-request loops of `prefix_memo`, `queue_slots` and `probe` read those `Request` fields inline.
`check_internals()` and `check_step_plan_internals()` test the tagged names when a Fairway
scheduler starts, and `tests/integration/test_compat_names.py` tests them against a new vLLM before
the pin moves.

Imports vLLM only inside the few functions that need its classes, so that modules which only read
vLLM objects (`calibrate`, `observe`) stay importable without it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from fairway.errors import FairwayError
from fairway.policies.queue import PrefillingRequest
from fairway.tenants import TENANT_KEY

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_coordinator import KVCacheCoordinator
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import BlockHash, FreeKVCacheBlockQueue, KVCacheBlock
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request


# --- what changed between the supported releases ----------------------------------------------


@dataclass(frozen=True)
class VllmShape:
    """How the running vLLM spells what changed between the supported releases, read once from
    its class declarations (never guessed from a missing attribute: each branch is a known
    release's meaning, and the start-up self-test exercises the one taken)."""

    #: `CachedRequestData.resumed_req_ids` lists resumed requests apart from the new ones (0.32,
    #: 0.33); 0.34 sends them in `scheduled_new_reqs`.
    resumed_apart: bool
    #: `ModelRunnerOutput` takes `req_id_to_index` (0.32, 0.33; removed in 0.34).
    runner_output_index: bool
    #: `BlockHashToBlockMap` entries are block ids into the pool's blocks (0.34); before, a block
    #: or a dict of duplicate blocks.
    map_holds_ids: bool
    #: `Request.prefix_cache_hit_limit` bounds what a request may read from the caches (0.34);
    #: before, the flag `Request.skip_reading_prefix_cache`.
    hit_limit: bool


@functools.cache
def shape() -> VllmShape:
    """The running vLLM's `VllmShape`."""
    import inspect

    from vllm.v1.core.block_pool import BlockHashToBlockMap
    from vllm.v1.core.sched.output import CachedRequestData
    from vllm.v1.outputs import ModelRunnerOutput

    return VllmShape(
        resumed_apart="resumed_req_ids" in CachedRequestData.__dataclass_fields__,
        runner_output_index="req_id_to_index" in ModelRunnerOutput.__dataclass_fields__,
        map_holds_ids="blocks" in inspect.signature(BlockHashToBlockMap.__init__).parameters,
        hit_limit="prefix_cache_hit_limit" in _request_attrs(),
    )


# --- scheduler and request fields -----------------------------------------------------------------


def waiting_queue(scheduler: Scheduler) -> FCFSRequestQueue:
    """The queue Fairway orders: new and preempted requests that hold no KV blocks.

    vLLM types the field as any `RequestQueue`; a Fairway scheduler refuses to start unless it
    is the FCFS deque (`check_internals`), so the type here states what start-up established
    (no check per call: it runs several times per step).
    """
    return cast("FCFSRequestQueue", scheduler.waiting)  # vLLM internal: Scheduler.waiting


def reorder_queue(queue: FCFSRequestQueue, requests: Sequence[Request]) -> None:
    """Replace the deque's contents by `requests` (a permutation of them), in place.

    In place because vLLM holds the queue object; the order survives until the scan pops it.
    """
    queue.clear()  # vLLM internal: FCFSRequestQueue is a deque
    queue.extend(requests)


def move_to_front(queue: FCFSRequestQueue, positions: list[int]) -> None:
    """Move the requests at `positions` (distinct) to the front of the deque, in that order,
    the others keeping theirs; in place.

    One turn of the deque by rotations (pointer copies, n in all) with a pop at each moved
    position: unlike `reorder_queue`, no request but the moved ones is touched (see
    `queue_slots.MAX_IN_PLACE` for what a touch costs on a big queue).
    """
    moved = {}
    at = 0  # queue[0] is the request at position `at` of the original order
    for position in sorted(positions):
        queue.rotate(at - position)  # vLLM internal: FCFSRequestQueue is a deque
        moved[position] = queue.popleft()
        at = position + 1
    queue.rotate(at - len(queue) - len(moved))  # the first original request back in front
    queue.extendleft(moved[p] for p in reversed(positions))


def kv_cache_manager(scheduler: Scheduler) -> KVCacheManager:
    """The scheduler's KV cache manager."""
    return scheduler.kv_cache_manager  # vLLM internal: Scheduler.kv_cache_manager


def block_pool(scheduler: Scheduler) -> BlockPool:
    """The block pool (free queue, hash map) behind the scheduler's KV cache."""
    return scheduler.kv_cache_manager.block_pool  # vLLM internal: KVCacheManager.block_pool


def requests_by_id(scheduler: Scheduler) -> Mapping[str, Request]:
    """The scheduler's live requests by id (waiting and running)."""
    return scheduler.requests  # vLLM internal: Scheduler.requests


def vllm_config(scheduler: Any) -> VllmConfig:
    """The engine's configuration."""
    return scheduler.vllm_config  # vLLM internal: Scheduler.vllm_config


def request_tenant(request: Request) -> object:
    """The tenant a request names in `vllm_xargs` (`SamplingParams.extra_args["tenant"]`), or
    None (no sampling parameters, no extra arguments, no tenant)."""
    # `vllm_xargs` of an OpenAI request fills `SamplingParams.extra_args`
    params = request.sampling_params  # None for a pooling request
    extra = params.extra_args if params is not None else None
    return extra.get(TENANT_KEY) if isinstance(extra, dict) else None


def request_priority(request: Request) -> int:
    """vLLM's priority of a request (lower first)."""
    return int(request.priority)


def priority_scheduling(scheduler: Scheduler) -> bool:
    """Whether the engine runs `--scheduling-policy priority`."""
    return str(scheduler.scheduler_config.policy) == "priority"


def use_fcfs_waiting_queue(scheduler: Scheduler) -> bool:
    """Under `--scheduling-policy priority`, swap vLLM's (still empty) waiting heap for its FCFS
    deque, which Fairway orders in place with the priority levels first (vLLM's own rule
    between levels); vLLM's preemption by priority reads `scheduler.policy`, left as it is.
    Returns whether it swapped."""
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue, PriorityRequestQueue

    waiting = scheduler.waiting  # vLLM internal: Scheduler.waiting
    if not isinstance(waiting, PriorityRequestQueue):
        return False
    if len(waiting):
        raise FairwayError("the waiting queue is not empty at start-up; cannot order it")
    scheduler.waiting = FCFSRequestQueue()  # vLLM internal: Scheduler.waiting
    return True


def request_fields(request: Request) -> tuple[str, float, int]:
    """(request_id, arrival_time, num_tokens = prompt + output so far)."""
    return request.request_id, request.arrival_time, request.num_tokens


def free_slots(scheduler: Scheduler) -> int:
    """How many waiting requests vLLM's step may still start: its free request slots.

    vLLM's admission loop stops at once when `running` (plus paused streaming sessions) fills
    `max_num_active_reqs` (0.32; `max_num_running_reqs`, the slot count, elsewhere). Preemption in
    the step only sends requests back to the queue and also stops admission.
    """
    # vLLM internal: Scheduler.max_num_active_reqs / num_waiting_for_streaming_input
    limit: int = scheduler.max_num_active_reqs
    paused: int = scheduler.num_waiting_for_streaming_input
    running = scheduler.get_request_counts()[0]  # len(running)
    return max(0, limit - running - paused)


def can_admit(scheduler: Scheduler) -> bool:
    """False when vLLM's step cannot start a waiting request: every request slot is taken."""
    return free_slots(scheduler) > 0


def scan_bound(scheduler: Scheduler, free: int | None = None) -> int | None:
    """How many positions of the waiting queue vLLM's scan can reach this step; None: any.

    The scan starts at most `free_slots` requests, taken from the head in order, and reads one
    more position for each request it skips without starting it. Requests it skipped in earlier
    steps and that still wait (`deferred_waiting`: grammar not ready, remote KV loading, stale
    output) are counted as possible skips. The LoRA limit and a KV connector can skip any request,
    so with either configured the bound is None (order the whole queue). `free`: `free_slots`,
    if the caller has it.
    """
    if scheduler.lora_config is not None:  # vLLM internal: Scheduler.lora_config
        return None
    if scheduler.get_kv_connector() is not None:
        return None
    return (free_slots(scheduler) if free is None else free) + deferred_count(scheduler)


def scheduled_tokens(output: SchedulerOutput) -> Mapping[str, int]:
    """Tokens scheduled per request id in one step."""
    return output.num_scheduled_tokens


def started_ids(output: SchedulerOutput) -> list[str]:
    """Ids of the requests a step took from the waiting queue: new ones and resumed ones, without
    the running ones' decodes."""
    return [*(data.req_id for data in output.scheduled_new_reqs), *resumed_ids(output)]


def new_requests(scheduler: Any, output: SchedulerOutput) -> list[tuple[str, Request, int]]:
    """(id, request, cached tokens at admission) of each new request of a step that the scheduler
    still holds; the count is vLLM's `num_computed_tokens` of the new-request data."""
    requests = scheduler.requests  # vLLM internal: Scheduler.requests
    return [
        (data.req_id, requests[data.req_id], data.num_computed_tokens)
        for data in output.scheduled_new_reqs
        if data.req_id in requests
    ]


def resumed_ids(output: SchedulerOutput) -> Iterable[str]:
    """Ids of the preempted requests a step resumed that are not among its new requests.

    0.32 and 0.33 list them apart (`CachedRequestData.resumed_req_ids`); from 0.34 a resumed
    request comes in `scheduled_new_reqs` with the new ones, so none is apart.
    """
    if shape().resumed_apart:
        # vLLM internal: CachedRequestData.resumed_req_ids (0.32, 0.33)
        return output.scheduled_cached_reqs.resumed_req_ids
    return ()


def model_runner_output(
    req_ids: list[str], sampled_token_ids: list[list[int]]
) -> ModelRunnerOutput:
    """A model runner's answer with these sampled tokens (the offline replay's fake model).

    0.32 and 0.33 also want `req_id_to_index` (each id's row), which 0.34 removed.
    """
    from vllm.v1.outputs import ModelRunnerOutput

    rows: dict[str, Any] = {}
    if shape().runner_output_index:
        # vLLM internal: ModelRunnerOutput.req_id_to_index (0.32, 0.33)
        rows["req_id_to_index"] = {req_id: i for i, req_id in enumerate(req_ids)}
    return ModelRunnerOutput(
        req_ids=req_ids,
        sampled_token_ids=sampled_token_ids,
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
        **rows,
    )


def reported_ids(result: Any, limit: int) -> list[str] | None:
    """Ids of the requests in `update_from_output`'s result (a dict of client index ->
    `EngineCoreOutputs`, whose `outputs` carry `request_id`); None if it has another shape or
    more than `limit` of them (then checking the pending requests costs less)."""
    if not isinstance(result, dict):
        return None
    ids: list[str] = []
    for outputs in result.values():
        items = getattr(outputs, "outputs", None)
        if not isinstance(items, list) or len(ids) + len(items) > limit:
            return None
        ids += [item.request_id for item in items]
    return ids


def step_chunks(scheduler_output: Any) -> list[tuple[int, int]]:
    """(new_tokens, computed_before) per request of a vLLM `SchedulerOutput` (read-only).

    `num_computed_tokens` in the output is the value before this step: vLLM builds the request
    data before it advances the counters (`_update_after_schedule`).
    """
    scheduled: Mapping[str, int] = scheduler_output.num_scheduled_tokens
    chunks = [
        (scheduled.get(req.req_id, 0), req.num_computed_tokens)
        for req in scheduler_output.scheduled_new_reqs
    ]
    cached = scheduler_output.scheduled_cached_reqs
    chunks += [
        (scheduled.get(req_id, 0), computed)
        for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=False)
    ]
    return [(n, p) for n, p in chunks if n > 0]


def prefill_tokens(scheduler: Scheduler, output: SchedulerOutput) -> int:
    """Tokens of this step that computed prompt positions (prefill), summed over requests.

    Called after `schedule()`, when vLLM has already advanced `num_computed_tokens` by the
    scheduled count: a request was prefilling if it started the step below its prompt length.
    A resumed preempted request recomputes prompt + earlier output, all of it counted.
    """
    requests = scheduler.requests  # vLLM internal: Scheduler.requests
    total = 0
    for req_id, n in output.num_scheduled_tokens.items():
        request = requests.get(req_id)
        # vLLM internal: schedule() advances Request.num_computed_tokens before it returns
        if request is not None and request.num_computed_tokens - n < request.num_prompt_tokens:
            total += n
    return total


def scheduled_spans(
    scheduler: Scheduler, scheduled: Mapping[str, int]
) -> dict[str, tuple[int, int, int]]:
    """request id -> (start, end, prompt tokens) of the positions each request computes this step.

    Read after `schedule()`, which has already advanced `num_computed_tokens` by the scheduled
    count, so the span is [computed - n, computed). Used by the virtual replay's cost model.
    """
    requests = scheduler.requests  # vLLM internal: Scheduler.requests
    spans = {}
    for request_id, n in scheduled.items():
        request = requests[request_id]
        # vLLM internal: schedule() advances Request.num_computed_tokens before it returns
        end = request.num_computed_tokens
        spans[request_id] = (end - n, end, request.num_prompt_tokens)
    return spans


def deferred_count(scheduler: Scheduler) -> int:
    """How many waiting requests vLLM skipped (blocked status etc.); bounds the admission scan."""
    return len(scheduler.deferred_waiting)  # vLLM internal: Scheduler.deferred_waiting


def report_request_error(scheduler: Scheduler, request_id: str, reason: str) -> None:
    """Have vLLM finish a waiting request with FINISHED_ERROR at the next `update_from_output`.

    vLLM finishes a waiting request with an error output delivered to its client only from
    `update_from_output`, via what it drains there; `grammar_compile_error_reqs` is the one that
    needs no other state. 0.32 keeps a set of ids, and its error output carries no text
    (`explain_errors` adds `reason` as its `stop_reason`). From 0.33 it maps each id to a
    `RequestError`, vLLM's type for a request-level error: an `AsyncLLM` client (the OpenAI
    server) gets `reason` as a validation error.
    """
    # vLLM internal: Scheduler.grammar_compile_error_reqs (a set of ids in 0.32, a dict of
    # RequestError since 0.33; `check_internals` refuses anything else at start-up)
    errors = scheduler.grammar_compile_error_reqs
    if isinstance(errors, dict):
        from vllm.outputs import RequestError

        errors[request_id] = RequestError(code="validation_error", message=reason)
    else:
        errors.add(request_id)


def explain_errors(result: Any, reasons: dict[str, str]) -> None:
    """Put `reasons[request_id]` in the `stop_reason` of that request's error output in
    `update_from_output`'s result (client index -> `EngineCoreOutputs`); each reason given is
    removed from `reasons`.

    0.32 has no field for an error's text on a generation request: the error output
    `update_from_output` builds for a `report_request_error` request carries `finish_reason`
    ERROR and nothing else, and its output processor copies `stop_reason` into the client's
    `CompletionOutput.stop_reason`; vLLM's OpenAI server answers every "error" finish with HTTP
    500 "Internal server error". From 0.33 the output's `error` carries the text to an
    `AsyncLLM` client; an `LLM.generate` caller still reads it in `stop_reason`.
    """
    from vllm.v1.engine import FinishReason

    if not isinstance(result, dict):
        return
    for outputs in result.values():
        for item in outputs.outputs:
            if item.finish_reason == FinishReason.ERROR and item.request_id in reasons:
                # vLLM internal: EngineCoreOutput.stop_reason of an error output (vLLM leaves
                # it None; the output processor forwards it to CompletionOutput.stop_reason)
                item.stop_reason = reasons.pop(item.request_id)


# --- the running list and the step's knobs (the step plan) --------------------------------------


def running_requests(scheduler: Scheduler) -> list[Request]:
    """vLLM's RUNNING list itself (served first, in list order); callers may reorder it."""
    return scheduler.running  # vLLM internal: Scheduler.running (a list)


def chunked_prefill(scheduler: Scheduler) -> bool:
    """The share needs chunked prefill (a capped request continues in the next step)."""
    # vLLM internal: Scheduler.scheduler_config / SchedulerConfig.enable_chunked_prefill
    return bool(scheduler.scheduler_config.enable_chunked_prefill)


def cache_aware_admission_window(vllm_config: VllmConfig) -> int:
    """vLLM's `--cache-aware-admission-window` (0.34; 0: off, as in releases without it)."""
    from vllm.config import SchedulerConfig

    if "cache_aware_admission_window" not in SchedulerConfig.__dataclass_fields__:
        return 0  # 0.32, 0.33: no such option
    # vLLM internal: SchedulerConfig.cache_aware_admission_window (0.34; no default: declared)
    return int(getattr(vllm_config.scheduler_config, "cache_aware_admission_window"))  # noqa: B009


def token_budget(scheduler: Scheduler) -> int:
    """Tokens one step may schedule (`--max-num-batched-tokens`)."""
    return scheduler.max_num_scheduled_tokens  # vLLM internal: Scheduler.max_num_scheduled_tokens


def prefill_cap(scheduler: Scheduler) -> tuple[int, bool]:
    """(long_prefill_token_threshold, adaptive_long_prefill_threshold): the per-request cap of
    a step and whether vLLM may raise it (re-read at the start of every step)."""
    config = scheduler.scheduler_config  # vLLM internal: Scheduler.scheduler_config
    # vLLM internal: SchedulerConfig.long_prefill_token_threshold
    # vLLM internal: Scheduler.adaptive_long_prefill_threshold
    return config.long_prefill_token_threshold, scheduler.adaptive_long_prefill_threshold


def decode_tokens_per_step(scheduler: Scheduler) -> int:
    """The most tokens one running decode takes in a step: its sampled token plus the draft
    tokens of speculative decoding (`--speculative-config`'s `num_speculative_tokens`, 0
    without it; vLLM's `Scheduler.num_spec_tokens` is a copy of it)."""
    return 1 + int(vllm_config(scheduler).num_speculative_tokens)


def set_prefill_cap(scheduler: Scheduler, threshold: int, adaptive: bool) -> None:
    """Set what `prefill_cap` reads."""
    # vLLM internal: SchedulerConfig.long_prefill_token_threshold (re-read by every schedule())
    scheduler.scheduler_config.long_prefill_token_threshold = threshold
    # vLLM internal: Scheduler.adaptive_long_prefill_threshold
    scheduler.adaptive_long_prefill_threshold = adaptive


def active_limit(scheduler: Scheduler) -> int:
    """The request-slot limit vLLM's admission stops at."""
    return scheduler.max_num_active_reqs  # vLLM internal: Scheduler.max_num_active_reqs


def set_active_limit(scheduler: Scheduler, limit: int) -> None:
    """Set what `active_limit` reads."""
    scheduler.max_num_active_reqs = limit  # vLLM internal: Scheduler.max_num_active_reqs


def is_prefill_chunk(request: Request) -> bool:
    """vLLM's flag for a running request whose prompt is not computed yet."""
    return request.is_prefill_chunk  # vLLM internal: Request.is_prefill_chunk


def running_prefills(
    scheduler: Scheduler, classify: Callable[[Request], tuple[int, int]] | None = None
) -> tuple[list[PrefillingRequest], int]:
    """Views of the running requests still in prefill, and the tokens the other running ones
    (decodes) may take this step (one per request, more with placeholders or spec tokens).
    `classify`: request -> (tenant code, priority level) of each view (None: 0 and 0)."""
    views: list[PrefillingRequest] = []
    decode_tokens = 0
    view = PrefillingRequest
    for request in scheduler.running:  # vLLM internal: Scheduler.running
        # vLLM internal: Request.is_prefill_chunk (as `_in_prefill`, inlined: this runs for
        # every running request every step)
        num_tokens, computed = request.num_tokens, request.num_computed_tokens
        if request.is_prefill_chunk and num_tokens > computed:
            classes = classify(request) if classify is not None else (0, 0)
            views.append(
                view(request.request_id, request.arrival_time, num_tokens - computed, num_tokens,
                     *classes)
            )
        else:
            # vLLM internal: Request.num_tokens_with_spec / num_output_placeholders
            need = request.num_tokens_with_spec + request.num_output_placeholders - computed
            decode_tokens += need if need > 0 else 0
    return views, decode_tokens


def has_running_prefill(scheduler: Scheduler) -> bool:
    """Whether a running request is still in prefill (one `running_prefills` would list)."""
    return any(map(_in_prefill, scheduler.running))  # vLLM internal: Scheduler.running


def _in_prefill(request: Request) -> bool:
    """A running request whose prompt is not computed yet (a chunked prefill in progress)."""
    # vLLM internal: Request.is_prefill_chunk
    return request.is_prefill_chunk and request.num_tokens > request.num_computed_tokens


def prefill_by_request(scheduler: Scheduler, output: SchedulerOutput) -> dict[str, int]:
    """Prompt tokens scheduled per request in `output` (read right after `schedule()`)."""
    requests: Mapping[str, Request] = scheduler.requests  # vLLM internal: Scheduler.requests
    result: dict[str, int] = {}
    for request_id, n in output.num_scheduled_tokens.items():
        request = requests.get(request_id)
        if request is None:
            continue
        # vLLM internal: schedule() advances Request.num_computed_tokens before it returns
        start = request.num_computed_tokens - n
        prompt = max(request.num_prompt_tokens, request.num_tokens - 1)
        if start < prompt:
            result[request_id] = min(n, prompt - start)
    return result


# --- the KV cache ---------------------------------------------------------------------------------


def coordinator_of(manager: KVCacheManager) -> KVCacheCoordinator:
    """The KV-cache coordinator (the prefix lookup across groups)."""
    return manager.coordinator  # vLLM internal: KVCacheManager.coordinator


def pool_of(manager: KVCacheManager) -> BlockPool:
    """The block pool of a KV cache manager."""
    return manager.block_pool  # vLLM internal: KVCacheManager.block_pool


def block_size_of(manager: KVCacheManager) -> int:
    """Tokens per block of the (first) KV-cache group."""
    # vLLM internal: KVCacheCoordinator.single_type_managers
    managers = manager.coordinator.single_type_managers
    return int(managers[0].block_size) if managers else 1


def usable_blocks(scheduler: Scheduler) -> int:
    """KV blocks a single request could ever hold: the pool minus vLLM's null block."""
    return block_pool(scheduler).num_gpu_blocks - 1  # vLLM internal: BlockPool.num_gpu_blocks


def free_blocks(scheduler: Scheduler) -> int:
    """KV blocks vLLM can hand out now: free ones and cached ones no request holds."""
    return int(block_pool(scheduler).get_num_free_blocks())


def free_block_queue(scheduler: Scheduler) -> FreeKVCacheBlockQueue:
    """vLLM's queue of evictable blocks, LRU first."""
    return block_pool(scheduler).free_block_queue  # vLLM internal: BlockPool.free_block_queue


def prefix_cache_lookup_enabled(manager: KVCacheManager, request: Request) -> bool:
    """False where vLLM skips the prefix lookup for a request (prompt logprobs, pooling)."""
    return bool(manager.prefix_cache_lookup_enabled(request))


def skips_external_kv(request: Request) -> bool:
    """Whether vLLM loads none of this request's prefix from a KV connector (the CPU tier).

    0.34: `Request.skip_reading_external_kv`, true for any request with a prefix-cache hit
    limit (skipping the cache, or prompt logprobs); 0.32 and 0.33: the flag
    `Request.skip_reading_prefix_cache`.
    """
    if shape().hit_limit:
        # vLLM internal: Request.skip_reading_external_kv (0.34; no default: the name exists)
        return bool(getattr(request, "skip_reading_external_kv"))  # noqa: B009
    # vLLM internal: Request.skip_reading_prefix_cache (0.32, 0.33)
    return bool(request.skip_reading_prefix_cache)


def longest_cache_hit(
    coordinator: KVCacheCoordinator, block_hashes: list[BlockHash], max_length: int
) -> tuple[Any, int]:
    """vLLM's own lookup: (cached blocks per KV-cache group, hit length in tokens).

    Read-only at the coordinator level (no ref counts, stats or free-queue moves); it walks the
    hashes from the start.
    """
    # vLLM internal: KVCacheCoordinator.find_longest_cache_hit
    result = coordinator.find_longest_cache_hit(
        block_hashes, max_length
    )
    return result[0], int(result[1])


def block_hash_map(pool: BlockPool) -> Any:
    """The pool's block-hash map; vLLM replaces the object on `reset_prefix_cache()`."""
    return pool.cached_block_hash_to_block  # vLLM internal: BlockPool.cached_block_hash_to_block


def hash_map_dict(hash_map: Any) -> dict[bytes, Any]:
    """The plain dict behind the hash map: key -> an entry (`entry_block_reader` reads it)."""
    cache: dict[bytes, Any] = hash_map._cache  # vLLM internal: BlockHashToBlockMap._cache
    return cache


def hash_map_getter(hash_map: Any) -> Any:
    """The hash map's public getter: key -> a block, or None."""
    return hash_map.get_one_block  # vLLM internal: BlockHashToBlockMap.get_one_block


def entry_block_reader(pool: BlockPool) -> Callable[[Any], KVCacheBlock | None]:
    """entry -> one block of a hash-map entry (None -> None).

    0.34 keeps a block id, an index into `BlockPool.blocks`; 0.32 and 0.33 a block, or a dict
    of duplicate blocks.
    """
    if shape().map_holds_ids:
        blocks = pool.blocks  # vLLM internal: BlockPool.blocks (0.34: what map entries index)
        return lambda entry: None if entry is None else blocks[entry]
    return _one_block


def _one_block(entry: Any) -> KVCacheBlock | None:
    # vLLM internal: BlockHashToBlockMap entries (0.32, 0.33: a block, or a dict of duplicates)
    if entry is None or not isinstance(entry, dict):
        return entry
    return next(iter(entry.values()), None)


def group_key_suffix(group_id: int = 0) -> bytes:
    """What vLLM's hash-map key of a block hash appends to the hash for a KV-cache group
    (`make_block_hash_with_group_id`, 0.32: the group id in 4 big-endian bytes)."""
    from vllm.v1.core.kv_cache_utils import BlockHash, make_block_hash_with_group_id

    # vLLM internal: make_block_hash_with_group_id (the hash-map key's encoding)
    return make_block_hash_with_group_id(BlockHash(b""), group_id)


def keys_are_suffixed() -> bool:
    """Whether vLLM builds a group-0 key by appending `group_key_suffix()` to the block hash."""
    from vllm.v1.core.kv_cache_utils import BlockHash, make_block_hash_with_group_id

    sample = BlockHash(bytes(range(32)))
    return make_block_hash_with_group_id(sample, 0) == sample + group_key_suffix()


def supports_incremental(coordinator: KVCacheCoordinator, pool: BlockPool) -> bool:
    """Whether the cached-prefix memo is exact: one full-attention group hashed at the block size
    (no EAGLE, no context parallelism), with hash-map keys built by appending the group suffix."""
    from vllm.v1.core.kv_cache_coordinator import UnitaryKVCacheCoordinator
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager

    if not isinstance(coordinator, UnitaryKVCacheCoordinator):
        return False
    manager = coordinator.single_type_managers[0]
    return (
        type(manager) is FullAttentionManager
        and not _eagle_groups(coordinator)  # EAGLE drops the last hit block
        and pool.hash_block_size == manager.block_size  # vLLM internal: BlockPool.hash_block_size
        # vLLM internal: UnitaryKVCacheCoordinator.dcp_world_size / pcp_world_size
        and coordinator.dcp_world_size == 1
        and coordinator.pcp_world_size == 1
        and keys_are_suffixed()
    )


def _eagle_groups(coordinator: KVCacheCoordinator) -> set[int]:
    # vLLM internal: KVCacheCoordinator.drop_eagle_group_ids / eagle_group_ids (the groups whose
    # last hit block is dropped: the first from 0.33, the second in 0.32)
    if hasattr(coordinator, "drop_eagle_group_ids"):
        return set(getattr(coordinator, "drop_eagle_group_ids"))  # noqa: B009 (0.32 lacks it)
    return set(coordinator.eagle_group_ids)


# --- the free queue (soft eviction protection) ----------------------------------------------------


def evictable_blocks(blocks: Iterable[KVCacheBlock]) -> list[KVCacheBlock]:
    """The blocks no request holds (ref_cnt == 0, i.e. in the free queue), with a hash (cached),
    other than the null block (never in the free queue)."""
    # vLLM internals: KVCacheBlock.ref_cnt, KVCacheBlock.block_hash, KVCacheBlock.is_null
    return [b for b in blocks if b.ref_cnt == 0 and b.block_hash is not None and not b.is_null]


def move_to_mru_end(free_queue: FreeKVCacheBlockQueue, blocks: Iterable[KVCacheBlock]) -> None:
    """Move free blocks to the MRU end of the free queue, in this order (the last one last)."""
    for block in blocks:
        free_queue.remove(block)  # vLLM internal: FreeKVCacheBlockQueue.remove (O(1))
        free_queue.append(block)  # vLLM internal: FreeKVCacheBlockQueue.append


def ends_with(free_queue: FreeKVCacheBlockQueue, wanted: Sequence[KVCacheBlock]) -> bool:
    """True if the free queue already ends with wanted[-1], ..., wanted[0] (wanted[0] last)."""
    # vLLM internals: FreeKVCacheBlockQueue.fake_free_list_tail, KVCacheBlock.prev_free_block
    node: KVCacheBlock | None = free_queue.fake_free_list_tail  # the list's tail sentinel
    for block in wanted:
        node = node.prev_free_block if node is not None else None
        if node is not block:
            return False
    return True


# --- start-up self-checks -------------------------------------------------------------------------

#: Every internal the ordering uses (dotted name as found on a live scheduler's objects).
INTERNAL_NAMES: tuple[str, ...] = (
    "Scheduler.waiting",
    "Scheduler.running",
    "Scheduler.max_num_running_reqs",
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
    "KVCacheBlock.ref_cnt",
    "KVCacheBlock.block_hash",
    "KVCacheBlock.is_null",
    "KVCacheBlock.prev_free_block",
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


def check_internals(scheduler: Scheduler) -> list[str]:
    """Names from `INTERNAL_NAMES` (and the queue type) missing on this live scheduler; what the
    names mean is `selftest`'s job."""
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue

    missing: list[str] = []
    if not isinstance(getattr(scheduler, "waiting", None), FCFSRequestQueue):
        missing.append("Scheduler.waiting as FCFSRequestQueue (a deque)")
    objects: dict[str, Any] = {"Scheduler": scheduler}
    manager = getattr(scheduler, "kv_cache_manager", None)
    objects["KVCacheManager"] = manager
    objects["KVCacheCoordinator"] = getattr(manager, "coordinator", None)
    pool = getattr(manager, "block_pool", None)
    objects["BlockPool"] = pool
    objects["BlockHashToBlockMap"] = getattr(pool, "cached_block_hash_to_block", None)
    objects["FreeKVCacheBlockQueue"] = getattr(pool, "free_block_queue", None)
    objects["KVCacheBlock"] = KVCacheBlock(0)
    for name in INTERNAL_NAMES:
        owner, attr = name.split(".")
        obj = objects.get(owner)
        if obj is None or not hasattr(obj, attr):
            missing.append(name)
    errors = getattr(scheduler, "grammar_compile_error_reqs", None)
    if errors is not None and not isinstance(errors, (set, dict)):
        missing.append(
            f"Scheduler.grammar_compile_error_reqs as a set (0.32) or dict (0.33+), found "
            f"{type(errors).__name__}"
        )
    # public fields, checked too: the probe reads them on every waiting request
    for attr in ("request_id", "arrival_time", "num_tokens", "block_hashes", "status"):
        if attr not in _request_attrs():
            missing.append(f"Request.{attr}")
    return missing


def check_step_plan_internals(scheduler: Scheduler) -> list[str]:
    """Names from `STEP_PLAN_INTERNAL_NAMES` missing on this live scheduler (requests checked by
    class)."""
    from vllm.v1.request import Request

    objects = {"Scheduler": scheduler, "SchedulerConfig": scheduler.scheduler_config}
    init_names = set(Request.__init__.__code__.co_names) | set(dir(Request))
    missing = []
    for name in STEP_PLAN_INTERNAL_NAMES:
        owner, attr = name.split(".")
        if owner == "Request":
            if attr not in init_names:
                missing.append(name)
        elif not hasattr(objects[owner], attr):
            missing.append(name)
    return missing


def _request_attrs() -> set[str]:
    """Attribute names a Request has (properties on the class, fields set in __init__)."""
    from vllm.v1.request import Request

    names = set(dir(Request))
    init = Request.__init__.__code__
    names.update(init.co_names)  # attribute names assigned in __init__ (self.x = ...)
    return names


# --- vLLM's KV offloading connector (the CPU tier) ---------------------------------------------


def kv_connector(scheduler: Scheduler) -> Any:
    """The scheduler-side KV connector, or None (no `--kv-transfer-config` / offloading)."""
    return scheduler.get_kv_connector()


def offloading_scheduler(connector: Any) -> Any:
    """The `OffloadingConnectorScheduler` of an `OffloadingConnector` (None: another connector).

    Read by class name, not imported: the connector module pulls in torch's CUDA paths on some
    builds, and a Fairway scheduler without offloading must not import it.
    """
    if type(connector).__name__ != "OffloadingConnector":
        return None
    return connector.connector_scheduler  # vLLM internal: OffloadingConnector.connector_scheduler


def offload_group(tier_scheduler: Any) -> tuple[int, int, int]:
    """(group index, tokens per chunk, block hashes per chunk) of the tier's one KV group.

    Raises `FairwayError` for what the probe does not read: several KV groups (hybrid models),
    sliding-window or EAGLE groups, partial-tail loads.
    """
    config = tier_scheduler.config  # vLLM internal: OffloadingConnectorScheduler.config
    groups = config.kv_group_configs  # vLLM internal: SchedulerOffloadConfig.kv_group_configs
    if len(groups) != 1:
        raise FairwayError(f"the offload tier has {len(groups)} KV groups (one is read)")
    group = groups[0]
    # vLLM internal: GroupOffloadConfig.sliding_window_size_in_chunks / is_eagle_group
    if group.sliding_window_size_in_chunks is not None or group.is_eagle_group:
        raise FairwayError("the offload tier's KV group is sliding-window or EAGLE")
    if config.supports_partial_tail:  # vLLM internal: SchedulerOffloadConfig.supports_partial_tail
        raise FairwayError("the offload tier loads partial tails")
    # vLLM internal: GroupOffloadConfig.group_idx / tokens_per_chunk / hashes_per_chunk
    return int(group.group_idx), int(group.tokens_per_chunk), int(group.hashes_per_chunk)


def offload_manager(tier_scheduler: Any) -> Any:
    """The tier's `OffloadingManager` (its `lookup(key, ctx)` reads without side effects for
    vLLM's CPU manager: a dict read)."""
    return tier_scheduler.manager  # vLLM internal: OffloadingConnectorScheduler.manager


def offload_lookup_results() -> tuple[Any, Any]:
    """vLLM's `LookupResult.HIT` and `LookupResult.MISS` (others mean pending or retry)."""
    from vllm.v1.kv_offload.base import LookupResult

    return LookupResult.HIT, LookupResult.MISS


def offload_request_context(tier_scheduler: Any, request_id: str) -> Any:
    """The tier's per-request context (None: not registered with the connector)."""
    # vLLM internal: OffloadingConnectorScheduler._req_status / RequestOffloadState.req_context
    status = tier_scheduler._req_status.get(request_id)
    return None if status is None else status.req_context


def offload_busy_requests(tier_scheduler: Any) -> set[str]:
    """Ids of requests with a transfer in flight (the connector defers them: `None` matched)."""
    # vLLM internal: OffloadingConnectorScheduler._jobs / TransferJobStatus.req_id
    return {job.req_id for job in tier_scheduler._jobs.values()}


def offload_chunks_being_loaded(tier_scheduler: Any) -> set[bytes] | None:
    """Offload keys with a load in flight (a request needing one is deferred); None: untracked."""
    # vLLM internal: OffloadingConnectorScheduler._chunks_being_loaded
    return tier_scheduler._chunks_being_loaded


def offload_key_suffix(group_idx: int) -> bytes:
    """What vLLM's offload key appends to a block hash for a KV group (`make_offload_key`,
    0.32: the group index in 4 big-endian bytes); checked against vLLM's own function."""
    from vllm.v1.kv_offload.base import make_offload_key

    suffix = group_idx.to_bytes(4, "big", signed=False)
    if make_offload_key(b"fairway-check", group_idx) != b"fairway-check" + suffix:
        raise FairwayError("vLLM's offload key encoding changed (make_offload_key)")
    return suffix



def offload_jobs(tier_scheduler: Any) -> Mapping[int, Any]:
    """The connector's transfer jobs in flight: job id -> its status (`offload_job_keys`)."""
    return tier_scheduler._jobs  # vLLM internal: OffloadingConnectorScheduler._jobs


def offload_job_counter(tier_scheduler: Any) -> int:
    """The id the connector gives its next job (ids are consecutive)."""
    # vLLM internal: OffloadingConnectorScheduler._job_counter
    return int(tier_scheduler._job_counter)


def offload_job_keys(job: Any) -> tuple[bool, Collection[bytes]]:
    """(whether the job is a store, the offload keys it covers)."""
    return bool(job.is_store), job.keys  # vLLM internal: TransferJobStatus.is_store / keys


def offload_used_chunks(manager: Any) -> int | None:
    """Chunks of the tier in use, stored or being stored (vLLM's CPU manager); None for other
    managers. A store allocates one per key; an eviction frees one."""
    # vLLM internal: CPUOffloadingManager._num_allocated_chunks / _free_list
    allocated = getattr(manager, "_num_allocated_chunks", None)
    free = getattr(manager, "_free_list", None)
    if not isinstance(allocated, int) or not isinstance(free, list):
        return None
    return allocated - len(free)


def offload_generation(manager: Any) -> int:
    """Changes when the tier is reset (vLLM's CPU manager; 0 for others)."""
    # vLLM internal: CPUOffloadingManager._cache_generation
    return int(getattr(manager, "_cache_generation", 0))


# --- vLLM 0.34's cache-aware admission window (policy `vllm-window`) -----------------------------


def kv_usage(scheduler: Scheduler) -> float:
    """The share of the KV cache's usable blocks in use, 1 - free / usable (cached blocks no
    request holds count as free): vLLM's `KVCacheManager.usage` (`BlockPool.get_usage`), a
    public property in 0.32 to 0.34, the value vLLM 0.34 compares with
    `cache_aware_admission_threshold`."""
    return float(kv_cache_manager(scheduler).usage)


def plain_waiting(requests: Iterable[Request]) -> list[bool]:
    """Whether each waiting request is a plain one, which vLLM 0.34's cache-aware window may move:
    status WAITING and no token computed (not preempted, not waiting for a grammar, remote KV
    blocks or more streamed input, not partly computed)."""
    from vllm.v1.request import RequestStatus

    waiting = RequestStatus.WAITING
    return [r.status == waiting and not r.num_computed_tokens for r in requests]
