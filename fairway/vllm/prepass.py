"""The per-step pre-pass of a Fairway scheduler: order the waiting queue, plan the step, book it.

`FairwaySchedulerMixin` (fairway.vllm.scheduler) keeps only vLLM's hooks it overrides
(`add_request`, `schedule`, `update_from_output`); everything it does around vLLM's own step lives
in one `StepPrepass` object it owns: the policy, the queue mirror, the step's plan, the stats. Every
method that runs inside the engine's step catches what goes wrong, counts it and keeps vLLM's own
behaviour for that step: the ordering can never stop the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from vllm.logger import init_logger
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request

from fairway.errors import FairwayError
from fairway.options import FairwayOptions
from fairway.policies import Policy
from fairway.policies.lanes import FAIR
from fairway.policies.queue import (
    UNPLACED_LANE,
    Ordering,
    PrefillingRequest,
    QueueColumns,
    Step,
    StepBudget,
    StepPlan,
    check_order,
)
from fairway.vllm import internals, protect, step_plan
from fairway.vllm.metrics import FairwayMetrics, FairwayStats, TenantLabels
from fairway.vllm.queue_mirror import QueueMirror

if TYPE_CHECKING:
    from vllm.v1.core.sched.request_queue import RequestQueue
    from vllm.v1.core.sched.scheduler import Scheduler

logger = init_logger(__name__)


@dataclass(slots=True)
class OrderedStep:
    """What the pre-pass did to the waiting queue this step (None: it left the queue as it was),
    for the after-step bookkeeping and the observer."""

    queue: list[Request]  # the new order of the waiting queue
    num_fixed: int  # preempted requests kept at the front
    num_ordered: int  # requests the policy ordered, right after the fixed ones
    lanes: Sequence[str] | None  # lane per ordered position (Fairway), None: one lane
    #: Positions (in the queue as it was) of the requests moved to its front, in their new
    #: order, when that is the whole change (written in place: `internals.move_to_front`);
    #: None: `queue` replaces the deque's contents, or is the queue as it was.
    front: list[int] | None = None
    #: Lane of each request admitted from the ordered positions (set after the step).
    admitted_lanes: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class LastOrder:
    """The policy's input and output at the last ordered step (views built only when read)."""

    columns: QueueColumns | None = None
    order: np.ndarray | None = None
    #: The policy's answer (lanes, plan) at that step.
    ordering: Ordering | None = None


class PolicyOrderError(FairwayError):
    """The policy's `ordering()` did not return a permutation of the queue's indices."""


