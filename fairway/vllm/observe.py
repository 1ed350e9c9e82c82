"""What the scheduler reports about its decisions: hit/miss queue time and TTFT, the decision trace.

One `StepObserver` per scheduler, built only when something is on (vLLM's `log_stats` for the
histograms, the `decision_trace` option for the trace); otherwise the scheduler holds None and
pays one `is None` check per hook. The hooks run after vLLM's `schedule()` and after
`update_from_output()`, read what vLLM decided, and change nothing. A failure in them is counted
and logged once like a policy failure (`fairway_fallback`) and never reaches the engine.

Definitions (the same as the reports'):
    queue time: arrival -> admission (the step that first schedules the request);
    TTFT: arrival -> the `update_from_output` whose output carries the first token;
    hit: cached prefix at admission (vLLM's `num_computed_tokens` of the new request) >= half
        of the prompt; miss otherwise. Times are on `fairway_clock`, the clock of
        `Request.arrival_time`.

With tenants configured the same TTFT is also observed by tenant
(`fairway:tenant_time_to_first_token_seconds`, the label from the pre-pass's `TenantLabels`), and
the decision trace records `fairway`'s tenant counters (`tenant_counters`, by tenant name).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fairway.errors import FairwayConfigError
from fairway.vllm import internals
from fairway.vllm.decisions import DecisionTrace, TraceSettings
from fairway.vllm.metrics import NO_LANE, LatencyMetrics, TenantLabels, TenantMetrics, cache_label

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

    from fairway.vllm.prepass import OrderedStep


class StepObserver:
    """Hooks of one Fairway scheduler; see the module docstring."""

    def __init__(
        self,
        scheduler: Any,
        latency: LatencyMetrics | None,
        trace: DecisionTrace | None,
        tenants: TenantMetrics | None = None,
        tenant_labels: TenantLabels | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.latency = latency
        self.trace = trace
        #: Per-tenant TTFT (with `tenant_labels`; None: no tenants or no metrics).
        self.tenants = tenants if tenant_labels is not None else None
        self.tenant_labels = tenant_labels
        #: Tenant name of each code, for the trace's `tenant_counters` (code 0: `default`).
        self.tenant_names: tuple[str, ...] = (
            tenant_labels.table.names if tenant_labels is not None else ()
        )
        #: Admitted requests still waiting for their first token: id -> (request, cache label).
        self.pending: dict[str, tuple[Request, str]] = {}
        #: The tenant label of each pending request (only with per-tenant TTFT on).
        self.pending_tenants: dict[str, str] = {}
        self._updates = 0  # since the last check of every pending request

    def after_schedule(self, output: SchedulerOutput, ordered: OrderedStep | None) -> None:
        """After vLLM's step (`ordered`: what the pre-pass did to the queue, None: nothing):
        queue times of first admissions; a trace record. Never raises."""
        sched = self.scheduler
        try:
            now = sched.fairway_prepass.clock()
            new = internals.new_requests(sched, output)
            if self.latency is not None and new:
                # the lane of each request admitted from the order (not built over the queue)
                lanes = ordered.admitted_lanes if ordered is not None else {}
                labels = self.tenant_labels if self.tenants is not None else None
                pending_tenants = self.pending_tenants
                for request_id, request, computed in new:
                    if internals.times_preempted(request):  # resumed, not a first admission
                        continue
                    cache = cache_label(computed, request.num_prompt_tokens)
                    lane = lanes.get(request_id, NO_LANE)
                    self.latency.observe_queue(cache, lane, now - request.arrival_time)
                    self.pending[request_id] = (request, cache)
                    if labels is not None:
                        pending_tenants[request_id] = labels.of(request)
            if self.trace is not None:
                self._trace(self.trace, output, ordered, now, [rid for rid, _, _ in new])
        except Exception as exc:  # noqa: BLE001 - reporting must never stop the engine
            sched.fairway_fallback(exc, "recording queue metrics / the decision trace",
                                    "the step's output is unchanged")

    def after_update(self, result: Any = None) -> None:
        """After `update_from_output` (`result`, what it returned): TTFT of requests whose first
        token came. Never raises.

        vLLM reports every request that got tokens in `result`, so only the pending requests
        named there are checked: O(reported) instead of O(pending) while fewer report than wait
        for their first token (a prefill node: many long prefills in progress). Every
        `SWEEP_EVERY` updates (and when `result` is not vLLM's dict of `EngineCoreOutputs`) every
        pending request is checked, which also drops those that finished without a token
        (aborted).
        """
        pending = self.pending
        latency = self.latency
        if not pending or latency is None:  # only first admissions with metrics are pending
            return
        sched = self.scheduler
        tenants_of, tenant_ttft = self.pending_tenants, self.tenants
        try:
            now = sched.fairway_clock()
            self._updates += 1
            reported = internals.reported_ids(result, len(pending))
            if reported is None or self._updates >= SWEEP_EVERY:
                self._updates = 0
                reported = list(pending)
            for request_id in reported:
                entry = pending.get(request_id)
                if entry is None:
                    continue
                request, cache = entry
                if request.num_output_tokens > 0:
                    seconds = now - request.arrival_time
                    latency.observe_ttft(cache, seconds)
                    del pending[request_id]
                    tenant = tenants_of.pop(request_id, None) if tenants_of else None
                    if tenant is not None and tenant_ttft is not None:
                        tenant_ttft.observe_ttft(tenant, seconds)
                elif request.is_finished():  # aborted or failed before its first token
                    del pending[request_id]
                    if tenants_of:
                        tenants_of.pop(request_id, None)
        except Exception as exc:  # noqa: BLE001
            pending.clear()
            tenants_of.clear()
            sched.fairway_fallback(exc, "recording TTFT", "the step's output is unchanged")

    def _trace(
        self,
        trace: DecisionTrace,
        output: SchedulerOutput,
        ordered: OrderedStep | None,
        now: float,
        new: list[str],
    ) -> None:
        sched = self.scheduler
        scheduled = internals.scheduled_tokens(output)
        if ordered is None and not new and not len(internals.waiting_queue(sched)):
            return  # nothing was waiting: no decision to record
        resumed = internals.resumed_ids(output)
        ordering = sched.fairway_last_ordering
        trace.after_step(
            now=now,
            policy=sched.fairway_policy,
            ordered=ordered is not None,
            views=sched.fairway_last_views,
            order=sched.fairway_last_order,
            lanes=ordering.lanes if ordering is not None else None,
            plan=ordering.plan if ordering is not None else None,
            num_fixed=ordered.num_fixed if ordered is not None else 0,
            admitted=[*new, *sorted(resumed)],
            scheduled=scheduled,
            tenant_names=self.tenant_names,
        )

    def close(self) -> None:
        """Close the trace file, if any."""
        if self.trace is not None:
            self.trace.close()


#: `after_update` checks every pending request at least this often (in updates).
SWEEP_EVERY = 64


def for_scheduler(scheduler: Any) -> StepObserver | None:
    """The observer of `scheduler`, or None when neither the metrics nor the trace are on."""
    metrics = scheduler.fairway_metrics
    latency = LatencyMetrics(metrics.labels) if metrics is not None else None
    tenants = metrics.tenants if metrics is not None else None
    tenant_labels = scheduler.fairway_prepass.tenant_labels
    settings = trace_settings(scheduler.fairway_options)
    trace: DecisionTrace | None = None
    if settings is not None:
        try:
            trace = DecisionTrace(settings)
        except OSError as exc:
            raise FairwayConfigError(
                f"Fairway option decision_trace={settings.path!r}: cannot open it for writing "
                f"({exc.strerror or exc}); give a writable path or leave the option out"
            ) from None
    if latency is None and trace is None:
        return None
    return StepObserver(scheduler, latency, trace, tenants, tenant_labels)


def trace_settings(options: Any) -> TraceSettings | None:
    """The decision-trace settings of `FairwayOptions`, or None when the trace is off."""
    path = getattr(options, "decision_trace", None)
    if not path:
        return None
    return TraceSettings(
        path=str(path),
        every=options.decision_trace_every,
        head=options.decision_trace_head,
        max_bytes=options.decision_trace_max_bytes,
    )
