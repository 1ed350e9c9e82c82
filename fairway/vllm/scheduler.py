"""FairwayScheduler / FairwayAsyncScheduler: vLLM's V1 schedulers with Fairway's queue order.

Use: `vllm serve MODEL --scheduler-cls fairway.vllm.FairwayScheduler --scheduling-policy fcfs
--enable-prefix-caching --additional-config '{"fairway": {"policy": "fairway"}}'`. The class
follows vLLM's async-scheduling setting (the default on GPUs): with it on, vLLM gets a
`FairwayAsyncScheduler`, built on vLLM's `AsyncScheduler`.

Before each step the mixin re-sorts `self.waiting` (vLLM's FCFS deque) in place by the policy's
order, then calls vLLM's own `schedule()`, which admits in that order within the token budget,
chunks what does not fit and stops at the first request whose KV blocks do not fit. Fairway decides
who starts; vLLM's admission, allocation, preemption and chunking are untouched. Anything that goes
wrong in the pre-pass leaves vLLM's order for that step: the ordering can never stop the engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

import fairway
import fairway.policies as policies
from fairway.errors import FairwayConfigError, FairwayError
from fairway.options import FairwayOptions
from fairway.policies.queue import (
    UNPLACED_LANE,
    HeadOrder,
    Ordering,
    QueueColumns,
    Step,
    StepPlan,
    check_head,
    check_order,
)
from fairway.vllm import internals, observe, plugin, probe, protect, share
from fairway.vllm.metrics import FairwayMetrics, FairwayStats

logger = init_logger(__name__)


@dataclass(slots=True)
class _Placed:
    """What the pre-pass did this step, for the after-step bookkeeping."""

    queue: list[Request]  # the new order of self.waiting
    num_fixed: int  # preempted requests kept at the head
    num_ordered: int  # requests the policy ordered, right after the fixed ones
    lanes: list[str] | None  # lane per ordered position (Fairway), None: one lane
    #: Lane of each request admitted from the ordered positions (set after the step).
    admitted_lanes: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class _LastOrder:
    """The policy's input and output at the last ordered step (views built only when read)."""

    columns: QueueColumns | None = None
    order: np.ndarray | HeadOrder | None = None
    #: The policy's answer (lanes, plan) at that step.
    ordering: Ordering | None = None


