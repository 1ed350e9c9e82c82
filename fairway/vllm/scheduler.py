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
from typing import TYPE_CHECKING, Any

import numpy as np
from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

import fairway
import fairway.policies as policies
from fairway import vllm_versions
from fairway.errors import FairwayConfigError, FairwayError
from fairway.options import FairwayOptions
from fairway.policies.queue import (
    Ordering,
    StepPlan,
)
from fairway.tenants import TenantTable
from fairway.vllm import identity, internals, observe, plugin
from fairway.vllm.metrics import FairwayMetrics, FairwayStats
from fairway.vllm.prepass import StepPrepass
from fairway.vllm.queue_mirror import QueueMirror
from fairway.vllm.tier_probe import TierProbe, tier_weight

logger = init_logger(__name__)


if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from fairway.vllm.calibrate import SchedulerCalibration

    _SchedulerBase = Scheduler  # the mixin always sits before one of vLLM's schedulers
else:
    _SchedulerBase = object


class FairwaySchedulerMixin(_SchedulerBase):
    """vLLM's hooks both Fairway schedulers override; put it before the vLLM base class.

    The work around each step is the `StepPrepass` the scheduler owns (`fairway_prepass`).

    Attributes (public, read by tests, the replay and the benchmark):
        fairway_prepass: the per-step pre-pass (policy, queue mirror, plan, stats).
        fairway_options / fairway_policy / fairway_mirror / fairway_stats / fairway_totals /
            fairway_metrics / fairway_steps_skipped / fairway_last_plan: the pre-pass's.
        fairway_last_views / fairway_last_order / fairway_last_ordering: the policy's input and
            output at the last ordered step (views of the orderable requests, built when read;
            indices into them). The order is the one applied: exact at least in the positions
            vLLM's scan can reach (`internals.scan_bound`); a policy may leave the rest in
            their queue order.
        fairway_observer: hit/miss queue metrics and the decision trace (None when both off).
        fairway_calibration: the step timer of `self_calibrate` / `step_log` (None when off).
        fairway_clock: `() -> seconds`, the `now` given to the policy; must be on the clock of
            `Request.arrival_time` (wall clock, `time.time`, in vLLM). Assign another callable
            to the attribute (or call `set_fairway_clock`) for a virtual clock.
    """

    def __init__(
        self, *args: Any, fairway_options: FairwayOptions | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        # In-process callers (replay, tests) pass the object; a server resolves JSON + FAIRWAY_*.
        options = fairway_options or FairwayOptions.from_vllm_config(self.vllm_config)
        policy = options.build_policy()
        check_engine_config(self.vllm_config, options, policy)
        by_priority = internals.use_fcfs_waiting_queue(self)
        _check_internals(self)
        manager = internals.kv_cache_manager(self)
        classify = _classifier(options.tenant_table, by_priority)
        metrics = (
            FairwayMetrics(
                model_name=str(self.vllm_config.model_config.served_model_name),
                engine=str(self.vllm_config.parallel_config.data_parallel_rank),
                policy=options.policy,
            )
            if self.log_stats
            else None
        )
        self.fairway_prepass = StepPrepass(
            self,
            options,
            policy,
            QueueMirror(
                manager,
                caching=bool(self.cache_config.enable_prefix_caching),
                max_tokens=internals.usable_blocks(self) * internals.block_size_of(manager),
                # vLLM's priority queue has no preempted-first rule: levels, then arrival
                keep_preempted_first=not (options.reorder_preempted or by_priority),
                classify=classify,
                tier=_tier_probe(self, options, policy),
                requests_by_id=lambda: internals.requests_by_id(self),
            ),
            metrics,
            applies_plans=_plan_enabled(self, policy),
            top_k=options.top_k(self.scheduler_config.max_num_seqs),
            clock=time.time,
        )
        #: Judges each new request's tenant and priority (`fairway.vllm.identity`; None: the
        #: options trust clients and set no priority floor).
        self.fairway_gate = identity.gate_for(options, metrics, self.fairway_prepass.stats)
        plugin.attach_vllm_logging()  # also when the entry point is not installed
        self.fairway_calibration = (
            _make_calibration(self) if options.self_calibrate or options.step_log else None
        )
        self.fairway_observer = observe.for_scheduler(self)
        _log_start(options, policy, self)

    @property
    def fairway_clock(self) -> Callable[[], float]:
        """`() -> seconds`, the `now` given to the policy (wall clock, `time.time`, by default)."""
        return self.fairway_prepass.clock

    @fairway_clock.setter
    def fairway_clock(self, clock: Callable[[], float]) -> None:
        self.fairway_prepass.clock = clock

    def set_fairway_clock(self, clock: Callable[[], float]) -> None:
        """Use `clock` for `now` (e.g. the virtual clock of `fairway.replay.sim`)."""
        self.fairway_clock = clock

    # --- the pre-pass's state, read-only -------------------------------------------------------

    @property
    def fairway_options(self) -> FairwayOptions:
        return self.fairway_prepass.options

    @property
    def fairway_policy(self) -> policies.Policy:
        return self.fairway_prepass.policy

    @property
    def fairway_mirror(self) -> QueueMirror:
        return self.fairway_prepass.mirror

    @property
    def fairway_stats(self) -> FairwayStats:
        return self.fairway_prepass.stats

    @property
    def fairway_totals(self) -> FairwayStats:
        return self.fairway_prepass.totals

    @property
    def fairway_metrics(self) -> FairwayMetrics | None:
        return self.fairway_prepass.metrics

    @property
    def fairway_steps_skipped(self) -> int:
        """Steps whose ordering was skipped because no request slot was free."""
        return self.fairway_prepass.steps_skipped

    @property
    def fairway_last_plan(self) -> StepPlan | None:
        """The plan of the last step the policy planned (None before, after an idle step)."""
        return self.fairway_prepass.last_plan

    @property
    def fairway_last_views(self) -> list[policies.QueuedRequest]:
        """The orderable requests at the last ordered step, as the policy's views (none after a
        step whose ordering failed)."""
        columns = self.fairway_prepass.last.columns
        return columns.views() if columns is not None else []

    @property
    def fairway_last_ordering(self) -> Ordering | None:
        """The policy's answer at the last ordered step: order, lanes and, for a policy with
        `plans_steps`, the step's plan (None after a step whose ordering failed)."""
        return self.fairway_prepass.last.ordering

    @property
    def fairway_last_order(self) -> list[int]:
        """The order applied at the last ordered step (indices into `fairway_last_views`); a
        policy may order only its head exactly (see `internals.scan_bound`)."""
        order = self.fairway_prepass.last.order
        return np.asarray(order).tolist() if order is not None else []

    def fairway_fallback(
        self,
        exc: Exception,
        what: str = "ordering the waiting queue",
        outcome: str = "vLLM's order is kept for this step",
    ) -> None:
        """Count a failure of Fairway's work around the step and log it once per type."""
        self.fairway_prepass.fallback(exc, what, outcome)

    # --- vLLM's hooks ----------------------------------------------------------------------------

    def add_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        """vLLM's unchanged, after the trust gate judged the request's tenant and priority (if
        the options ask for it); the mirror registers the new request (a streaming update of a
        known request drops its memo: its tokens change)."""
        gate = self.fairway_gate
        if gate is not None:
            try:
                gate.admit(request)
            except Exception as exc:  # noqa: BLE001
                gate.fail_closed(request)
                self.fairway_fallback(exc, "judging a request's tenant and priority",
                                      "it is served as the default tenant")
        existing = internals.requests_by_id(self).get(request.request_id)
        result = super().add_request(request, *args, **kwargs)
        try:
            if existing is not None:
                self.fairway_mirror.invalidate(existing)
            else:
                self.fairway_mirror.note_arrival(request)
        except Exception as exc:  # noqa: BLE001
            self.fairway_fallback(exc, "registering a new request", "it is probed later")
        return result

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        """Order the waiting queue, then run vLLM's step unchanged (arguments pass through)."""
        start = time.perf_counter()
        prepass = self.fairway_prepass
        prepass.step_plan = None
        ordered = prepass.reorder()
        undo = prepass.apply_plan(ordered)
        prepass_s = time.perf_counter() - start
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            if undo is not None:
                undo.restore()
        prepass.after_step(output, ordered, prepass_s)
        if self.fairway_observer is not None:  # never raises
            self.fairway_observer.after_schedule(output, ordered)
        if self.fairway_calibration is not None:
            self._calibrate("on_schedule", output)
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, *args: Any, **kwargs: Any
    ) -> Any:
        """vLLM's unchanged, except that the error output of a request Fairway finished because
        it can never fit says why (its `stop_reason`); then tells self-calibration and the
        observer (if on) it is in."""
        if self.fairway_calibration is not None:
            self._calibrate("on_update", scheduler_output)
        result = super().update_from_output(scheduler_output, *args, **kwargs)
        self.fairway_prepass.explain_errors(result)  # never raises
        if self.fairway_observer is not None:  # never raises
            self.fairway_observer.after_update(result)
        return result

    def _calibrate(self, hook: str, output: SchedulerOutput) -> None:
        """Call a `SchedulerCalibration` hook; a failure only skips calibration this step."""
        try:
            getattr(self.fairway_calibration, hook)(output)
        except Exception as exc:  # noqa: BLE001
            self.fairway_fallback(exc, "self-calibrating", "this step is not calibrated")


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
        if cls is FairwayScheduler and config is not None and _async_scheduling(config):
            cls = FairwayAsyncScheduler
        return super().__new__(cls)  # object.__new__: the arguments go to __init__ only


