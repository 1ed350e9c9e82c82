"""Prometheus metrics of the ordering, and how they reach vLLM's `/metrics`.

Transport. The scheduler runs in vLLM's EngineCore process; `/metrics` is served by the API-server
process. Fairway uses Prometheus' multiprocess mode, the mechanism vLLM itself uses with
`--api-server-count > 1`: when `PROMETHEUS_MULTIPROC_DIR` names an empty directory in the
environment `vllm serve` starts with, every process (API server and EngineCore, which inherits the
variable) writes its metric values to mmap files there, and vLLM's `/metrics` handler
(`get_prometheus_registry()`) collects all files of that directory. Nothing else is needed: no
extra flag, no plugin. Without the variable the series still exist inside the EngineCore process
(visible to an in-process `prometheus_client.generate_latest()`), but not on the API server's
`/metrics`. `prepare_server_env()` sets the variable up; `fairway serve` calls it.

Hot path: the scheduler updates a plain `FairwayStats` dataclass (integer adds); `FairwayMetrics`
drains it into the Prometheus objects once per step, only when vLLM's `log_stats` is on.

Tenants. Only when the `tenants` option lists any (`TenantTable.enabled`), three more series carry a
`tenant` label whose values are exactly `TenantTable.labels()` (`default`, the listed names,
`other` for any unlisted name a request sends: bounded by the configuration):
`fairway:tenant_prefill_tokens_total`, `fairway:tenant_waiting_requests` and
`fairway:tenant_time_to_first_token_seconds`. Their collectors are created on first use
(`tenant_collectors`), so a server without tenants exposes no tenant series at all, not even
their HELP lines. A request's label is looked up once and cached by request id while it lives
(`TenantLabels`).

Queued work and trust. `fairway:queued_uncached_tokens` (every server) is the node's remaining
prompt work after prefix hits at the end of each step (`StepPrepass.queued_uncached_tokens`),
the load signal a prefix-aware router lacks. The trust gate's counters
(`fairway:untrusted_tenant_claims_total{tenant}`, `fairway:untrusted_priority_claims_total`,
`fairway.vllm.identity`) exist only where the gate acts (`FairwayMetrics.enable_trust`); the
first, by tenant, only with tenants listed, among the tenant series.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter as _Tally
from collections.abc import Callable, Collection, Container, Mapping, Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from fairway.tenants import OTHER_LABEL, TenantTable

#: The environment variable that switches prometheus_client to multiprocess mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LABELS = ("model_name", "engine", "policy")
#: Lanes of `fairway:requests_placed_total`: Fairway's two lanes, or "single" for one-lane policies.
LANES = ("fast", "fair", "single")
#: Lanes of `fairway:lane_prefill_tokens_total` (policies that plan steps only).
PLAN_LANES = ("fast", "fair")
#: The label of the per-tenant series (values: `TenantTable.labels()`).
TENANT_LABEL = "tenant"
_PREPASS_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)


def prepare_server_env(
    env: Mapping[str, str] | None = None, *, multiproc_dir: str | None = None
) -> dict[str, str]:
    """Return a copy of `env` (default: os.environ) in which `fairway:` metrics reach `/metrics`.

    Sets `PROMETHEUS_MULTIPROC_DIR` to a fresh empty directory unless it is already set (then the
    caller owns it and must empty it between runs, as vLLM's warning says). Must be in the
    environment `vllm serve` is started with: prometheus_client fixes its mode at import time.

    Args:
        env: the environment to extend (not modified).
        multiproc_dir: directory to use instead of a new temporary one (created if missing).

    Returns:
        The new environment mapping.
    """
    result = dict(os.environ if env is None else env)
    if not result.get(MULTIPROC_ENV):
        if multiproc_dir is None:
            multiproc_dir = tempfile.mkdtemp(prefix="fairway-prometheus-")
        os.makedirs(multiproc_dir, exist_ok=True)
        result[MULTIPROC_ENV] = multiproc_dir
    return result


@dataclass(slots=True)
class FairwayStats:
    """Counters of the ordering since the last `take()`; cheap to update every step."""

    steps_ordered: int = 0
    policy_fallbacks: int = 0
    placed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LANES, 0))
    oversized_rejected: int = 0
    protected_blocks: int = 0
    #: Pre-pass durations of the steps since the last take() (seconds).
    prepass_s: list[float] = field(default_factory=list)
    #: Running sum and count of pre-pass durations (kept by `add`; samples are not kept).
    prepass_total_s: float = 0.0
    prepass_count: int = 0
    #: Largest / smallest uncached work (tokens) in the queue at the last ordered step.
    queue_work_max_tokens: int | None = None
    queue_work_min_tokens: int | None = None
    #: Prefill tokens vLLM scheduled per lane (`fairway`: by the lane that placed each request).
    lane_prefill_tokens: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(PLAN_LANES, 0)
    )
    #: Age in seconds of the oldest waiting request at the last step (0: none waited).
    oldest_waiting_age_s: float | None = None
    #: Prefill tokens vLLM scheduled per tenant label (empty unless tenants are configured).
    tenant_prefill_tokens: dict[str, int] = field(default_factory=dict)
    #: Requests in vLLM's waiting queue per tenant label after the last step (None: not counted;
    #: counted only with tenants configured and the metrics on).
    tenant_waiting: dict[str, int] | None = None
    #: Offload-tier hit tokens in the waiting queue, and requests the connector defers, at the
    #: last ordered step (None: no tier probed).
    tier_waiting_tokens: int | None = None
    tier_deferred: int | None = None
    #: Tier-hit tokens (the probe's) of the requests vLLM admitted.
    tier_admitted_tokens: int = 0
    #: Prompt tokens the waiting and running requests still had to compute after their prefix
    #: hits at the end of the last step (None: not measured; `StepPrepass.queued_uncached_tokens`).
    queued_uncached_tokens: int | None = None
    #: Tenants clients named that the trust gate ignored, per tenant label; requests whose
    #: priority it raised to the floor (`fairway.vllm.identity`).
    untrusted_tenant_claims: dict[str, int] = field(default_factory=dict)
    untrusted_priority_claims: int = 0

    def take(self) -> FairwayStats:
        """Return the counts so far and reset this object (get-and-reset, as vLLM's stats)."""
        taken = FairwayStats(**{name: getattr(self, name) for name in _STATS_FIELDS})
        self.placed = dict.fromkeys(LANES, 0)  # `taken` keeps the old containers
        self.lane_prefill_tokens = dict.fromkeys(PLAN_LANES, 0)
        self.tenant_prefill_tokens = dict.fromkeys(taken.tenant_prefill_tokens, 0)
        self.untrusted_tenant_claims = dict.fromkeys(taken.untrusted_tenant_claims, 0)
        self.prepass_s = []
        self.reset()
        return taken

    def reset(self) -> None:
        """Zero the counts since the last take, in place (every step: no new objects)."""
        for name in _COUNTS:
            setattr(self, name, 0)
        for name in _TALLIES:
            tally = getattr(self, name)
            for key in tally:
                tally[key] = 0
        for name in _LATEST:
            setattr(self, name, None)
        self.prepass_s.clear()

    def add(self, other: FairwayStats) -> None:
        """Accumulate `other` into this object (running totals for tests and the replay): counts
        and tallies add up, the latest values are the last ones set."""
        for name in _COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in _TALLIES:
            tally = getattr(self, name)
            for key, n in getattr(other, name).items():
                tally[key] = tally.get(key, 0) + n
        for name in _LATEST:
            value = getattr(other, name)
            if value is not None:
                setattr(self, name, value)
        self.prepass_total_s += other.prepass_total_s + sum(other.prepass_s)
        self.prepass_count += other.prepass_count + len(other.prepass_s)


#: `FairwayStats` fields by how a step's value joins the totals: counts add up, tallies (dicts of
#: counts) add up key by key, the latest values (None: not measured in the step) replace.
_COUNTS = (
    "steps_ordered", "policy_fallbacks", "oversized_rejected", "protected_blocks",
    "tier_admitted_tokens", "untrusted_priority_claims",
)
_TALLIES = ("placed", "lane_prefill_tokens", "tenant_prefill_tokens", "untrusted_tenant_claims")
_LATEST = (
    "oldest_waiting_age_s", "queue_work_max_tokens", "queue_work_min_tokens", "tenant_waiting",
    "tier_waiting_tokens", "tier_deferred", "queued_uncached_tokens",
)
_STATS_FIELDS = tuple(f.name for f in fields(FairwayStats))
_collectors: dict[str, Any] | None = None


def collectors() -> dict[str, Any]:
    """Process-wide metric objects (created once; a scheduler adds its own label values)."""
    global _collectors
    if _collectors is None:
        _collectors = {
            "steps": Counter(
                "fairway:steps_ordered",
                "Scheduling steps whose waiting queue Fairway ordered.",
                LABELS,
            ),
            "placed": Counter(
                "fairway:requests_placed",
                "Waiting requests admitted by vLLM from Fairway's order, by the lane that "
                "placed them (fast/fair for Fairway, single for one-lane policies).",
                (*LABELS, "lane"),
            ),
            "fallbacks": Counter(
                "fairway:policy_fallbacks",
                "Steps that kept vLLM's order because building the queue view, probing or the "
                "policy failed (or the policy returned no permutation).",
                LABELS,
            ),
            "oversized": Counter(
                "fairway:oversized_requests",
                "Requests finished with an error because they cannot fit in an empty KV cache.",
                LABELS,
            ),
            "protected": Counter(
                "fairway:protected_blocks",
                "Free cached KV blocks moved to the MRU end by soft eviction protection.",
                LABELS,
            ),
            "prepass": Histogram(
                "fairway:prepass_seconds",
                "Time Fairway adds before vLLM's schedule(): probe, order, re-sort, protect.",
                LABELS,
                buckets=_PREPASS_BUCKETS,
            ),
            "lane_tokens": Counter(
                "fairway:lane_prefill_tokens",
                "Prefill tokens vLLM scheduled per lane of Fairway's merge (fairway): by the "
                "lane that placed each request in the step.",
                (*LABELS, "lane"),
            ),
            "oldest_age": Gauge(
                "fairway:oldest_waiting_age_seconds",
                "Age in seconds of the oldest request in vLLM's waiting queue at the last step "
                "(0 when none waits).",
                LABELS,
                multiprocess_mode="mostrecent",
            ),
            "work_max": Gauge(
                "fairway:queue_work_max_tokens",
                "Largest uncached work (tokens) of a waiting request at the last ordered step.",
                LABELS,
                multiprocess_mode="mostrecent",
            ),
            "work_min": Gauge(
                "fairway:queue_work_min_tokens",
                "Smallest uncached work (tokens) of a waiting request at the last ordered step.",
                LABELS,
                multiprocess_mode="mostrecent",
            ),
            "tier_waiting": Gauge(
                "fairway:tier_waiting_hit_tokens",
                "Tokens of the waiting requests' prompts held in vLLM's CPU offload tier beyond "
                "their GPU hits, at the last ordered step (only with an offload tier).",
                LABELS,
                multiprocess_mode="mostrecent",
            ),
            "tier_deferred": Gauge(
                "fairway:tier_deferred_requests",
                "Waiting requests whose offload-tier blocks are in flight at the last ordered "
                "step: vLLM's connector skips them, Fairway orders them last.",
                LABELS,
                multiprocess_mode="mostrecent",
            ),
            "tier_admitted": Counter(
                "fairway:tier_admitted_hit_tokens",
                "Offload-tier hit tokens (Fairway's probe) of the requests vLLM admitted: "
                "loaded from host memory instead of computed.",
                LABELS,
            ),
            "queued_uncached": Gauge(
                "fairway:queued_uncached_tokens",
                "Prompt tokens the waiting and running requests still have to compute after "
                "their prefix-cache hits, at the end of the last step: the node's queued work.",
                LABELS,
                multiprocess_mode="mostrecent",
            ),
            "untrusted_priorities": Counter(
                "fairway:untrusted_priority_claims",
                "Requests whose priority was below their floor (option priority_floor, or the "
                "trusted source's): served at the floor.",
                LABELS,
            ),
        }
    return _collectors


class FairwayMetrics:
    """The Prometheus series of one scheduler (one label set), fed from `FairwayStats`."""

    def __init__(self, model_name: str, engine: str, policy: str) -> None:
        series = collectors()
        labels = (model_name, engine, policy)
        self.labels = dict(zip(LABELS, labels, strict=True))
        #: The series each `FairwayStats` field feeds: counters by count, counters by tally key,
        #: gauges by latest value (the offload tier's join them in `enable_tier`).
        self._counts = {
            name: series[key].labels(*labels)
            for name, key in (("steps_ordered", "steps"), ("policy_fallbacks", "fallbacks"),
                              ("oversized_rejected", "oversized"),
                              ("protected_blocks", "protected"))
        }
        self._tallies = {
            "placed": {lane: series["placed"].labels(*labels, lane) for lane in LANES},
            "lane_prefill_tokens": {
                lane: series["lane_tokens"].labels(*labels, lane) for lane in PLAN_LANES
            },
        }
        self._latest = {
            name: series[key].labels(*labels)
            for name, key in (("oldest_waiting_age_s", "oldest_age"),
                              ("queue_work_max_tokens", "work_max"),
                              ("queue_work_min_tokens", "work_min"),
                              ("queued_uncached_tokens", "queued_uncached"))
        }
        self._prepass = series["prepass"].labels(*labels)
        # Create every counter at 0 so that a scrape shows them before the first request.
        for counter in (*self._counts.values(), *self._tallies["placed"].values(),
                        *self._tallies["lane_prefill_tokens"].values()):
            counter.inc(0)
        #: The per-tenant series (None: no tenants configured; see `enable_tenants`).
        self.tenants: TenantMetrics | None = None

    def enable_tier(self) -> None:
        """Create the offload-tier series (a scheduler with a tier it can read)."""
        if "tier_admitted_tokens" not in self._counts:
            series = collectors()
            labels = tuple(self.labels.values())
            self._latest["tier_waiting_tokens"] = series["tier_waiting"].labels(*labels)
            self._latest["tier_deferred"] = series["tier_deferred"].labels(*labels)
            self._counts["tier_admitted_tokens"] = series["tier_admitted"].labels(*labels)
            self._counts["tier_admitted_tokens"].inc(0)

    def enable_trust(self, tenants: Sequence[str] | None, priorities: bool) -> None:
        """Create the trust gate's counters at 0: per tenant label (`tenants`, None: no tenant
        claims are judged, or no tenants are listed) and of raised priorities."""
        series = collectors()
        labels = tuple(self.labels.values())
        if tenants is not None and "untrusted_tenant_claims" not in self._tallies:
            self._tallies["untrusted_tenant_claims"] = {
                t: tenant_collectors()["untrusted"].labels(*labels, t) for t in tenants
            }
            for counter in self._tallies["untrusted_tenant_claims"].values():
                counter.inc(0)
        if priorities and "untrusted_priority_claims" not in self._counts:
            counter = self._counts["untrusted_priority_claims"] = (
                series["untrusted_priorities"].labels(*labels)
            )
            counter.inc(0)

    def enable_tenants(self, table: TenantTable) -> TenantMetrics | None:
        """Create the per-tenant series of `table`'s labels (nothing when it lists no tenant)."""
        if table.enabled and self.tenants is None:
            self.tenants = TenantMetrics(self.labels, table.labels())
        return self.tenants

    def record(self, stats: FairwayStats) -> None:
        """Add one drained `FairwayStats` to the series."""
        for name, counter in self._counts.items():
            n = getattr(stats, name)
            if n:
                counter.inc(n)
        for name, counters in self._tallies.items():
            for key, n in getattr(stats, name).items():
                if n:
                    counters[key].inc(n)
        for name, gauge in self._latest.items():
            value = getattr(stats, name)
            if value is not None:
                gauge.set(value)
        for seconds in stats.prepass_s:
            self._prepass.observe(seconds)
        if self.tenants is not None:
            self.tenants.record(stats.tenant_prefill_tokens, stats.tenant_waiting)


# --- queue time and TTFT by cache hit/miss and lane -----------------------------------------------

#: A request is a cache "hit" when its cached prefix at admission is at least this share of its
#: prompt (the same definition as the reports').
HIT_SHARE = 0.5
#: Lane label of a request vLLM admitted outside Fairway's order (a fallback step, a preempted
#: request kept first, an oversized one).
NO_LANE = "none"
#: Seconds; the values of vLLM's own TTFT histogram (`vllm:time_to_first_token_seconds`), so the
#: two can be read side by side with the same resolution.
LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)

_latency_collectors: dict[str, Histogram] | None = None


def cache_label(cached_tokens: int, prompt_tokens: int) -> str:
    """`hit` when the cached prefix at admission is >= HIT_SHARE of the prompt, else `miss`."""
    return "hit" if cached_tokens >= HIT_SHARE * prompt_tokens and prompt_tokens > 0 else "miss"


def latency_collectors() -> dict[str, Histogram]:
    """The hit/miss histograms (separate from `collectors` so either can change alone)."""
    global _latency_collectors
    if _latency_collectors is None:
        _latency_collectors = {
            "queue": Histogram(
                "fairway:queue_time_seconds",
                "Seconds from arrival to admission (first scheduled), from the scheduler, by "
                "cache (hit: cached prefix at admission >= half the prompt) and by the lane "
                "that placed the request (none: admitted outside Fairway's order).",
                (*LABELS, "cache", "lane"),
                buckets=LATENCY_BUCKETS,
            ),
            "ttft": Histogram(
                "fairway:ttft_seconds",
                "Seconds from arrival to the step whose output carries the first token, from "
                "the scheduler (no detokenizing or network), by cache (hit: cached prefix at "
                "admission >= half the prompt).",
                (*LABELS, "cache"),
                buckets=LATENCY_BUCKETS,
            ),
        }
    return _latency_collectors


class LatencyMetrics:
    """`fairway:queue_time_seconds` and `fairway:ttft_seconds` of one scheduler (one label set)."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        collectors = latency_collectors()
        values = tuple(labels[name] for name in LABELS)
        self._queue = {
            (cache, lane): collectors["queue"].labels(*values, cache, lane)
            for cache in ("hit", "miss")
            for lane in (*LANES, NO_LANE)
        }
        self._ttft = {cache: collectors["ttft"].labels(*values, cache) for cache in ("hit", "miss")}

    def observe_queue(self, cache: str, lane: str, seconds: float) -> None:
        """One admission: its queue time."""
        self._queue[cache, lane if lane in LANES else NO_LANE].observe(max(seconds, 0.0))

    def observe_ttft(self, cache: str, seconds: float) -> None:
        """One first token: its time from arrival."""
        self._ttft[cache].observe(max(seconds, 0.0))


# --- per tenant (only with the `tenants` option) -------------------------------------------------

_tenant_collectors: dict[str, Any] | None = None


def tenant_collectors() -> dict[str, Any]:
    """The per-tenant series (created on first use: only a scheduler with tenants calls it, so a
    one-tenant server's registry holds none of them)."""
    global _tenant_collectors
    if _tenant_collectors is None:
        _tenant_collectors = {
            "prefill": Counter(
                "fairway:tenant_prefill_tokens",
                "Prompt tokens vLLM scheduled for each tenant's requests (tenant: a name listed "
                "in option tenants, default without one, other for an unlisted name).",
                (*LABELS, TENANT_LABEL),
            ),
            "waiting": Gauge(
                "fairway:tenant_waiting_requests",
                "Requests of each tenant in vLLM's waiting queue after the last step.",
                (*LABELS, TENANT_LABEL),
                multiprocess_mode="mostrecent",
            ),
            "ttft": Histogram(
                "fairway:tenant_time_to_first_token_seconds",
                "Seconds from arrival to the step whose output carries the first token (the "
                "step that finished the prefill), from the scheduler, by tenant.",
                (*LABELS, TENANT_LABEL),
                buckets=LATENCY_BUCKETS,
            ),
            "untrusted": Counter(
                "fairway:untrusted_tenant_claims",
                "Requests that named a tenant in vllm_xargs without a trusted source "
                "(tenant_source api-key or header): served as the default tenant, or their "
                "caller's (tenant: the label of the name they claimed).",
                (*LABELS, TENANT_LABEL),
            ),
        }
    return _tenant_collectors


class TenantMetrics:
    """The per-tenant series of one scheduler: one child per label of `tenants`, created at 0."""

    def __init__(self, labels: Mapping[str, str], tenants: Sequence[str]) -> None:
        series = tenant_collectors()
        values = tuple(labels[name] for name in LABELS)
        self.tenants = tuple(tenants)
        self._prefill = {t: series["prefill"].labels(*values, t) for t in self.tenants}
        self._waiting = {t: series["waiting"].labels(*values, t) for t in self.tenants}
        self._ttft = {t: series["ttft"].labels(*values, t) for t in self.tenants}
        for counter in self._prefill.values():
            counter.inc(0)
        for gauge in self._waiting.values():
            gauge.set(0)

    def record(self, prefill: Mapping[str, int], waiting: Mapping[str, int] | None) -> None:
        """One drained step: prefill tokens per label; the waiting counts when counted."""
        for tenant, n in prefill.items():
            if n:
                self._prefill.get(tenant, self._prefill[OTHER_LABEL]).inc(n)
        if waiting is not None:
            for tenant, gauge in self._waiting.items():
                gauge.set(waiting.get(tenant, 0))

    def observe_ttft(self, tenant: str, seconds: float) -> None:
        """One first token of a request of `tenant` (its label): its time from arrival."""
        self._ttft.get(tenant, self._ttft[OTHER_LABEL]).observe(max(seconds, 0.0))


_request_id = attrgetter("request_id")


class TenantLabels:
    """Request id -> tenant label (`TenantTable.label_of` of what the request names), computed
    once per request and cached while it lives; `prune` keeps the cache within about twice the
    live requests.

    Args:
        table: the configured tenants.
        tenant_of: `request -> the tenant name it carries` (`internals.request_tenant`).
    """

    def __init__(self, table: TenantTable, tenant_of: Callable[[Any], object]) -> None:
        self.table = table
        self.labels = table.labels()
        self._tenant_of = tenant_of
        self._label_of = table.label_of
        self.cache: dict[str, str] = {}

    def of(self, request: Any) -> str:
        """The label of `request` (vLLM's `Request`, by its `request_id`)."""
        request_id = request.request_id
        label = self.cache.get(request_id)
        if label is None:
            label = self.cache[request_id] = self._label_of(self._tenant_of(request))
        return label

    def count(self, requests: Collection[Any]) -> dict[str, int]:
        """Requests per label (every label present, 0 when none); C-level loops over the cached
        ones (the waiting queue, every step), a second pass only when some are not cached yet."""
        counts = dict.fromkeys(self.labels, 0)
        cache = self.cache
        missing = 0
        for label, n in _Tally(map(cache.get, map(_request_id, requests))).items():
            if label is None:
                missing = n
            else:
                counts[label] += n
        if missing:
            for request in requests:
                if request.request_id not in cache:
                    counts[self.of(request)] += 1
        return counts

    def prune(self, live: Container[str], num_live: int) -> None:
        """Forget the ids not in `live` once the cache holds more than 2 x `num_live` + 64."""
        if len(self.cache) > 2 * num_live + 64:
            self.cache = {rid: label for rid, label in self.cache.items() if rid in live}