class FairwaySchedulerMixin:
    """The logic shared by both Fairway schedulers; put it before the vLLM base class.

    Attributes set at construction (public, read by tests, the replay and the benchmark):
        fairway_options: the resolved `FairwayOptions`.
        fairway_policy: the policy object (one per scheduler; it may keep state).
        fairway_probe: the incremental `PrefixProbe` (it also keeps the queue's numpy columns).
        fairway_totals: `FairwayStats` accumulated since construction.
        fairway_last_views / fairway_last_order: the policy's input and output at the last
            ordered step (views of the orderable requests, built when read; indices into them).
            The order is the one applied: exact at least in the positions vLLM's scan can reach
            (`internals.scan_bound`); a policy may leave the rest in their queue order.
        fairway_clock: `() -> seconds`, the `now` given to the policy; must be on the clock of
            `Request.arrival_time` (wall clock, `time.time`, in vLLM). Assign another callable
            to the attribute (or call `set_fairway_clock`) for a virtual clock.
    """

    fairway_clock: Callable[[], float] = staticmethod(time.time)

    def __init__(
        self, *args: Any, fairway_options: FairwayOptions | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        # In-process callers (replay, tests) pass the object; a server resolves JSON + FAIRWAY_*.
        options = fairway_options or FairwayOptions.from_vllm_config(self.vllm_config)
        policy = options.build_policy()
        _check_engine_config(self.vllm_config, options, policy)
        _check_internals(self)
        self.fairway_options = options
        self.fairway_policy = policy
        manager = internals.kv_cache_manager(self)
        self.fairway_probe = probe.PrefixProbe(
            manager,
            caching=bool(self.cache_config.enable_prefix_caching),
            max_tokens=internals.usable_blocks(self) * internals.block_size_of(manager),
            keep_preempted_first=not options.reorder_preempted,
        )
        self._fairway_rejected: set[str] = set()
        self._fairway_failed_types: set[type] = set()
        self._fairway_top_k = options.top_k(self.scheduler_config.max_num_seqs)
        self._fairway_last = _LastOrder()
        self._fairway_prepass_ran = False
        #: Steps whose ordering was skipped because no request slot was free.
        self.fairway_steps_skipped = 0
        self.fairway_stats = FairwayStats()
        self.fairway_totals = FairwayStats()
        self.fairway_metrics = (
            FairwayMetrics(
                model_name=str(self.vllm_config.model_config.served_model_name),
                engine=str(self.vllm_config.parallel_config.data_parallel_rank),
                policy=options.policy,
            )
            if self.log_stats
            else None
        )
        plugin.attach_vllm_logging()  # also when the entry point is not installed
        self._fairway_calibration = (
            _make_calibration(self) if options.self_calibrate or options.step_log else None
        )
        self._fairway_plans = _plan_enabled(self, policy)
        #: Tell the policy how many positions vLLM's scan can reach (it may order only those
        #: exactly); tests set it False to compare with the full order.
        self._fairway_head_only = True
        self._fairway_step_plan: StepPlan | None = None
        #: The plan of the last step the policy planned (None before, and after an idle step).
        self.fairway_last_plan: StepPlan | None = None
        # hit/miss queue metrics and the decision trace; None (nil cost) when both off
        self._fairway_observer = observe.for_scheduler(self)
        _log_start(options, policy, self)

    def set_fairway_clock(self, clock: Callable[[], float]) -> None:
        """Use `clock` for `now` (e.g. the virtual clock of `fairway.replay.sim`)."""
        self.fairway_clock = clock

    @property
    def fairway_last_views(self) -> list[policies.QueuedRequest]:
        """The orderable requests at the last ordered step, as the policy's views."""
        columns = self._fairway_last.columns
        return columns.views() if columns is not None else []

    @property
    def fairway_last_ordering(self) -> Ordering | None:
        """The policy's answer at the last ordered step: order, lanes and, for a policy with
        `plans_steps`, the step's plan."""
        return self._fairway_last.ordering

    @property
    def fairway_last_order(self) -> list[int]:
        """The order applied at the last ordered step (indices into `fairway_last_views`); a
        policy may order only its head exactly (see `internals.scan_bound`)."""
        order = self._fairway_last.order
        return np.asarray(order).tolist() if order is not None else []

    def add_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        """vLLM's unchanged; the probe registers the new request (a streaming update of a known
        request drops its memo: its tokens change)."""
        existing = self.requests.get(request.request_id)  # vLLM internal: Scheduler.requests
        result = super().add_request(request, *args, **kwargs)  # type: ignore[misc]
        try:
            if existing is not None:
                self.fairway_probe.invalidate(existing)
            else:
                self.fairway_probe.note_arrival(request)
        except Exception as exc:  # noqa: BLE001
            self._fairway_fallback(exc, "registering a new request", "it is probed later")
        return result

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        """Order the waiting queue, then run vLLM's step unchanged (arguments pass through)."""
        start = time.perf_counter()
        self._fairway_step_plan = None
        placed = self._fairway_reorder()
        undo = self._fairway_plan_apply(placed)
        prepass_s = time.perf_counter() - start
        try:
            output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        finally:
            if undo is not None:
                undo.restore()
        self._fairway_after_step(output, placed, prepass_s)
        if self._fairway_observer is not None:  # never raises
            self._fairway_observer.after_schedule(output, placed)
        if self._fairway_calibration is not None:
            self._fairway_calibrate("on_schedule", output)
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, *args: Any, **kwargs: Any
    ) -> Any:
        """vLLM's unchanged; then tells self-calibration and the observer (if on) it is in."""
        if self._fairway_calibration is not None:
            self._fairway_calibrate("on_update", scheduler_output)
        result = super().update_from_output(scheduler_output, *args, **kwargs)  # type: ignore[misc]
        if self._fairway_observer is not None:  # never raises
            self._fairway_observer.after_update(result)
        return result

    def _fairway_calibrate(self, hook: str, output: SchedulerOutput) -> None:
        """Call a `SchedulerCalibration` hook; a failure only skips calibration this step."""
        try:
            getattr(self._fairway_calibration, hook)(output)
        except Exception as exc:  # noqa: BLE001
            self._fairway_fallback(exc, "self-calibrating", "this step is not calibrated")

    # --- before the step --------------------------------------------------------------------------

    def _fairway_reorder(self) -> _Placed | None:
        """Re-sort `self.waiting`; on any failure leave it as it is. Never raises.

        When no request slot is free, vLLM's step cannot admit anyone, so the order cannot matter:
        the queue keeps its last order and only the probe advances (new arrivals within its
        budget, changed hits). For a policy that plans steps only when no running request is
        in prefill either (its plan also caps the running prefills): nothing is contested, and
        the policy is told so (`idle_step`).
        """
        queue = internals.waiting_queue(self)
        self._fairway_prepass_ran = bool(queue)
        try:
            if not queue or not internals.can_admit(self):
                contested = (
                    bool(queue) and self._fairway_plans and internals.has_running_prefill(self)
                )
                if not contested:
                    if queue and self._fairway_plans:
                        self.fairway_policy.idle_step()
                        self.fairway_last_plan = None
                    self._fairway_skip(queue)
                    return None
        except Exception as exc:  # noqa: BLE001
            self._fairway_fallback(exc)
            return None
        current = list(queue)
        try:
            placed = self._fairway_plan(current)
        except Exception as exc:  # noqa: BLE001 - the engine must survive any policy bug
            self._fairway_fallback(exc)
            return None
        if placed.queue is not current:
            internals.reorder_queue(queue, placed.queue)
        if self.fairway_options.protect_enabled:
            self._fairway_protect(placed.queue)
        return placed

    def _fairway_skip(self, queue: Any) -> None:
        """A step without ordering: the probe advances (new arrivals within its budget, changed
        hits); memos of requests that left without being admitted are dropped."""
        memo = self.fairway_probe
        if len(memo) > 2 * len(queue) + 64:  # many left unadmitted (aborts): drop them
            memo.snapshot(list(queue))
        if queue:
            memo.advance()
            self.fairway_steps_skipped += 1
            oldest = memo.oldest_arrival()
            self.fairway_stats.oldest_waiting_age_s = max(0.0, self.fairway_clock() - oldest)

    def _fairway_plan(self, current: list[Request]) -> _Placed:
        """The new queue order (a permutation of `current`), or an exception."""
        snap = self.fairway_probe.snapshot(current)
        cols = snap.columns
        assert cols is not None
        n = len(cols)
        ordering = self._fairway_ordering(cols, snap.fixed)
        try:
            if isinstance(ordering.order, HeadOrder):  # checked and applied from its head
                check_head(ordering.order, n)
                order: np.ndarray | HeadOrder = ordering.order
            else:
                order, moved = check_order(ordering.order, n)
        except ValueError as exc:
            raise PolicyOrderError(
                f"policy {self.fairway_options.policy!r} did not return a permutation of "
                f"range({n}): {exc}"
            ) from None
        self.fairway_probe.mark_given(cols)
        if isinstance(order, HeadOrder):
            queue = self.fairway_probe.arrange_head(snap, order)
        else:
            queue = self.fairway_probe.arrange(snap, order, moved)
        for request in snap.oversized:
            self._fairway_reject(request)
        lanes = ordering.lanes
        if lanes is not None and len(lanes) != n:
            lanes = None
        self._fairway_last = _LastOrder(cols, order, ordering)
        stats = self.fairway_stats
        stats.steps_ordered += 1
        if n:
            stats.queue_work_max_tokens, stats.queue_work_min_tokens = snap.work_max, snap.work_min
            oldest = cols.arrival.item(cols.oldest_row)
            stats.oldest_waiting_age_s = max(0.0, self.fairway_clock() - oldest)
        return _Placed(queue, snap.num_fixed, n, lanes)

    # --- the policy's one call, and the step plan (policies with `plans_steps`) ----------------

    def _fairway_ordering(self, waiting: QueueColumns, ahead: list[Request]) -> Ordering:
        """Ask the policy for this step's order (and plan); raises like the policy may.

        The one call of the policy: `Step` says how far vLLM's scan reaches and, for a policy
        that plans steps, the step's budget and running prefills. A policy that does not plan
        steps is not asked when nothing is orderable."""
        now = self.fairway_clock()
        if not self._fairway_plans:
            if not len(waiting):
                return Ordering([])
            head = internals.scan_bound(self) if self._fairway_head_only else None
            return self.fairway_policy.ordering(waiting, Step(now, head))
        prefilling, decode_tokens = internals.running_prefills(self)
        firsts = [(r.request_id, r.num_tokens - self.fairway_probe.cached_tokens(r)) for r in ahead]
        free = internals.free_slots(self)
        head = internals.scan_bound(self, free) if self._fairway_head_only else None
        budget = share.step_budget(self, decode_tokens, firsts, free)
        ordering = self.fairway_policy.ordering(waiting, Step(now, head, budget, prefilling))
        self._fairway_step_plan = self.fairway_last_plan = ordering.plan
        return ordering

    def _fairway_plan_apply(self, placed: _Placed | None) -> share.ShareUndo | None:
        """Apply the step's plan to vLLM's knobs for this `schedule()` call. Never raises.

        With an empty waiting queue the plan is made here (running prefills only).
        """
        if not self._fairway_plans:
            return None
        try:
            if placed is None and not internals.waiting_queue(self):
                self._fairway_ordering(QueueColumns.of([]), [])
            if self._fairway_step_plan is None:
                return None
            return share.apply(self, self._fairway_step_plan)
        except Exception as exc:  # noqa: BLE001
            self._fairway_step_plan = None
            self._fairway_fallback(exc, "applying the token share", "vLLM's split is kept")
            return None

    def _fairway_plan_feed(self, output: SchedulerOutput, admitted_ids: list[str]) -> None:
        """Give the policy the prefill tokens vLLM scheduled per request; count them by lane."""
        plan = self._fairway_step_plan
        assert plan is not None
        by_request = internals.prefill_by_request(self, output)
        total = sum(by_request.values())
        self.fairway_policy.on_step_end(admitted_ids, total, prefill_by_request=by_request)
        lanes = plan.lanes
        fair = sum(n for rid, n in by_request.items() if lanes.get(rid) == "fair")
        lane_tokens = self.fairway_stats.lane_prefill_tokens
        lane_tokens["fair"] += fair
        lane_tokens["fast"] += total - fair

    def _fairway_reject(self, request: Request) -> None:
        """Finish a request that can never fit (once); it already sits behind everyone."""
        request_id, _, num_tokens = internals.request_fields(request)
        if request_id in self._fairway_rejected:
            return
        self._fairway_rejected.add(request_id)
        self.fairway_stats.oversized_rejected += 1
        protect.log_oversized(
            request_id, num_tokens, self.fairway_probe.block_size, internals.usable_blocks(self)
        )
        internals.report_request_error(self, request_id)

    def _fairway_protect(self, queue: list[Request]) -> None:
        """Soft eviction protection of the first K requests' cached blocks. Never raises."""
        try:
            hit_blocks = self.fairway_probe.hit_blocks
            chains = (hit_blocks(r) for r in queue[: self._fairway_top_k])
            free_queue = internals.free_block_queue(self)
            self.fairway_stats.protected_blocks += protect.protect_hit_blocks(free_queue, chains)
        except Exception as exc:  # noqa: BLE001
            self._fairway_fallback(exc, "protecting cached blocks", "no protection this step")

    def _fairway_fallback(
        self,
        exc: Exception,
        what: str = "ordering the waiting queue",
        outcome: str = "vLLM's order is kept for this step",
    ) -> None:
        """Count the failure; log it once per exception type (no request ids in the args)."""
        self.fairway_stats.policy_fallbacks += 1
        kind = type(exc)
        if kind in self._fairway_failed_types:
            return
        self._fairway_failed_types.add(kind)
        logger.warning(
            "Fairway: %s failed while %s (policy %s); %s and the engine keeps serving. Counted "
            "in fairway:policy_fallbacks_total; this message is logged once per exception type.",
            kind.__name__,
            what,
            self.fairway_options.policy,
            outcome,
            exc_info=exc,
        )

    # --- after the step ---------------------------------------------------------------------------

    def _fairway_after_step(
        self, output: SchedulerOutput, placed: _Placed | None, prepass_s: float
    ) -> None:
        """Tell the policy what was admitted; forget who left; publish stats. Never raises."""
        stats = self.fairway_stats
        try:
            started = internals.started_ids(output)
            if started:  # they left the waiting queue
                requests = self.requests  # vLLM internal: Scheduler.requests
                self.fairway_probe.forget(requests[rid] for rid in started if rid in requests)
            admitted: list[Request] = []
            if self._fairway_prepass_ran:
                stats.prepass_s.append(prepass_s)
            if placed is not None:
                admitted = self._fairway_admitted(output, placed)
            elif not self._fairway_prepass_ran:
                stats.oldest_waiting_age_s = 0.0  # nothing waited at the start of the step
            admitted_ids = [r.request_id for r in admitted]  # vLLM internal: Request.request_id
            if self._fairway_step_plan is not None:
                self._fairway_plan_feed(output, admitted_ids)
            elif placed is not None:
                prefill = internals.prefill_tokens(self, output)
                self.fairway_policy.on_step_end(admitted_ids, prefill)
            self._fairway_trim()
        except Exception as exc:  # noqa: BLE001
            self._fairway_fallback(exc, "finishing the step", "the step's output is unchanged")
        if self.fairway_metrics is not None or self._fairway_prepass_ran:
            if self.fairway_metrics is not None:
                self.fairway_metrics.record(stats)
            self.fairway_totals.add(stats)
            stats.reset()

    def _fairway_admitted(self, output: SchedulerOutput, placed: _Placed) -> list[Request]:
        """Requests admitted from our order, in admission order; counts them by lane.

        vLLM pops admitted requests from the head and puts skipped ones back at the head, so the
        admitted ones lie within the first (scheduled + skipped) positions of our order. One
        admitted past an exact head (vLLM skipped more than `internals.scan_bound` foresaw) was
        placed by no lane and is not counted.
        """
        scheduled = internals.scheduled_tokens(output)
        if not scheduled:
            return []
        limit = len(scheduled) + internals.deferred_count(self)
        admitted: list[Request] = []
        placed_counts = self.fairway_stats.placed
        admitted_lanes = placed.admitted_lanes
        for k, request in enumerate(placed.queue[:limit]):
            if request.request_id not in scheduled:  # vLLM internal: Request.request_id
                continue
            admitted.append(request)
            ordered_pos = k - placed.num_fixed
            if 0 <= ordered_pos < placed.num_ordered:  # not preempted-first, not oversized
                lane = placed.lanes[ordered_pos] if placed.lanes is not None else "single"
                admitted_lanes[request.request_id] = lane
                if lane != UNPLACED_LANE:  # past an exact head: no lane placed it
                    placed_counts[lane] = placed_counts.get(lane, 0) + 1
        return admitted

    def _fairway_trim(self) -> None:
        """Forget rejected ids of requests that are gone (the probe drops its own entries)."""
        if len(self._fairway_rejected) <= 64:
            return
        requests = self.requests  # vLLM internal: Scheduler.requests
        self._fairway_rejected = {rid for rid in self._fairway_rejected if rid in requests}


