"""The scheduler's waiting queue, its requests and the slots its admission stops at.

Why: Fairway reorders vLLM's waiting deque in place before each step and bounds the part of it
vLLM's scan can reach; both read the scheduler's own fields. Checked on vLLM 0.32, 0.33 and 0.34
(`make matrix` runs the tests below on each); a reading that differs by release names them.

Tests: the queue's order, `requests_by_id` and `times_preempted`,
`tests/integration/test_selftest.py` (`_queue_order`, `_request_error`, `_resumed`) and
`tests/unit/test_queue_table.py`; the scan's bound, `tests/integration/test_head_order.py`; the
priority heap swapped for the deque, `tests/integration/test_compat_priority.py`; tenants,
`tests/integration/test_tenant_metrics.py`; the trust gate's `request_extra_args` and
`set_request_priority`, `tests/integration/test_trust_gate.py`; vLLM 0.34's window,
`tests/integration/test_vllm_window.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from fairway.errors import FairwayError
from fairway.tenants import TENANT_KEY

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request


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
    `queue_table.MAX_IN_PLACE` for what a touch costs on a big queue).
    """
    moved = {}
    at = 0  # queue[0] is the request at position `at` of the original order
    for position in sorted(positions):
        queue.rotate(at - position)  # vLLM internal: FCFSRequestQueue is a deque
        moved[position] = queue.popleft()
        at = position + 1
    queue.rotate(at - len(queue) - len(moved))  # the first original request back in front
    queue.extendleft(moved[p] for p in reversed(positions))


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


def requests_by_id(scheduler: Scheduler) -> Mapping[str, Request]:
    """The scheduler's live requests by id (waiting and running).

    Why: a step's output and vLLM's hooks name requests by id only; the memo, the metrics and
    the replay need the `Request` behind an id (and whether vLLM still holds it). Read only:
    vLLM alone adds and removes. Checked on 0.32, 0.33, 0.34 (a dict there).
    """
    return scheduler.requests  # vLLM internal: Scheduler.requests


def vllm_config(scheduler: Any) -> VllmConfig:
    """The engine's configuration (its fields are vLLM's public options)."""
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


def request_extra_args(request: Request) -> dict[str, Any] | None:
    """The request's `SamplingParams.extra_args` (the body's `vllm_xargs`), the dict itself, or
    None (no sampling parameters or no extra arguments). The trust gate edits it in place before
    vLLM queues the request (`fairway.vllm.identity`)."""
    params = request.sampling_params  # None for a pooling request
    extra = params.extra_args if params is not None else None
    return extra if isinstance(extra, dict) else None


def set_request_priority(request: Request, priority: int) -> None:
    """Serve a request at another priority: the trust gate raises a priority below the floor,
    in `add_request` before vLLM queues it. vLLM reads `Request.priority` (a field of the
    request as the engine core builds it) only after that: in the priority heap's order (which
    Fairway replaces by its own, reading the same field) and when it picks whom to preempt."""
    request.priority = priority


def times_preempted(request: Request) -> int:
    """How often vLLM preempted the request (0: never).

    Why: a preempted request that starts again is not a first admission, so its queue time is
    not observed twice (`observe`); the self-test finds the preempted ones in the queue by it.
    Checked on 0.32, 0.33, 0.34 (a counter `Request.__init__` sets to 0).
    """
    return int(request.num_preemptions)  # vLLM internal: Request.num_preemptions


def priority_scheduling(scheduler: Scheduler) -> bool:
    """Whether the engine runs `--scheduling-policy priority`."""
    config = scheduler.scheduler_config  # vLLM internal: Scheduler.scheduler_config
    return str(config.policy) == "priority"


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


def deferred_count(scheduler: Scheduler) -> int:
    """How many waiting requests vLLM skipped (blocked status etc.); bounds the admission scan."""
    return len(scheduler.deferred_waiting)  # vLLM internal: Scheduler.deferred_waiting


# --- vLLM 0.34's cache-aware admission window (policy `vllm-window`) -----------------------------


def cache_aware_admission_window(vllm_config: VllmConfig) -> int:
    """vLLM's `--cache-aware-admission-window` (0.34; 0: off, as in releases without it)."""
    from vllm.config import SchedulerConfig

    if "cache_aware_admission_window" not in SchedulerConfig.__dataclass_fields__:
        return 0  # 0.32, 0.33: no such option
    # vLLM internal: SchedulerConfig.cache_aware_admission_window (0.34; no default: declared)
    return int(getattr(vllm_config.scheduler_config, "cache_aware_admission_window"))  # noqa: B009


def plain_waiting(requests: Iterable[Request]) -> list[bool]:
    """Whether each waiting request is a plain one, which vLLM 0.34's cache-aware window may move:
    status WAITING and no token computed (not preempted, not waiting for a grammar, remote KV
    blocks or more streamed input, not partly computed)."""
    from vllm.v1.request import RequestStatus

    waiting = RequestStatus.WAITING
    return [r.status == waiting and not r.num_computed_tokens for r in requests]
