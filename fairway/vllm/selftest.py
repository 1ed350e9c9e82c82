"""The start-up self-test: what each vLLM internal Fairway uses *means*, checked on the running
vLLM before a Fairway scheduler serves.

`internals.check_internals` finds names; a release can keep a name and change what it holds
(0.34 kept `BlockHashToBlockMap._cache` with block ids in it, 0.33 made
`grammar_compile_error_reqs` a dict). So a Fairway scheduler first builds a small scheduler of
vLLM's own, offline, from the same vLLM (`offline_vllm.make_vllm_scheduler`, no model, a fake KV
cache of a few blocks), drives a few steps through `internals` and compares each answer with
what vLLM itself then does. Each failed check is reported by the internal's name and what was
found, and the scheduler refuses to start. Runs once per process.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from fairway.vllm import internals

BLOCK = 16

#: One check: (the internals it exercises, the check). A check returns what it found when the
#: meaning differs, else None; an exception counts as a failure of the same names.
Check = tuple[str, Callable[[Any], "str | None"]]


@functools.cache
def problems() -> tuple[str, ...]:
    """`find_problems()`, once per process (what a Fairway scheduler checks at start-up), with
    vLLM's logging held at ERROR meanwhile: the offline schedulers' own start-up lines (CPU
    block-size advice, config notes) say nothing about the server being started."""
    vllm_logger = logging.getLogger("vllm")
    level = vllm_logger.level
    vllm_logger.setLevel(logging.ERROR)
    try:
        return find_problems()
    finally:
        vllm_logger.setLevel(level)


def find_problems() -> tuple[str, ...]:
    """`name: what was found` for each internal whose meaning differs on the running vLLM."""
    from fairway.vllm import offline_vllm  # vLLM's own scheduler: not Fairway's, which runs this

    found: list[str] = []
    for names, check in CHECKS:
        try:
            result = check(offline_vllm)
        except Exception as exc:  # noqa: BLE001 - every failure is a finding
            result = f"raised {type(exc).__name__}: {exc}"
        if result is not None:
            found.append(f"{names}: {result}")
    return tuple(found)


def _scheduler(offline: Any, **kwargs: Any) -> Any:
    """vLLM's own scheduler (not Fairway's), offline, with a small cache (`offline`: the module
    `fairway.vllm.offline_vllm`, as every check here gets it)."""
    kwargs.setdefault("num_blocks", 64)
    kwargs.setdefault("max_num_batched_tokens", 256)
    kwargs.setdefault("max_num_seqs", 4)
    return offline.make_vllm_scheduler(block_size=BLOCK, log_stats=False, **kwargs)


def _tokens(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def _step(offline: Any, sched: Any) -> tuple[Any, dict[int, Any]]:
    output = sched.schedule()
    result = sched.update_from_output(output, offline.fake_model_output(sched, output))
    return output, result


def _queue_order(offline: Any) -> str | None:
    """The waiting deque, reordered in place, is the order vLLM's scan admits in; a step's
    started requests are the ones that left the queue, never a running decode."""
    sched = _scheduler(offline, max_num_batched_tokens=64, max_num_seqs=2)
    for i, name in enumerate(("a", "b", "c")):
        sched.add_request(offline.make_request(name, _tokens(1_000 * (i + 1), 64), float(i),
                                               max_tokens=4))
    queue = internals.waiting_queue(sched)
    internals.reorder_queue(queue, [queue[1], queue[0], queue[2]])  # b a c
    internals.move_to_front(queue, [2])  # c b a
    output, _ = _step(offline, sched)
    started = list(internals.started_ids(output))
    if started != ["c"]:
        return f"queue c, b, a with room for one started {started}"
    output, _ = _step(offline, sched)  # c decodes, b starts
    started = list(internals.started_ids(output))
    if started != ["b"] or "c" not in internals.scheduled_tokens(output):
        return f"a step with c decoding and b admitted reported {started} as started"
    return None


def _resumed(offline: Any) -> str | None:
    """A preempted request that runs again is reported started once, in the step that resumes it
    (0.32/0.33: `resumed_req_ids`; 0.34: among the new requests)."""
    sched = _scheduler(offline, num_blocks=12, max_num_batched_tokens=128, max_num_seqs=4)
    for i in range(3):
        sched.add_request(offline.make_request(f"d{i}", _tokens(1_000 * i, 48), float(i),
                                               max_tokens=60))
    resumed = 0
    for _ in range(300):
        if not sched.has_requests():
            break
        waiting = {r.request_id for r in internals.waiting_queue(sched)}
        preempted = {r.request_id for r in internals.waiting_queue(sched)
                     if internals.times_preempted(r)}
        output, _ = _step(offline, sched)
        started = list(internals.started_ids(output))
        left = waiting - {r.request_id for r in internals.waiting_queue(sched)}
        if sorted(started) != sorted(left):
            return f"started {sorted(started)}, but {sorted(left)} left the waiting queue"
        resumed += len(preempted & set(started))
    return None if resumed else "no preempted request was ever reported started again"


def _prefix_hits(offline: Any) -> str | None:
    """A cached prefix: the coordinator's lookup and the hash map's entries (read as blocks)
    match what vLLM computes for the request; a reset of the prefix cache empties both."""
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    sched = _scheduler(offline)
    doc = _tokens(1, 4 * BLOCK)
    sched.add_request(offline.make_request("warm", doc, 0.0))
    _step(offline, sched)
    _step(offline, sched)
    manager = internals.kv_cache_manager(sched)
    request = offline.make_request("hit", doc[: 3 * BLOCK] + _tokens(90_000, 8), 1.0)
    _, hit = internals.longest_cache_hit(
        internals.coordinator_of(manager), request.block_hashes, request.num_tokens - 1
    )
    if hit != 3 * BLOCK:
        return f"find_longest_cache_hit gave {hit} tokens for a 3-block cached prefix"
    pool = internals.pool_of(manager)
    cache = internals.hash_map_dict(internals.block_hash_map(pool))
    read = internals.entry_block_reader(pool)
    suffix = internals.group_key_suffix()
    blocks = [read(cache.get(h + suffix)) for h in request.block_hashes[:3]]
    if not all(isinstance(b, KVCacheBlock) for b in blocks):
        return f"hash-map entries read as {[type(b).__name__ for b in blocks]}, not blocks"
    getter = internals.hash_map_getter(internals.block_hash_map(pool))
    if [getter(h + suffix) for h in request.block_hashes[:3]] != blocks:
        return "hash-map entries read as other blocks than get_one_block returns"
    protected = internals.evictable_blocks([b for b in blocks if b is not None])
    free_queue = internals.free_block_queue(sched)
    internals.move_to_mru_end(free_queue, reversed(protected))
    if not protected or not internals.ends_with(free_queue, protected):
        return f"{len(protected)} free cached blocks moved to the MRU end are not found there"
    if not manager.reset_prefix_cache():
        return "reset_prefix_cache() refused with no request running"
    left = internals.hash_map_dict(internals.block_hash_map(pool))
    if left:
        return f"the hash map holds {len(left)} keys after reset_prefix_cache()"
    return None


def _request_error(offline: Any) -> str | None:
    """A waiting request that can never fit, reported as an error, is finished with an error
    output at the next update, with the reason where the release carries one."""
    from vllm.v1.engine import FinishReason

    sched = _scheduler(offline, num_blocks=8)  # 7 usable blocks: "bad" can never fit
    sched.add_request(offline.make_request("ok", _tokens(5_000, 32), 0.0))
    sched.add_request(offline.make_request("bad", _tokens(1, 10 * BLOCK), 1.0))
    internals.report_request_error(sched, "bad", "fairway self-test")
    output = sched.schedule()
    result = sched.update_from_output(output, offline.fake_model_output(sched, output))
    errors = [o for outs in result.values() for o in outs.outputs
              if o.request_id == "bad" and o.finish_reason == FinishReason.ERROR]
    if len(errors) != 1 or "bad" in internals.requests_by_id(sched):
        return "the reported request was not finished with an error output"
    message = internals.error_message(errors[0])  # 0.33+: RequestError's; 0.32: None
    if message is not None and message != "fairway self-test":
        return f"the error output carries {message!r}"
    return None


def _reading_skips(offline: Any) -> str | None:
    """A request that skips the prefix cache neither looks it up nor loads external KV."""
    sched = _scheduler(offline)
    manager = internals.kv_cache_manager(sched)
    skip = offline.make_request("skip", _tokens(1, 40), 0.0, skip_reading_prefix_cache=True)
    plain = offline.make_request("plain", _tokens(1, 40), 0.0)
    answers = (
        internals.prefix_cache_lookup_enabled(manager, skip),
        internals.skips_external_kv(skip),
        internals.prefix_cache_lookup_enabled(manager, plain),
        internals.skips_external_kv(plain),
    )
    if answers != (False, True, True, False):
        return f"(lookup, skips external) read {answers[:2]} skipping, {answers[2:]} plain"
    return None


def _prefill_cap(offline: Any) -> str | None:
    """The step's long-prefill cap, set between steps, bounds what vLLM gives a long prompt;
    the budget and slot counts read what vLLM admits by."""
    sched = _scheduler(offline, max_num_batched_tokens=256, max_num_seqs=3)
    if internals.token_budget(sched) != 256 or internals.active_limit(sched) != 3:
        return (f"budget {internals.token_budget(sched)}, slots "
                f"{internals.active_limit(sched)} for 256 tokens and 3 sequences")
    internals.set_prefill_cap(sched, 32, False)
    sched.add_request(offline.make_request("long", _tokens(1, 200), 0.0))
    sched.add_request(offline.make_request("short", _tokens(5_000, 20), 1.0))
    output, _ = _step(offline, sched)
    scheduled = dict(internals.scheduled_tokens(output))
    if scheduled != {"long": 32, "short": 20}:
        return f"prompts of 200 and 20 tokens under a 32-token cap were given {scheduled}"
    if internals.prefill_cap(sched) != (32, False):
        return f"the cap reads {internals.prefill_cap(sched)} after setting (32, False)"
    views, _ = internals.running_prefills(sched)
    if [(v.request_id, v.remaining) for v in views] != [("long", 168)]:
        return f"the running prefill reads {[(v.request_id, v.remaining) for v in views]}"
    return None


#: Every check, by the internals it exercises.
CHECKS: tuple[Check, ...] = (
    ("Scheduler.waiting (order), SchedulerOutput.scheduled_new_reqs (started)", _queue_order),
    ("CachedRequestData.resumed_req_ids / resumed requests, Request.num_preemptions",
     _resumed),
    ("KVCacheCoordinator.find_longest_cache_hit, BlockHashToBlockMap._cache entries, "
     "FreeKVCacheBlockQueue, BlockPool.reset_prefix_cache", _prefix_hits),
    ("Scheduler.grammar_compile_error_reqs, EngineCoreOutput.error (request errors)",
     _request_error),
    ("Request.skip_reading_prefix_cache / skip_reading_external_kv", _reading_skips),
    ("SchedulerConfig.long_prefill_token_threshold, Scheduler.max_num_scheduled_tokens / "
     "max_num_active_reqs, Request.is_prefill_chunk", _prefill_cap),
)
