"""`fairway inspect`: would Fairway help this server's traffic, and is it helping now?

Reads a running server's Prometheus `/metrics` (vLLM's `vllm:` series and, under Fairway's
scheduler, the `fairway:` series) at the start and end of a window, and every `interval_s` in
between (gauges such as the work spread change from step to step), and reports:

* requests finished and the prefix-cache hit rate (`vllm:prefix_cache_hits/queries` deltas);
* the work spread, max/min uncached work in the waiting queue (`fairway:queue_work_max_tokens` /
  `..._min_tokens`, sampled whenever steps were ordered since the last poll), and its verdict from
  the samples' 90th percentile (the load peaks): at `SPREAD_THRESHOLD` x or more ordering matters
  here; below it every sensible order is close to FCFS (FAIRWAY.md, "Metrics: how to read them");
* the lane split (`fairway:requests_placed_total`, and `fairway:lane_prefill_tokens_total` when
  the policy reports it), the oldest waiting request's age, fallbacks, the pre-pass cost;
* TTFT and queue time by cache hit vs miss (`fairway:ttft_seconds`, `fairway:queue_time_seconds`)
  and vLLM's own TTFT and queue time, as median / p99 estimated from the histogram buckets'
  deltas (linear within a bucket, as PromQL's `histogram_quantile`);
* with tenants configured (option `tenants`), per tenant label: the prefill tokens scheduled in
  the window and their share of all tenants' (`fairway:tenant_prefill_tokens_total`), the
  waiting requests now and the most at a poll (`fairway:tenant_waiting_requests`), and TTFT
  median / p99 (`fairway:tenant_time_to_first_token_seconds`); and, given the server's decision
  trace (`--decision-trace PATH`), `fairway`'s tenant counters from its last record carrying them.

Against plain vLLM (no `fairway:` series) it says so and reports what vLLM's series show, with a
heuristic verdict from the queue length and the hit rate. No vLLM import: only HTTP.

The reading of /metrics (fetch, parse, a window's deltas and quantiles) is
`fairway.inspection_scrape`; the report's text, `fairway.inspection_text`.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fairway.inspection_scrape import (
    InspectError,
    Samples,
    delta,
    fetch_metrics,
    latency,
    metrics_url,
    parse,
    total,
)

#: Work spread (max/min uncached tokens in the queue) from which ordering matters.
SPREAD_THRESHOLD = 4.0
#: Plain vLLM: hit rates strictly between these suggest a queue mixing hits and misses.
MIXED_HIT_RATE = (0.1, 0.9)
#: Series names this report reads (one place, so a rename is one edit).
SERIES = {
    "success": "vllm:request_success_total",
    "queries": "vllm:prefix_cache_queries_total",
    "hits": "vllm:prefix_cache_hits_total",
    "waiting": "vllm:num_requests_waiting",
    "running": "vllm:num_requests_running",
    "steps_engine": "vllm:iteration_tokens_total_count",
    "vllm_ttft": "vllm:time_to_first_token_seconds",
    "vllm_queue": "vllm:request_queue_time_seconds",
    "steps": "fairway:steps_ordered_total",
    "placed": "fairway:requests_placed_total",
    "lane_tokens": "fairway:lane_prefill_tokens_total",
    "fallbacks": "fairway:policy_fallbacks_total",
    "prepass": "fairway:prepass_seconds",
    "work_max": "fairway:queue_work_max_tokens",
    "work_min": "fairway:queue_work_min_tokens",
    "oldest": "fairway:oldest_waiting_age_seconds",
    "ttft": "fairway:ttft_seconds",
    "queue": "fairway:queue_time_seconds",
    "tenant_tokens": "fairway:tenant_prefill_tokens_total",
    "tenant_waiting": "fairway:tenant_waiting_requests",
    "tenant_ttft": "fairway:tenant_time_to_first_token_seconds",
}
#: The label of the per-tenant series, and the order its two fixed values are shown in.
TENANT_LABEL = "tenant"
_DEFAULT_TENANT, _OTHER_TENANT = "default", "other"
#: Bytes read from the end of a decision trace to find its last record with tenant counters.
TRACE_TAIL_BYTES = 1 << 20
_ESTIMATE_NOTE = (
    "median / p99 are estimates from histogram bucket deltas (linear within a bucket)"
)


@dataclass
class Poll:
    """Gauges read at one poll during the window."""

    t_s: float
    steps: float | None
    work_max: float | None
    work_min: float | None
    waiting: float | None
    oldest_s: float | None
    #: Waiting requests per tenant label (`fairway:tenant_waiting_requests`; empty: absent).
    tenant_waiting: dict[str, float] = field(default_factory=dict)


@dataclass
class Window:
    """What was read: the first and last scrape and the polls in between."""

    url: str
    window_s: float
    first: Samples
    last: Samples
    polls: list[Poll] = field(default_factory=list)


def _poll(samples: Samples, t_s: float) -> Poll:
    return Poll(
        t_s=t_s,
        steps=total(samples, SERIES["steps"]),
        work_max=_max(samples, SERIES["work_max"]),
        work_min=_min(samples, SERIES["work_min"]),
        waiting=total(samples, SERIES["waiting"]),
        oldest_s=_max(samples, SERIES["oldest"]),
        tenant_waiting=_by_tenant(samples, SERIES["tenant_waiting"]),
    )


def _by_tenant(samples: Samples, name: str) -> dict[str, float]:
    """Sum of `name`'s samples per tenant label (over engines and models)."""
    out: dict[str, float] = defaultdict(float)
    for labels, value in samples.get(name, ()):
        if TENANT_LABEL in labels:
            out[labels[TENANT_LABEL]] += value
    return dict(out)