class PolicyOrderError(FairwayError):
    """The policy's `order()` did not return a permutation of the queue's indices."""


class FairwayScheduler(FairwaySchedulerMixin, Scheduler):
    """vLLM's scheduler with Fairway's waiting-queue order; the class to name in `--scheduler-cls`.

    It follows the engine's own async-scheduling setting: vLLM builds whatever class
    `--scheduler-cls` names with the resolved `VllmConfig`, and when
    `scheduler_config.async_scheduling` is on (vLLM's default on GPUs) this class builds a
    `FairwayAsyncScheduler` (Fairway on vLLM's `AsyncScheduler`) instead, so naming it never
    switches async scheduling off. Subclasses are built as they are (they chose their base).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> FairwayScheduler:
        config = kwargs["vllm_config"] if "vllm_config" in kwargs else (args or (None,))[0]
        if cls is FairwayScheduler and _async_scheduling(config):
            cls = FairwayAsyncScheduler
        return super().__new__(cls)  # object.__new__: the arguments go to __init__ only


class FairwayAsyncScheduler(FairwayScheduler, AsyncScheduler):
    """vLLM's `AsyncScheduler` with Fairway's waiting-queue order (`--async-scheduling`).

    What `FairwayScheduler` resolves to under async scheduling; naming it directly is the same.
    MRO: Fairway's mixin, then `AsyncScheduler`, then `Scheduler`.
    """


def _async_scheduling(vllm_config: Any) -> bool:
    """The engine's resolved async-scheduling setting (None, not yet resolved: synchronous)."""
    scheduler_config = getattr(vllm_config, "scheduler_config", None)
    return bool(getattr(scheduler_config, "async_scheduling", False))


