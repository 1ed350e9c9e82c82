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

from fairway.errors import FairwayError

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

Samples = dict[str, list[tuple[dict[str, str], float]]]


class InspectError(FairwayError):
    """The server's /metrics cannot be read (not running, wrong URL, not Prometheus text)."""


def metrics_url(url: str) -> str:
    """`.../metrics` from a base URL given with or without `/v1` or `/metrics`."""
    url = url.rstrip("/")
    if url.endswith("/metrics"):
        return url
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return f"{url}/metrics"


def fetch_metrics(url: str, timeout_s: float = 10.0) -> str:
    """GET the Prometheus text at `url` (with the project's one HTTP client, `fairway.client`).

    Raises:
        InspectError: no answer, or an answer other than 200.
    """
    import aiohttp

    from fairway import client

    hint = "is the server running? (`fairway serve MODEL` or `vllm serve MODEL`) Check the URL"
    try:
        return client.fetch_text(url, timeout_s)
    except client.HTTPStatusError as exc:
        raise InspectError(f"GET {url} answered HTTP {exc.status}; {hint}") from None
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        raise InspectError(f"cannot read {url}: {client.describe(exc)}; {hint}") from None


def parse(text: str) -> Samples:
    """Sample name -> [(labels, value)] of a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: Samples = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[sample.name].append((dict(sample.labels), float(sample.value)))
    except ValueError as exc:
        raise InspectError(f"the answer is not Prometheus text: {exc}") from None
    return dict(samples)


def total(samples: Samples, name: str, **match: str) -> float | None:
    """Sum of the samples of `name` whose labels include `match`; None when there is none."""
    values = [v for labels, v in samples.get(name, ()) if _matches(labels, match)]
    return math.fsum(values) if values else None


def _matches(labels: Mapping[str, str], match: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match.items())


def delta(before: Samples, after: Samples, name: str, **match: str) -> float | None:
    """Increase of a counter over the window (a reset counts from 0); None when absent."""
    end = total(after, name, **match)
    if end is None:
        return None
    start = total(before, name, **match) or 0.0
    return end - start if end >= start else end


def bucket_deltas(
    before: Samples, after: Samples, histogram: str, **match: str
) -> list[tuple[float, float]]:
    """[(le, cumulative count)] of the window for `histogram`, summed over other labels."""
    counts: dict[float, float] = defaultdict(float)
    for sign, samples in ((-1.0, before), (1.0, after)):
        for labels, value in samples.get(f"{histogram}_bucket", ()):
            if _matches(labels, match):
                counts[float(labels["le"])] += sign * value
    return sorted((le, max(n, 0.0)) for le, n in counts.items())


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile of a cumulative histogram, linear within the bucket (None: no data)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, cumulative in buckets:
        if cumulative >= rank and cumulative > below:
            if math.isinf(le):
                return lower  # beyond the largest finite bound: that bound, as PromQL does
            return lower + (le - lower) * (rank - below) / (cumulative - below)
        lower, below = le, cumulative
    return lower


def latency(before: Samples, after: Samples, histogram: str, **match: str) -> dict[str, Any]:
    """{"n", "median_s", "p99_s"} of a latency histogram over the window."""
    buckets = bucket_deltas(before, after, histogram, **match)
    n = buckets[-1][1] if buckets else 0.0
    return {"n": round(n), "median_s": quantile(buckets, 0.5), "p99_s": quantile(buckets, 0.99)}


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


# --- text -----------------------------------------------------------------------------------------


def render(report: Mapping[str, Any]) -> str:
    """The report as the text `fairway inspect` prints."""
    lines = [f"fairway inspect {report['url']}: {report['window_s']:.0f} s window, "
             f"ended {report['at']}"]
    if report["fairway_series"]:
        lines.append(f"  Fairway       policy {', '.join(report['policy']) or '?'}")
    else:
        lines.append("  Fairway       series absent: this server does not run Fairway's "
                     "scheduler (start it with `fairway serve`); from vLLM's series:")
    req = report["requests"]
    lines.append(f"  Requests      {_n(req['finished'])} finished; waiting {_n(req['waiting_now'])}"
                 f" now, up to {_n(req['waiting_max'])} at a poll")
    cache = report["prefix_cache"]
    rate = "n/a" if cache["hit_rate"] is None else f"{cache['hit_rate']:.1%}"
    lines.append(f"  Prefix cache  hit rate {rate} ({_n(cache['hit_tokens'])} of "
                 f"{_n(cache['queried_tokens'])} prompt tokens)")
    if report["fairway_series"]:
        lines += _render_fairway(report)
    else:
        lines.append(f"  Verdict       {report['verdict']['text']}")
    vllm = report["vllm_latency"]
    lines.append(f"  vLLM TTFT     {_lat(vllm['ttft'])}   (all requests, vLLM's histogram)")
    lines.append(f"  vLLM queue    {_lat(vllm['queue_time'])}")
    lines.append(f"  Note          {report['estimates']}")
    return "\n".join(lines)


def _render_fairway(report: Mapping[str, Any]) -> list[str]:
    spread = report["work_spread"]
    lines = []
    if spread["median"] is None:
        lines.append("  Work spread   n/a (no ordered step between polls)")
    else:
        lines.append(f"  Work spread   {spread['median']:.1f}x median, {spread['p90']:.1f}x p90, "
                     f"{spread['max']:.1f}x max "
                     f"over {spread['samples']} samples (largest {_n(spread['largest_tokens'])}"
                     f", smallest {_n(spread['smallest_tokens'])} uncached tokens)")
    lines.append(f"  Verdict       {report['verdict']['text']}")
    admitted = report["lanes"]["admitted"]
    placed = sum(v or 0 for v in admitted.values())
    split = ", ".join(f"{lane} {_n(n)} ({(n or 0) / placed:.0%})" for lane, n in admitted.items()
                      if n) if placed else "none admitted"
    lines.append(f"  Lanes         {split}")
    tokens = report["lanes"]["prefill_tokens"]
    if tokens:
        lines.append("  Lane tokens   " + ", ".join(f"{k} {_n(v)}" for k, v in tokens.items()))
    for cache in ("hit", "miss"):
        row = report["by_cache"][cache]
        lines.append(f"  {cache:<4} TTFT     {_lat(row['ttft'])}")
        lines.append(f"  {cache:<4} queue    {_lat(row['queue_time'])}")
    oldest = report["oldest_waiting_s"]
    lines.append("  Oldest wait   " + ("n/a (series absent)" if oldest is None else
                                      f"{oldest['now']:.2f} s now, {oldest['max']:.2f} s max"))
    lines += _render_tenants(report.get("tenants"), report.get("tenant_counters"))
    lines.append(f"  Fallbacks     {_n(report['fallbacks'])} steps kept vLLM's order")
    pre = report["prepass"]
    if pre["total_s"] is None or not pre["ordered_steps"]:
        lines.append("  Pre-pass      n/a (no ordered step)")
    else:
        share_step = ("" if pre["share_of_step"] is None else
                      f"; {pre['share_of_step']:.2%} of the mean step interval "
                      f"({pre['mean_step_interval_s'] * 1e3:.1f} ms, {_n(pre['engine_steps'])} "
                      "engine steps)")
        lines.append(f"  Pre-pass      {pre['total_s'] * 1e3:.1f} ms in {_n(pre['ordered_steps'])}"
                     f" ordered steps ({pre['per_step_s'] * 1e3:.3f} ms each), "
                     f"{pre['share_of_window']:.3%} of the window{share_step}")
    return lines


def _render_tenants(
    tenants: Mapping[str, Mapping[str, Any]] | None, counters: Mapping[str, Any] | None
) -> list[str]:
    """One line per tenant label (prefill tokens and share, waiting, TTFT), then the trace's
    tenant counters; nothing without tenants."""
    lines = []
    for tenant, row in (tenants or {}).items():
        share = "n/a" if row["share"] is None else f"{row['share']:.1%}"
        lines.append(f"  Tenant {tenant:<6} prefill {_n(row['prefill_tokens'])} tokens ({share})"
                     f"; waiting {_n(row['waiting_now'])} now, up to {_n(row['waiting_max'])}"
                     f"; TTFT {_lat(row['ttft'])}")
    if counters is not None:
        values = ", ".join(f"{t} {_n(v)}" for t, v in counters["counters"].items())
        lines.append(f"  Counters      {values} (uncached tokens / weight, above the lowest; "
                     f"decision trace step {counters['step']})")
    return lines


def _n(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def _lat(row: Mapping[str, Any]) -> str:
    if not row["n"]:
        return "n/a (no request in the window)"
    return (f"median {_s(row['median_s'])}, p99 {_s(row['p99_s'])} (n={row['n']})")


def _s(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


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
    "SERIES", "SPREAD_THRESHOLD", "InspectError", "fetch_metrics", "inspect", "metrics_url",
    "observe", "parse", "quantile", "render", "summarize", "tenant_order",
    "trace_tenant_counters",
]
