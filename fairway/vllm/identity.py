"""The scheduler's half of the trust model (`fairway.trust`): each new request's tenant and
priority are judged once, in `add_request`, before vLLM queues it.

Why there: every way into the engine (each HTTP endpoint, any API server, an engine started
apart) ends in `Scheduler.add_request`, so a request the middleware never saw is judged too, and
everything after it (the queue's tenant and priority columns, the tenant labels of the metrics,
vLLM's own priority heap and preemption) reads the judged values from the request itself:

* under `tenant_source` api-key or header, the request's `extra_args` (its `vllm_xargs`) are
  rewritten in place: `tenant` becomes the sealed identity's tenant, or is removed (the default
  tenant), and the middleware's keys are removed; a tenant the client named that is not the
  sealed one is counted (`fairway:untrusted_tenant_claims_total`, by its label) and logged once;
* a priority below the request's floor is raised to it (`Request.priority`), counted
  (`fairway:untrusted_priority_claims_total`) and logged once.

Under `client` without `priority_floor` there is nothing to judge: no gate, no cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm.logger import init_logger

from fairway.options import FairwayOptions
from fairway.tenants import TENANT_KEY, TenantTable
from fairway.trust import RESERVED_KEYS, TrustRule
from fairway.vllm import internals
from fairway.vllm.metrics import FairwayMetrics, FairwayStats

if TYPE_CHECKING:
    from vllm.v1.request import Request

logger = init_logger(__name__)


class RequestGate:
    """Judges new requests (`admit`) by a `TrustRule`; counts into a `FairwayStats`.

    Args:
        rule: the node's rule (it must act: `TrustRule.acts`).
        table: the configured tenants (the labels claims are counted by).
        stats: the scheduler's stats of the step in progress (drained with the step's).
    """

    def __init__(self, rule: TrustRule, table: TenantTable, stats: FairwayStats) -> None:
        self.rule = rule
        self.table = table
        self.stats = stats
        self._logged: set[str] = set()

    def admit(self, request: Request) -> None:
        """Judge one new request and serve it as judged (edits the request in place)."""
        rule = self.rule
        extra = internals.request_extra_args(request)
        verdict = rule.judge(extra, internals.request_priority(request))
        if rule.enforced and extra is not None:
            for key in (TENANT_KEY, *RESERVED_KEYS):
                extra.pop(key, None)
            if verdict.tenant is not None:
                extra[TENANT_KEY] = verdict.tenant
        if verdict.claimed is not None:
            label = self.table.label_of(verdict.claimed)
            claims = self.stats.untrusted_tenant_claims
            claims[label] = claims.get(label, 0) + 1
            self._log_once(
                "tenant",
                "Fairway: a request named tenant %r (its label) in vllm_xargs, but "
                "tenant_source is %s: only the identity Fairway's middleware seals counts, so "
                "it is served as %s. Counted in fairway:untrusted_tenant_claims_total; logged "
                "once.", label, rule.source,
                "its caller's tenant" if verdict.tenant is not None else "the default tenant",
            )
        if verdict.raised:
            internals.set_request_priority(request, verdict.priority)
            self.stats.untrusted_priority_claims += 1
            self._log_once(
                "priority",
                "Fairway: a request asked for a priority below its floor (%s); it is served at "
                "the floor. Counted in fairway:untrusted_priority_claims_total; logged once.",
                verdict.priority,
            )

    def fail_closed(self, request: Request) -> None:
        """What `admit` falls back to when it fails: under enforced trust the request loses
        any tenant (the default one). Never raises."""
        extra = internals.request_extra_args(request)
        if self.rule.enforced and extra is not None:
            extra.pop(TENANT_KEY, None)

    def _log_once(self, kind: str, message: str, *args: object) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            logger.warning(message, *args)


def gate_for(
    options: FairwayOptions, metrics: FairwayMetrics | None, stats: FairwayStats
) -> RequestGate | None:
    """The scheduler's gate (None: the options trust clients and set no floor).

    Raises:
        FairwayConfigError: api-key or header without the seal's secret in the environment.
    """
    rule = TrustRule.build(options.trust_source, options.priority_floor)
    if not rule.acts:
        return None
    table = options.tenant_table
    if metrics is not None:
        claims = rule.enforced and table.enabled  # without tenants a claim changes nothing
        metrics.enable_trust(table.labels() if claims else None, rule.floor is not None)
    return RequestGate(rule, table, stats)