class StepPrepass:
    """Fairway's state and work around each vLLM step, for one scheduler.

    Attributes (read by the scheduler's public properties, tests, the replay and benchmarks):
        options / policy: the resolved `FairwayOptions` and the policy object (it may keep
            state across steps).
        mirror: the `QueueMirror`, Fairway's copy of the waiting queue with each request's
            cached prefix (numpy columns, the incremental prefix memo, the tier probe).
        stats / totals: `FairwayStats` of the step in progress and since construction.
        metrics: the Prometheus series (None when the engine logs no stats).
        applies_plans: whether the policy's step plans are applied (`plans_steps` and chunked
            prefill).
        head_only: tell the policy how far vLLM's scan reaches (tests set it False to compare
            with the full order).
        step_plan / last_plan: the plan of the step in progress / of the last planned step
            (None after an idle step).
        last: the policy's input and output at the last ordered step (empty while a step is
            being ordered, and after one whose ordering failed).
        tenant_labels: request -> tenant label, cached per request id (None: no tenants
            configured, and no per-tenant counting at all).
        exports_work: measure `queued_uncached_tokens` at the end of every step (on with the
            metrics, for `fairway:queued_uncached_tokens`; a replay may switch it on).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        options: FairwayOptions,
        policy: Policy,
        mirror: QueueMirror,
        metrics: FairwayMetrics | None,
        applies_plans: bool,
        top_k: int,
        clock: Callable[[], float],
    ) -> None:
        self.scheduler = scheduler
        #: `() -> seconds`, the `now` given to the policy (the scheduler's `fairway_clock`).
        self.clock = clock
        self.options = options
        self.policy = policy
        self.mirror = mirror
        mirror.table.read_plain = type(policy).reads_plain
        self.metrics = metrics
        self.applies_plans = applies_plans
        self.top_k = top_k
        self.head_only = True
        self.stats = FairwayStats()
        self.totals = FairwayStats()
        self.rejected: set[str] = set()
        #: Request id -> why `reject` finished it, until its error output carries it.
        self.error_reasons: dict[str, str] = {}
        self.failed_types: set[type] = set()
        self.last = LastOrder()
        #: Whether the waiting queue held a request at the start of the step in progress.
        self.had_waiting = False
        #: Steps whose ordering was skipped because no request slot was free.
        self.steps_skipped = 0
        self.step_plan: StepPlan | None = None
        self.last_plan: StepPlan | None = None
        #: Weight by tenant code (`Step.tenant_weights`).
        self.tenant_weights = options.tenant_table.code_weights
        tenants = options.tenant_table
        if mirror.tier is not None and metrics is not None:
            metrics.enable_tier()
        self.exports_work = metrics is not None
        self.tenant_labels: TenantLabels | None = None
        if tenants.enabled:
            self.tenant_labels = TenantLabels(tenants, internals.request_tenant)
            if metrics is not None:
                metrics.enable_tenants(tenants)

    # --- before the step --------------------------------------------------------------------------

    def reorder(self) -> OrderedStep | None:
        """Re-sort vLLM's waiting queue; on any failure leave it as it is. Never raises.

        When no request slot is free, vLLM's step cannot admit anyone, so the order cannot matter:
        the queue keeps its last order and only the mirror advances (new arrivals within its
        budget, changed hits). For a policy that plans steps only when no running request is
        in prefill either (its plan also caps the running prefills): nothing is contested, and
        the policy is told so (`step_without_prefill`).
        """
        queue = internals.waiting_queue(self.scheduler)
        self.had_waiting = bool(queue)
        try:
            if not queue or not internals.can_admit(self.scheduler):
                contested = bool(queue) and self.applies_plans
                contested = contested and internals.has_running_prefill(self.scheduler)
                # a policy whose order persists is asked all the same (`orders_every_step`)
                if not contested and not (queue and type(self.policy).orders_every_step):
                    if queue and self.applies_plans:
                        self.policy.step_without_prefill()
                        self.last_plan = None
                    self.skip(queue)
                    return None
            current = list(queue)
            self.last = LastOrder()
            ordered = self.order_queue(current)
            if ordered.front is not None:
                internals.move_to_front(queue, ordered.front)
            elif ordered.queue is not current:
                internals.reorder_queue(queue, ordered.queue)
        except Exception as exc:  # noqa: BLE001 - the engine must survive any policy bug
            self.fallback(exc)
            return None
        if self.options.protect_enabled:
            self.protect_blocks(ordered.queue)
        return ordered

    def skip(self, queue: RequestQueue) -> None:
        """A step without ordering: the mirror advances (new arrivals within its budget, changed
        hits); memos of requests that left without being admitted are dropped."""
        mirror = self.mirror
        # many left unadmitted (aborts): drop them; any, when the queue's work is exported
        if len(mirror) > (len(queue) if self.exports_work else 2 * len(queue) + 64):
            mirror.snapshot(list(queue))
        if queue:
            mirror.advance()
            self.steps_skipped += 1
            oldest = mirror.oldest_arrival()
            self.stats.oldest_waiting_age_s = max(0.0, self.clock() - oldest)

    def order_queue(self, current: list[Request]) -> OrderedStep:
        """The new queue order (a permutation of `current`), or an exception."""
        snap = self.mirror.snapshot(current)
        cols = snap.columns
        n = len(cols)
        ordering = self.ask_policy(cols, snap.fixed)
        try:
            order, moved = check_order(ordering.order, n)
        except ValueError as exc:
            raise PolicyOrderError(
                f"policy {self.options.policy!r} did not return a permutation of "
                f"range({n}): {exc}"
            ) from None
        queue, front = self.mirror.table.arrange(snap, order, moved)
        for request in snap.oversized:
            self.reject(request)
        lanes = ordering.lanes
        if lanes is not None and len(lanes) != n:
            lanes = None
        self.last = LastOrder(cols, order, ordering)
        stats = self.stats
        stats.steps_ordered += 1
        tier = self.mirror.tier
        if tier is not None:
            stats.tier_waiting_tokens, stats.tier_deferred = tier.last_tokens, tier.last_deferred
        if n:
            work = cols.remaining
            stats.queue_work_max_tokens = int(work.max())
            stats.queue_work_min_tokens = int(work.min())
            oldest = cols.arrival.item(cols.oldest_row)
            stats.oldest_waiting_age_s = max(0.0, self.clock() - oldest)
        return OrderedStep(queue, len(snap.fixed), n, lanes, front)

    # --- the policy's one call, and the step plan (policies with `plans_steps`) ----------------

    def ask_policy(self, waiting: QueueColumns, ahead: list[Request]) -> Ordering:
        """Ask the policy for this step's order (and plan); raises like the policy may.

        The one call of the policy: `Step` says how far vLLM's scan reaches and, for a policy
        that plans steps, the step's budget and running prefills. A policy that does not plan
        steps is not asked when nothing is orderable."""
        sched, mirror = self.scheduler, self.mirror
        budget: StepBudget | None = None
        prefilling: Sequence[PrefillingRequest] = ()
        if self.applies_plans:
            prefilling, decode_tokens = internals.running_prefills(sched, mirror.table.classify)
            work = [r.num_tokens - mirror.cached_tokens(r) for r in ahead]
            budget = step_plan.step_budget(sched, decode_tokens, ahead, work)
        elif not len(waiting):
            return Ordering([])
        step = Step(
            self.clock(), internals.scan_bound(sched) if self.head_only else None, budget,
            prefilling, self.tenant_weights, internals.kv_usage(sched), len(ahead),
        )
        ordering = by_level(self.policy.ordering(waiting, step), waiting)
        if self.applies_plans:
            self.step_plan = self.last_plan = ordering.plan
        return ordering

    def apply_plan(self, ordered: OrderedStep | None) -> step_plan.PlanUndo | None:
        """Apply the step's plan to vLLM's knobs for this `schedule()` call. Never raises.

        With an empty waiting queue the plan is made here (running prefills only).
        """
        if not self.applies_plans:
            return None
        try:
            if ordered is None and not internals.waiting_queue(self.scheduler):
                self.ask_policy(QueueColumns.of([]), [])
            if self.step_plan is None:
                return None
            return step_plan.apply(self.scheduler, self.step_plan)
        except Exception as exc:  # noqa: BLE001
            self.step_plan = None
            self.fallback(exc, "applying the step plan", "vLLM's split is kept")
            return None

    def book_tenants(
        self, labels: TenantLabels, output: SchedulerOutput, by_request: dict[str, int] | None
    ) -> None:
        """Count the step's prefill tokens per tenant label and, with the metrics on, the waiting
        requests per label (tenants configured only). Never raises."""
        try:
            requests = internals.requests_by_id(self.scheduler)
            if by_request is None:
                by_request = internals.prefill_by_request(self.scheduler, output)
            tokens = self.stats.tenant_prefill_tokens
            of = labels.of
            for request_id, n in by_request.items():
                request = requests.get(request_id)
                if request is not None and n:
                    label = of(request)
                    tokens[label] = tokens.get(label, 0) + n
            if self.metrics is not None:
                self.stats.tenant_waiting = labels.count(internals.waiting_queue(self.scheduler))
            labels.prune(requests, len(requests))
        except Exception as exc:  # noqa: BLE001
            self.fallback(exc, "counting tokens and waiting requests per tenant",
                          "the tenant series miss this step")

    def queued_uncached_tokens(self) -> int:
        """Prompt tokens the node's requests still have to compute after their prefix hits: the
        waiting ones' beyond the cached prefix the mirror last looked up (`QueueMirror.
        uncached_tokens`, numpy over its columns) plus the running ones' chunked-prefill rest.
        The load a prefix-aware router cannot see (`fairway:queued_uncached_tokens`)."""
        sched = self.scheduler
        waiting = self.mirror.uncached_tokens() if internals.waiting_queue(sched) else 0
        return waiting + internals.prompt_tokens_left(sched)

    def reject(self, request: Request) -> None:
        """Finish a request that can never fit (once); it already sits behind everyone."""
        request_id, _, num_tokens = internals.request_fields(request)
        if request_id in self.rejected:
            return
        self.rejected.add(request_id)
        self.stats.oversized_rejected += 1
        block_size, usable = self.mirror.block_size, internals.usable_blocks(self.scheduler)
        protect.log_oversized(request_id, num_tokens, block_size, usable)
        reason = (
            f"Fairway: the request needs {protect.blocks_needed(num_tokens, block_size)} KV "
            f"blocks ({num_tokens} tokens, block size {block_size}) but the KV cache has only "
            f"{usable} usable blocks, so it can never be scheduled. Send a shorter prompt, "
            "or raise the server's KV cache size."
        )
        internals.report_request_error(self.scheduler, request_id, reason)
        self.error_reasons[request_id] = reason  # the error output's `stop_reason`, too

    def explain_errors(self, result: object) -> None:
        """Give the error outputs of requests `reject` finished their reason (`stop_reason`,
        see `internals.explain_errors`). Never raises."""
        if not self.error_reasons:
            return
        try:
            internals.explain_errors(result, self.error_reasons)
        except Exception as exc:  # noqa: BLE001
            self.error_reasons.clear()
            self.fallback(exc, "explaining a rejected request's error", "its error has no text")

    def protect_blocks(self, queue: list[Request]) -> None:
        """Soft eviction protection of the first K requests' cached blocks (`fairway.vllm.
        protect`): only the blocks this step can evict are walked, where the memo indexes hit
        ends; else every protected hit is moved. Never raises."""
        try:
            mirror, sched = self.mirror, self.scheduler
            free_queue = internals.free_block_queue(sched)
            if not mirror.indexes_hit_ends:
                chains = (mirror.hit_blocks(r) for r in queue[: self.top_k])
                self.stats.protected_blocks += protect.protect_hit_blocks(free_queue, chains)
                return
            first = {id(r) for r in queue[: self.top_k]}
            block_size = internals.block_size_of(internals.kv_cache_manager(sched))
            at_risk = (protect.blocks_needed(internals.token_budget(sched), block_size)
                       + internals.free_slots(sched) + len(internals.running_requests(sched)))
            self.stats.protected_blocks += protect.protect_at_risk(
                free_queue, at_risk,
                lambda block: mirror.protected_hit_at(block, lambda r: id(r) in first),
            )
        except Exception as exc:  # noqa: BLE001
            self.fallback(exc, "protecting cached blocks", "no protection this step")

    def fallback(
        self,
        exc: Exception,
        what: str = "ordering the waiting queue",
        outcome: str = "vLLM's order is kept for this step",
    ) -> None:
        """Count the failure; log it once per exception type (no request ids in the args)."""
        self.stats.policy_fallbacks += 1
        kind = type(exc)
        if kind in self.failed_types:
            return
        self.failed_types.add(kind)
        logger.warning(
            "Fairway: %s failed while %s (policy %s); %s and the engine keeps serving. Counted "
            "in fairway:policy_fallbacks_total; this message is logged once per exception type.",
            kind.__name__,
            what,
            self.options.policy,
            outcome,
            exc_info=exc,
        )

    # --- after the step ---------------------------------------------------------------------------

    def after_step(
        self, output: SchedulerOutput, ordered: OrderedStep | None, prepass_s: float
    ) -> None:
        """Tell the policy what was admitted; forget who left; publish stats. Never raises."""
        stats = self.stats
        by_request: dict[str, int] | None = None
        try:
            started = internals.started_ids(output)
            if started:  # they left the waiting queue
                requests = internals.requests_by_id(self.scheduler)
                leaving = [requests[rid] for rid in started if rid in requests]
                if self.mirror.tier is not None:
                    stats.tier_admitted_tokens += self.mirror.tier_tokens_of(leaving)
                self.mirror.forget(leaving)
            if self.had_waiting:
                stats.prepass_s.append(prepass_s)
            elif ordered is None:
                stats.oldest_waiting_age_s = 0.0  # nothing waited at the start of the step
            admitted = self.admitted(output, ordered) if ordered is not None else []
            plan = self.step_plan
            if plan is not None:  # the policy books its ledgers; the tokens are counted by lane
                by_request = internals.prefill_by_request(self.scheduler, output)
                total = sum(by_request.values())
                self.policy.on_step_end(admitted, total, prefill_by_request=by_request)
                fair = sum(n for rid, n in by_request.items() if plan.lanes.get(rid) == FAIR)
                stats.lane_prefill_tokens["fair"] += fair
                stats.lane_prefill_tokens["fast"] += total - fair
            elif ordered is not None:
                prefill = internals.prefill_tokens(self.scheduler, output)
                self.policy.on_step_end(admitted, prefill)
            if self.error_reasons or len(self.rejected) > 64:
                self.trim()
        except Exception as exc:  # noqa: BLE001
            self.fallback(exc, "finishing the step", "the step's output is unchanged")
        if self.exports_work:
            try:
                stats.queued_uncached_tokens = self.queued_uncached_tokens()
            except Exception as exc:  # noqa: BLE001
                self.fallback(exc, "measuring the queued work", "its gauge misses this step")
        labels = self.tenant_labels
        if labels is not None:
            self.book_tenants(labels, output, by_request)
        if self.metrics is not None or self.had_waiting or labels is not None or self.exports_work:
            if self.metrics is not None:
                self.metrics.record(stats)
            self.totals.add(stats)
            stats.reset()

    def admitted(self, output: SchedulerOutput, ordered: OrderedStep) -> list[str]:
        """Ids of the requests admitted from our order, in admission order; counts them by lane.

        vLLM pops admitted requests from the front and puts skipped ones back there, so the
        admitted ones lie within the first (scheduled + skipped) positions of our order. One
        admitted past an exact head (vLLM skipped more than `internals.scan_bound` foresaw) was
        placed by no lane and is not counted.
        """
        scheduled = internals.scheduled_tokens(output)
        if not scheduled:
            return []
        limit = len(scheduled) + internals.deferred_count(self.scheduler)
        admitted: list[str] = []
        placed_counts = self.stats.placed
        admitted_lanes = ordered.admitted_lanes
        for k, request in enumerate(ordered.queue[:limit]):
            request_id = request.request_id
            if request_id not in scheduled:
                continue
            admitted.append(request_id)
            ordered_pos = k - ordered.num_fixed
            if 0 <= ordered_pos < ordered.num_ordered:  # not preempted-first, not oversized
                lane = ordered.lanes[ordered_pos] if ordered.lanes is not None else "single"
                admitted_lanes[request_id] = lane
                if lane != UNPLACED_LANE:  # past the ordered head: no lane placed it
                    placed_counts[lane] = placed_counts.get(lane, 0) + 1
        return admitted

    def trim(self) -> None:
        """Forget the error reasons (a request aborted before vLLM finished it gets no error
        output) and, past 64, the rejected ids of requests that are gone (the mirror drops its
        own entries)."""
        requests = internals.requests_by_id(self.scheduler)
        self.error_reasons = {r: why for r, why in self.error_reasons.items() if r in requests}
        if len(self.rejected) > 64:
            self.rejected = {rid for rid in self.rejected if rid in requests}




def by_level(ordering: Ordering, waiting: QueueColumns) -> Ordering:
    """The policy's order with vLLM's priority levels first (lower first), each level in the
    policy's order: what vLLM's priority heap guarantees between levels, kept for every policy.
    A policy that orders levels itself (`fairway`) is unchanged by it; without a priority column
    nothing is done."""
    priority = waiting.priority
    if priority is None or not len(priority):
        return ordering
    order = np.asarray(ordering.order, dtype=np.intp)
    regroup = np.argsort(priority[order], kind="stable")
    if np.array_equal(regroup, np.arange(len(order))):
        return ordering
    lanes = ordering.lanes
    if lanes is not None and len(lanes) == len(order):
        lanes = [lanes[i] for i in regroup.tolist()]
    return Ordering(order[regroup], lanes, ordering.plan)