def tenant_order(tenants: Iterable[str]) -> list[str]:
    """`default` first, the listed tenants by name, `other` last (a stable order to print)."""
    rank = {_DEFAULT_TENANT: 0, _OTHER_TENANT: 2}
    return sorted(set(tenants), key=lambda t: (rank.get(t, 1), t))


def _max(samples: Samples, name: str) -> float | None:
    values = [v for _, v in samples.get(name, ())]
    return max(values) if values else None


def _min(samples: Samples, name: str) -> float | None:
    values = [v for _, v in samples.get(name, ())]
    return min(values) if values else None


def observe(
    url: str,
    window_s: float = 60.0,
    interval_s: float = 2.0,
    *,
    progress: bool = True,
    fetch: Callable[[str], str] = fetch_metrics,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Window:
    """Scrape `url`'s /metrics now, every `interval_s` and after `window_s` seconds.

    Raises:
        InspectError: a scrape fails (the first one: before any waiting).
    """
    if not window_s > 0 or not interval_s > 0:
        raise InspectError(f"--window-s and the interval must be > 0, got {window_s}, {interval_s}")
    target = metrics_url(url)
    first = parse(fetch(target))
    start = clock()
    polls = [_poll(first, 0.0)]
    last = first
    from tqdm import tqdm

    total_s = round(window_s)
    with tqdm(total=total_s, disable=not progress, unit="s", desc="reading /metrics",
              bar_format="{desc}: {bar} {n:.0f}/{total:.0f} s") as bar:
        elapsed = 0.0
        while elapsed < window_s:
            sleep(min(interval_s, window_s - elapsed))
            last = parse(fetch(target))
            elapsed = clock() - start
            polls.append(_poll(last, elapsed))
            bar.n = min(round(elapsed), total_s)
            bar.refresh()
    # the time between the first and the last scrape (not the requested window: polls overrun)
    return Window(url=target, window_s=elapsed, first=first, last=last, polls=polls)


# --- the report -----------------------------------------------------------------------------------


def summarize(window: Window) -> dict[str, Any]:
    """The report as a JSON-ready dict (what `--json` prints)."""
    first, last = window.first, window.last
    fairway = any(name.startswith("fairway:") for name in last)
    queries = delta(first, last, SERIES["queries"])
    hits = delta(first, last, SERIES["hits"])
    waiting = [p.waiting for p in window.polls if p.waiting is not None]
    report: dict[str, Any] = {
        "url": window.url,
        "window_s": round(window.window_s, 3),
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "fairway_series": fairway,
        "policy": sorted({lab["policy"] for lab, _ in last.get(SERIES["steps"], ())
                          if "policy" in lab}),
        "requests": {
            "finished": _int(delta(first, last, SERIES["success"])),
            "waiting_now": _int(waiting[-1]) if waiting else None,
            "waiting_max": _int(max(waiting)) if waiting else None,
        },
        "prefix_cache": {
            "queried_tokens": _int(queries),
            "hit_tokens": _int(hits),
            "hit_rate": hits / queries if queries and hits is not None else None,
        },
        "vllm_latency": {
            "ttft": latency(first, last, SERIES["vllm_ttft"]),
            "queue_time": latency(first, last, SERIES["vllm_queue"]),
        },
        "estimates": _ESTIMATE_NOTE,
    }
    if fairway:
        report.update(_fairway_part(window))
    else:
        report["verdict"] = _plain_vllm_verdict(report)
    return report


def _fairway_part(window: Window) -> dict[str, Any]:
    first, last = window.first, window.last
    spread = _spread(window.polls)
    placed = {lane: _int(delta(first, last, SERIES["placed"], lane=lane))
              for lane in _label_values(last, SERIES["placed"], "lane")}
    lane_tokens = {lane: _int(delta(first, last, SERIES["lane_tokens"], lane=lane))
                   for lane in _label_values(last, SERIES["lane_tokens"], "lane")}
    oldest = [p.oldest_s for p in window.polls if p.oldest_s is not None]
    prepass_s = delta(first, last, f"{SERIES['prepass']}_sum")
    ordered = delta(first, last, f"{SERIES['prepass']}_count")
    engine_steps = delta(first, last, SERIES["steps_engine"])
    per_step = prepass_s / ordered if prepass_s is not None and ordered else None
    interval = window.window_s / engine_steps if engine_steps else None
    return {
        "work_spread": spread,
        "verdict": _spread_verdict(spread),
        "lanes": {
            "admitted": placed,
            "prefill_tokens": lane_tokens or None,
        },
        "by_cache": {
            cache: {
                "ttft": latency(first, last, SERIES["ttft"], cache=cache),
                "queue_time": latency(first, last, SERIES["queue"], cache=cache),
            }
            for cache in ("hit", "miss")
        },
        "oldest_waiting_s": {"now": oldest[-1], "max": max(oldest)} if oldest else None,
        "tenants": _tenants(window),
        "fallbacks": _int(delta(first, last, SERIES["fallbacks"])),
        "prepass": {
            "total_s": prepass_s,
            "ordered_steps": _int(ordered),
            "engine_steps": _int(engine_steps),
            "per_step_s": per_step,
            "share_of_window": prepass_s / window.window_s if prepass_s is not None else None,
            "mean_step_interval_s": interval,
            "share_of_step": per_step / interval if per_step is not None and interval else None,
        },
    }


def _tenants(window: Window) -> dict[str, dict[str, Any]] | None:
    """Per tenant label: prefill tokens in the window and their share of the sum, waiting now
    and the most at a poll, TTFT median / p99; None without the tenant series (no tenants)."""
    first, last = window.first, window.last
    names = [SERIES["tenant_tokens"], SERIES["tenant_waiting"], f"{SERIES['tenant_ttft']}_count"]
    tenants = tenant_order(t for name in names for t in _label_values(last, name, TENANT_LABEL))
    if not tenants:
        return None
    tokens = {t: delta(first, last, SERIES["tenant_tokens"], tenant=t) for t in tenants}
    summed = math.fsum(v for v in tokens.values() if v is not None)
    out: dict[str, dict[str, Any]] = {}
    for t in tenants:
        waiting = [p.tenant_waiting[t] for p in window.polls if t in p.tenant_waiting]
        n = tokens[t]
        out[t] = {
            "prefill_tokens": _int(n),
            "share": n / summed if n is not None and summed > 0 else None,
            "waiting_now": _int(waiting[-1]) if waiting else None,
            "waiting_max": _int(max(waiting)) if waiting else None,
            "ttft": latency(first, last, SERIES["tenant_ttft"], tenant=t),
        }
    return out


def trace_tenant_counters(path: str | Path) -> dict[str, Any] | None:
    """The last record of a decision trace (`decision_trace` option) that carries
    `tenant_counters`: {"step", "time_s", "counters"}; None when none of the file's last
    `TRACE_TAIL_BYTES` does (no tenants, another policy, or only one tenant waited).

    Raises:
        InspectError: the file cannot be read.
    """
    import json

    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TRACE_TAIL_BYTES))
            tail = f.read()
    except OSError as exc:
        reason = exc.strerror or exc
        raise InspectError(f"cannot read the decision trace {path}: {reason}") from None
    lines = tail.decode("utf-8", errors="replace").splitlines()
    if size > TRACE_TAIL_BYTES:
        lines = lines[1:]  # the first line may be cut
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        counters = record.get("tenant_counters") if isinstance(record, dict) else None
        if isinstance(counters, dict) and counters:
            return {"step": record.get("step"), "time_s": record.get("time_s"),
                    "counters": {str(k): counters[k] for k in tenant_order(counters)}}
    return None


