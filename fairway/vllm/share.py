"""Applying a cross-step policy's `StepShare` to one vLLM step, and taking it back afterwards.

vLLM's `schedule()` serves the RUNNING list first, in list order, then the waiting queue in
order; every request is capped by `scheduler_config.long_prefill_token_threshold` (re-read at
the start of every step; vLLM forces it to 0 when only one request exists) and by the budget left.
A share is applied with exactly those knobs, for the duration of one `schedule()` call:

* the cap: the threshold is set to the share's cap (and vLLM's adaptive floor,
  `long_prefill_token_threshold_adaptive`, is suspended: it would raise the cap);
* the running order: the prefills named in `running_order` are served in that order, in the
  list positions that prefilling requests hold (decodes keep theirs);
* hold-back: the running prefills in `hold` leave the list for the step (and the request-slot
  limit `max_num_active_reqs` shrinks by as many, so vLLM cannot start more requests than it
  has slots for).

`ShareUndo.restore()` (called in `finally`) puts everything back: the configured threshold and
adaptive flag, the held requests, and the running list's own order (requests vLLM preempted in
the step stay out, requests it started stay appended). The engine never sees the temporary values
outside `schedule()`.

Every access to a vLLM internal is tagged `# vLLM internal:` (see `INTERNAL_NAMES`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fairway.policies.queue import PrefillingRequest, StepBudget, StepPlan
from fairway.vllm import probe

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request

INTERNAL_NAMES: tuple[str, ...] = (
    "Scheduler.running",
    "Scheduler.max_num_scheduled_tokens",
    "Scheduler.max_num_active_reqs",
    "Scheduler.adaptive_long_prefill_threshold",
    "SchedulerConfig.long_prefill_token_threshold",
    "SchedulerConfig.enable_chunked_prefill",
    "Request.is_prefill_chunk",
    "Request.num_computed_tokens",
    "Request.num_tokens_with_spec",
    "Request.num_output_placeholders",
)


def check_internals(scheduler: Scheduler) -> list[str]:
    """Names from `INTERNAL_NAMES` missing on this live scheduler (requests checked by class)."""
    from vllm.v1.request import Request

    objects = {"Scheduler": scheduler, "SchedulerConfig": scheduler.scheduler_config}
    init_names = set(Request.__init__.__code__.co_names) | set(dir(Request))
    missing = []
    for name in INTERNAL_NAMES:
        owner, attr = name.split(".")
        if owner == "Request":
            if attr not in init_names:
                missing.append(name)
        elif not hasattr(objects[owner], attr):
            missing.append(name)
    return missing


def chunked_prefill(scheduler: Scheduler) -> bool:
    """The share needs chunked prefill (a capped request continues in the next step)."""
    return bool(scheduler.scheduler_config.enable_chunked_prefill)  # vLLM internal


def running_prefills(scheduler: Scheduler) -> tuple[list[PrefillingRequest], int]:
    """Views of the running requests still in prefill, and the tokens the other running ones
    (decodes) may take this step (one per request, more with placeholders or spec tokens)."""
    views: list[PrefillingRequest] = []
    decode_tokens = 0
    view = PrefillingRequest
    for request in scheduler.running:  # vLLM internal: Scheduler.running
        # vLLM internal: Request.num_tokens / num_computed_tokens / is_prefill_chunk (as
        # `_in_prefill`, inlined: this runs for every running request every step)
        num_tokens, computed = request.num_tokens, request.num_computed_tokens
        if request.is_prefill_chunk and num_tokens > computed:
            views.append(
                view(request.request_id, request.arrival_time, num_tokens - computed, num_tokens)
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
    # vLLM internal: Request.is_prefill_chunk / num_computed_tokens / num_tokens
    return request.is_prefill_chunk and request.num_tokens > request.num_computed_tokens


def step_budget(
    scheduler: Scheduler,
    decode_tokens: int,
    ahead: list[tuple[str, int]],
    free: int | None = None,
) -> StepBudget:
    """The token budget minus decode tokens, free request slots (`free`, if the caller has
    `probe.free_slots`) and the requests served first."""
    tokens = scheduler.max_num_scheduled_tokens - decode_tokens  # vLLM internal
    return StepBudget(
        tokens=max(0, tokens),
        free_slots=probe.free_slots(scheduler) if free is None else free,
        ahead=tuple([n for _, n in ahead]) if ahead else (),
        ahead_ids=tuple([i for i, _ in ahead]) if ahead else (),
    )


@dataclass(slots=True)
class ShareUndo:
    """What `apply()` changed, to put back after `schedule()`."""

    scheduler: Any
    threshold: int
    adaptive: bool
    active: int
    running: list[Request] = field(default_factory=list)
    held: list[Request] = field(default_factory=list)
    reordered: bool = False
    restored: bool = False

    def restore(self) -> None:
        """Configured threshold, adaptive flag, slot limit, held requests and running order."""
        if self.restored:
            return
        self.restored = True
        sched = self.scheduler
        sched.scheduler_config.long_prefill_token_threshold = self.threshold  # vLLM internal
        sched.adaptive_long_prefill_threshold = self.adaptive  # vLLM internal
        sched.max_num_active_reqs = self.active  # vLLM internal
        if not self.held and not self.reordered:
            return
        now = sched.running  # vLLM internal: Scheduler.running (a list)
        alive = {id(r) for r in now}
        alive.update(id(r) for r in self.held)
        before = {id(r) for r in self.running}
        kept = [r for r in self.running if id(r) in alive]
        kept += [r for r in now if id(r) not in before]
        now[:] = kept


def apply(scheduler: Scheduler, share: StepPlan) -> ShareUndo:
    """Set the step's cap, running order and hold-back; return how to undo it."""
    config = scheduler.scheduler_config  # vLLM internal: Scheduler.scheduler_config
    undo = ShareUndo(
        scheduler,
        threshold=config.long_prefill_token_threshold,  # vLLM internal
        adaptive=scheduler.adaptive_long_prefill_threshold,  # vLLM internal
        active=scheduler.max_num_active_reqs,  # vLLM internal
    )
    if share.cap is None:
        return undo
    running = scheduler.running  # vLLM internal: Scheduler.running
    reorder = len(share.running_order) > 1
    if reorder or share.hold:  # the list's own order, to put back
        undo.running = list(running)
    try:
        config.long_prefill_token_threshold = share.cap
        scheduler.adaptive_long_prefill_threshold = False
        if reorder:
            undo.reordered = _reorder_running(running, share.running_order)
        if share.hold:
            undo.held = [r for r in running if r.request_id in share.hold]
            running[:] = [r for r in running if r.request_id not in share.hold]
            scheduler.max_num_active_reqs = undo.active - len(undo.held)
    except BaseException:
        undo.restore()
        raise
    return undo