class FairwayAsyncScheduler(FairwayScheduler, AsyncScheduler):
    """vLLM's `AsyncScheduler` with Fairway's waiting-queue order (`--async-scheduling`).

    What `FairwayScheduler` resolves to under async scheduling; naming it directly is the same.
    MRO: Fairway's mixin, then `AsyncScheduler`, then `Scheduler`.
    """


def _async_scheduling(vllm_config: Any) -> bool:
    """The engine's resolved async-scheduling setting (None, not yet resolved: synchronous)."""
    return bool(vllm_config.scheduler_config.async_scheduling)


# --- start-up checks ------------------------------------------------------------------------------


def check_engine_config(
    vllm_config: VllmConfig, options: FairwayOptions, policy: policies.Policy
) -> None:
    """Refuse engine settings Fairway cannot work with; the fix comes first in the message."""
    queue_policy = vllm_config.scheduler_config.policy
    if queue_policy not in ("fcfs", "priority"):
        raise FairwayConfigError(
            f"start vLLM with --scheduling-policy fcfs or priority: Fairway re-orders vLLM's "
            f"waiting queue and knows no {queue_policy!r} queue"
        )
    if type(policy).needs_cache_hits and not vllm_config.cache_config.enable_prefix_caching:
        agnostic = [n for n in policies.names() if not type(policies.get(n)).needs_cache_hits]
        raise FairwayConfigError(
            f"start vLLM with --enable-prefix-caching: Fairway policy {options.policy!r} orders "
            f"by cached prefix length, and prefix caching is off (policies that work without "
            f"it: {', '.join(agnostic)})"
        )
    window = internals.cache_aware_admission_window(vllm_config)
    if window:
        raise FairwayConfigError(
            f"start vLLM without --cache-aware-admission-window (it is {window}): vLLM would "
            "re-sort the head of the waiting queue by cached prefix inside its step, after "
            "Fairway ordered it, and undo Fairway's order. Fairway's Fast lane already puts "
            "cached prefixes first within its bound; for vLLM's window rule itself, run the "
            "policy 'vllm-window'"
        )


