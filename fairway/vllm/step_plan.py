"""Applying a cross-step policy's `StepPlan` to one vLLM step, and taking it back afterwards.

vLLM's `schedule()` serves the RUNNING list first, in list order, then the waiting queue in
order; every request is capped by `scheduler_config.long_prefill_token_threshold` (re-read at
the start of every step; vLLM forces it to 0 when only one request exists) and by the budget left.
A plan is applied with exactly those knobs, for the duration of one `schedule()` call:

* the cap: the threshold is set to the plan's cap (and vLLM's adaptive floor,
  `long_prefill_token_threshold_adaptive`, is suspended: it would raise the cap), never below
  1 + `num_speculative_tokens` (the threshold caps decodes too: a lower one would cut drafts);
* the running order: the prefills named in `running_order` are served in that order, in the
  list positions that prefilling requests hold (decodes keep theirs);
* hold-back: the running prefills in `hold` leave the list for the step (and the request-slot
  limit `max_num_active_reqs` shrinks by as many, so vLLM cannot start more requests than it
  has slots for).

`PlanUndo.restore()` (called in `finally`) puts everything back: the configured threshold and
adaptive flag, the held requests, and the running list's own order (requests vLLM preempted in
the step stay out, requests it started stay appended). The engine never sees the temporary values
outside `schedule()`.

Every vLLM field read or set here goes through `fairway.vllm.internals` (the names a step plan
needs: `internals.STEP_PLAN_INTERNAL_NAMES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fairway.policies.queue import StepBudget, StepPlan
from fairway.vllm import internals

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request


def step_budget(
    scheduler: Scheduler, decode_tokens: int, ahead: list[Request], ahead_work: list[int]
) -> StepBudget:
    """The token budget minus decode tokens, the free request slots and KV blocks, and the
    requests served first (`ahead`, with their uncached work)."""
    return StepBudget(
        tokens=max(0, internals.token_budget(scheduler) - decode_tokens),
        free_slots=internals.free_slots(scheduler),
        ahead=tuple(ahead_work),
        ahead_ids=tuple([r.request_id for r in ahead]),
        free_blocks=internals.free_blocks(scheduler),
        block_size=internals.block_size_of(internals.kv_cache_manager(scheduler)),
    )


@dataclass(slots=True)
class PlanUndo:
    """What `apply()` changed, to put back after `schedule()`."""

    scheduler: Any
    threshold: int
    adaptive: bool
    active: int
    #: The running list as it was (its own order, to put back).
    running: list[Request]
    held: list[Request] = field(default_factory=list)
    reordered: bool = False

    def restore(self) -> None:
        """Configured threshold, adaptive flag, slot limit, held requests and running order."""
        sched = self.scheduler
        internals.set_prefill_cap(sched, self.threshold, self.adaptive)
        internals.set_active_limit(sched, self.active)
        if not self.held and not self.reordered:
            return
        now = internals.running_requests(sched)
        alive = {id(r) for r in now}
        alive.update(id(r) for r in self.held)
        before = {id(r) for r in self.running}
        kept = [r for r in self.running if id(r) in alive]
        kept += [r for r in now if id(r) not in before]
        now[:] = kept


def apply(scheduler: Scheduler, plan: StepPlan) -> PlanUndo | None:
    """Set the step's cap, running order and hold-back; return how to undo it (None: a plan
    without a cap changes nothing)."""
    if plan.cap is None:
        return None
    threshold, adaptive = internals.prefill_cap(scheduler)
    active, running = internals.active_limit(scheduler), internals.running_requests(scheduler)
    undo = PlanUndo(scheduler, threshold, adaptive, active, list(running))
    try:
        # Never below one decode's tokens: vLLM caps every running request at the threshold,
        # decodes too, and a decode with speculative drafts schedules 1 + num_speculative_tokens
        # (`num_tokens_with_spec`), so a lower cap would cut its drafts; vLLM also asserts that a
        # waiting request it pads to 1 + k draft rows keeps all of them after the threshold.
        # Without speculative decoding the floor is 1, which no plan's cap is below.
        cap = max(plan.cap, internals.decode_tokens_per_step(scheduler))
        internals.set_prefill_cap(scheduler, cap, False)
        if len(plan.running_order) > 1:
            undo.reordered = _reorder_running(running, plan.running_order)
        if plan.hold:
            undo.held = [r for r in running if r.request_id in plan.hold]
            running[:] = [r for r in running if r.request_id not in plan.hold]
            internals.set_active_limit(scheduler, undo.active - len(undo.held))
    except BaseException:
        undo.restore()
        raise
    return undo


def _reorder_running(running: list[Request], order: tuple[str, ...]) -> bool:
    """Serve the prefills named in `order` in that order, in the prefills' own list positions
    (the ones not named keep their relative order after them)."""
    slots = [k for k, r in enumerate(running) if internals.is_prefill_chunk(r)]
    rank = {rid: k for k, rid in enumerate(order)}
    prefills = [running[k] for k in slots]
    new = sorted(prefills, key=lambda r: rank.get(r.request_id, len(rank)))  # stable
    if new == prefills:
        return False
    for k, request in zip(slots, new, strict=True):
        running[k] = request
    return True