def _label_values(samples: Samples, name: str, label: str) -> list[str]:
    return sorted({lab[label] for lab, _ in samples.get(name, ()) if label in lab})


def _spread(polls: list[Poll]) -> dict[str, Any]:
    """max/min work at polls after which the queue was ordered (the gauges were fresh)."""
    ratios, maxima, minima = [], [], []
    for before, now in zip(polls, polls[1:], strict=False):
        fresh = now.steps is not None and before.steps is not None and now.steps > before.steps
        if fresh and now.work_max is not None and now.work_min:
            ratios.append(now.work_max / now.work_min)
            maxima.append(now.work_max)
            minima.append(now.work_min)
    if not ratios:
        return {"samples": 0, "median": None, "p90": None, "max": None, "largest_tokens": None,
                "smallest_tokens": None}
    ratios.sort()
    return {
        "samples": len(ratios),
        "median": ratios[len(ratios) // 2],
        "p90": ratios[math.ceil(0.9 * len(ratios)) - 1],  # nearest rank
        "max": ratios[-1],
        "largest_tokens": _int(max(maxima)),
        "smallest_tokens": _int(min(minima)),
    }


def _spread_verdict(spread: Mapping[str, Any]) -> dict[str, Any]:
    """Judged on the 90th percentile of the samples: the spread during the window's load peaks
    (a queue of one request has a spread of 1x between peaks, whatever the traffic)."""
    peak = spread["p90"]
    if peak is None:
        return {"matters": False, "text": "no queue was ordered in the window: nothing waited, "
                "so the order could not matter (run inspect during load)"}
    matters = peak >= SPREAD_THRESHOLD
    head = "ordering matters here" if matters else "ordering matters little"
    relation = ">=" if matters else "<"
    return {
        "matters": matters,
        "threshold": SPREAD_THRESHOLD,
        "text": f"{head}: the queue's work spread (max/min uncached tokens) was {peak:.1f}x at "
        f"the 90th percentile of {spread['samples']} ordered moments (median "
        f"{spread['median']:.1f}x, max {spread['max']:.1f}x), {relation} {SPREAD_THRESHOLD:g}x",
    }


def _plain_vllm_verdict(report: Mapping[str, Any]) -> dict[str, Any]:
    waiting_max = report["requests"]["waiting_max"] or 0
    rate = report["prefix_cache"]["hit_rate"]
    low, high = MIXED_HIT_RATE
    if waiting_max < 2:
        return {"matters": False, "text": f"ordering matters little: at most {waiting_max} "
                "request(s) waited at a poll, so there was no queue to order"}
    if rate is not None and low < rate < high:
        return {"matters": True, "text": f"ordering may matter here (heuristic): up to "
                f"{waiting_max} requests waited and {rate:.0%} of prompt tokens hit the cache, so "
                "hits and misses mix in the queue; the work spread needs Fairway's series "
                "(`fairway serve`)"}
    rate_text = "unknown" if rate is None else f"{rate:.0%}"
    return {"matters": False, "text": f"ordering likely matters little (heuristic): the hit "
            f"rate is {rate_text}, so queued requests are alike in cached work"}


def _int(value: float | None) -> int | None:
    return None if value is None else int(round(value))


def inspect(
    url: str, window_s: float = 60.0, *, decision_trace: str | Path | None = None, **kwargs: Any
) -> dict[str, Any]:
    """Observe `url` for `window_s` seconds and return the report (see `summarize`); with
    `decision_trace`, also its last tenant counters (`tenant_counters`, None when absent)."""
    report = summarize(observe(url, window_s, **kwargs))
    if decision_trace is not None:
        report["tenant_counters"] = trace_tenant_counters(decision_trace)
    return report


__all__ = [
    "SERIES", "SPREAD_THRESHOLD", "inspect", "observe", "summarize", "tenant_order",
    "trace_tenant_counters",
]