def _classifier(
    tenants: TenantTable, by_priority: bool
) -> Callable[[Request], tuple[int, int]] | None:
    """`request -> (tenant code, priority level)` for the queue's columns; None when neither is
    configured (every request (0, 0): the one-class queue, at no cost). Without
    `--scheduling-policy priority` vLLM ignores priorities, and so does Fairway."""
    if not tenants.enabled and not by_priority:
        return None
    code_of = tenants.code_of
    if not by_priority:
        return lambda request: (code_of(internals.request_tenant(request)), 0)
    if not tenants.enabled:
        return lambda request: (0, internals.request_priority(request))
    return lambda request: (
        code_of(internals.request_tenant(request)), internals.request_priority(request)
    )


def _plan_enabled(scheduler: Scheduler, policy: policies.Policy) -> bool:
    """Whether the policy's step plans are applied; says why not at start-up."""
    if not type(policy).plans_steps:
        return False
    missing = internals.check_step_plan_internals(scheduler)
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


def _tier_probe(
    scheduler: Scheduler, options: FairwayOptions, policy: policies.Policy
) -> TierProbe | None:
    """The offload tier's probe, priced by option `tier` (None: no tier, or tier-blind).

    `priced` takes the load-to-compute ratio from the policy's profile (its measured load
    figures, or the estimate for its GPU class), or from the shipped default table when the
    policy has none. Any failure here leaves the order tier-blind with one warning.
    """
    from fairway.profiling import load_cost, table

    if internals.kv_connector(scheduler) is None or options.tier == "blind":
        return None
    try:
        ratio = 0.0
        if options.tier == "priced":
            profile = getattr(policy, "profile", None)
            if not isinstance(profile, table.PrefillProfile):
                profile = table.default_profile()
            cost = load_cost.for_profile(profile)
            ratio = cost.load_to_compute(profile)
            logger.info(
                "Fairway prices offload-tier hits at %.4f of a recompute per token (%s).",
                ratio, cost.note or cost.source,
            )
        weight = tier_weight(options.tier, options.tier_weight, ratio)
    except Exception as exc:  # noqa: BLE001 - a bad load-cost entry must not stop the engine
        logger.warning("Fairway cannot price the offload tier (%s); the order is tier-blind.", exc)
        return None
    return TierProbe.for_scheduler(scheduler, options.tier, weight)