def _reorder_running(running: list[Request], order: tuple[str, ...]) -> bool:
    """Serve the prefills named in `order` in that order, in the prefills' own list positions
    (the ones not named keep their relative order after them)."""
    slots = [k for k, r in enumerate(running) if r.is_prefill_chunk]  # vLLM internal
    rank = {rid: k for k, rid in enumerate(order)}
    prefills = [running[k] for k in slots]
    new = sorted(prefills, key=lambda r: rank.get(r.request_id, len(rank)))  # stable
    if new == prefills:
        return False
    for k, request in zip(slots, new, strict=True):
        running[k] = request
    return True


def prefill_by_request(scheduler: Scheduler, output: SchedulerOutput) -> dict[str, int]:
    """Prompt tokens scheduled per request in `output` (read right after `schedule()`)."""
    requests: Mapping[str, Request] = scheduler.requests  # vLLM internal: Scheduler.requests
    result: dict[str, int] = {}
    for request_id, n in output.num_scheduled_tokens.items():  # vLLM internal
        request = requests.get(request_id)
        if request is None:
            continue
        # vLLM internal: Request.num_computed_tokens (already advanced by n) / num_prompt_tokens
        start = request.num_computed_tokens - n
        prompt = max(request.num_prompt_tokens, request.num_tokens - 1)
        if start < prompt:
            result[request_id] = min(n, prompt - start)
    return result