# --- start-up checks ------------------------------------------------------------------------------


def _check_engine_config(vllm_config: Any, options: FairwayOptions, policy: Any) -> None:
    """Refuse engine settings Fairway cannot work with; the fix comes first in the message."""
    queue_policy = vllm_config.scheduler_config.policy
    if queue_policy != "fcfs":
        raise FairwayConfigError(
            f"start vLLM with --scheduling-policy fcfs: Fairway re-orders vLLM's FCFS waiting "
            f"queue and cannot impose an order on the {queue_policy!r} queue (a heap)"
        )
    if type(policy).needs_cache_hits and not vllm_config.cache_config.enable_prefix_caching:
        agnostic = [n for n in policies.names() if not type(policies.get(n)).needs_cache_hits]
        raise FairwayConfigError(
            f"start vLLM with --enable-prefix-caching: Fairway policy {options.policy!r} orders "
            f"by cached prefix length, and prefix caching is off (policies that work without "
            f"it: {', '.join(agnostic)})"
        )


def _plan_enabled(scheduler: Any, policy: policies.Policy) -> bool:
    """Whether the policy's step plans are applied; says why not at start-up."""
    if not type(policy).plans_steps:
        return False
    missing = internals.check_share_internals(scheduler)
    if missing:
        logger.warning(
            "Fairway: policy %s orders the queue but cannot split the step's tokens: vLLM "
            "internals it needs are missing (%s).",
            type(policy).name,
            ", ".join(missing),
        )
        return False
    if not internals.chunked_prefill(scheduler):
        logger.warning(
            "Fairway: chunked prefill is off, so policy %s only orders the waiting queue; "
            "capping a running prefill at its lane's share needs --enable-chunked-prefill.",
            type(policy).name,
        )
        return False
    return True