def _make_calibration(scheduler: FairwaySchedulerMixin) -> SchedulerCalibration | None:
    """The step timer of `self_calibrate` / `step_log` (imported only when one is on)."""
    from fairway.vllm import calibrate

    return calibrate.for_scheduler(scheduler)


def _check_internals(scheduler: Scheduler) -> None:
    """Refuse to start when a vLLM internal Fairway uses is missing (`check_internals`) or means
    something else on this vLLM (`selftest`: a few steps of an offline scheduler of vLLM's own)."""
    from fairway.vllm import selftest

    found = internals.check_internals(scheduler)
    if not found:
        found = list(selftest.problems())
    if found:
        import vllm

        raise FairwayError(
            f"Fairway {fairway.__version__} does not support vLLM {vllm.__version__}: vLLM "
            f"internals it uses are missing or changed: {'; '.join(found)}. Supported: vLLM "
            f"{vllm_versions.describe()} (run `make rebase VLLM={vllm.__version__}`)."
        )


def _log_start(
    options: FairwayOptions, policy: policies.Policy, scheduler: FairwaySchedulerMixin
) -> None:
    logger.info(
        "Fairway %s: %s ordering vLLM's waiting queue with policy %s, options %s (set by: %s); "
        "incremental prefix probe: %s.",
        fairway.__version__,
        type(scheduler).__name__,
        options.policy,
        options.describe(),
        dict(options.sources) or "defaults",
        scheduler.fairway_mirror.incremental,
    )
    params = policy.params()
    if "profile" in params and params["profile"] is None:
        logger.warning(
            "Fairway: no prefill-time profile for policy %s, so every request's patience is "
            "the floor (patience_floor_s=%s s) whatever its length. Run `fairway profile` on "
            "this GPU and model and pass the table: --additional-config "
            '\'{"fairway": {"profile": "PATH"}}\' or FAIRWAY_PROFILE=PATH (a shipped estimate: '
            "a6000-llama3.1-8b-estimate).",
            options.policy,
            params.get("patience_floor_s", "?"),
        )