def _make_calibration(scheduler: Any) -> Any:
    """The step timer of `self_calibrate` / `step_log` (imported only when one is on)."""
    from fairway.vllm import calibrate

    return calibrate.for_scheduler(scheduler)


def _check_internals(scheduler: Scheduler) -> None:
    missing = internals.check_internals(scheduler)
    if missing:
        import vllm

        raise FairwayError(
            f"Fairway {fairway.__version__} does not support vLLM {vllm.__version__}: vLLM "
            f"internals it uses are missing or changed: {', '.join(missing)}. Supported: "
            "vLLM >=0.32,<0.34 (run `make compat` against a new version)."
        )


def _log_start(options: FairwayOptions, policy: Any, scheduler: Any) -> None:
    logger.info(
        "Fairway %s: %s ordering vLLM's waiting queue with policy %s, options %s (set by: %s); "
        "incremental prefix probe: %s.",
        fairway.__version__,
        type(scheduler).__name__,
        options.policy,
        options.describe(),
        dict(options.sources) or "defaults",
        scheduler.fairway_probe.incremental,
    )
    if "profile" in policies.param_names(options.policy) and getattr(policy, "profile", 1) is None:
        logger.warning(
            "Fairway: no prefill-time profile for policy %s, so every request's patience is "
            "the floor (patience_floor_s=%s s) whatever its length. Run `fairway profile` on "
            "this GPU and model and pass the table: --additional-config "
            '\'{"fairway": {"profile": "PATH"}}\' or FAIRWAY_PROFILE=PATH (a shipped estimate: '
            "a6000-llama3.1-8b-estimate).",
            options.policy,
            getattr(policy, "patience_floor_s", "?"),
        )
