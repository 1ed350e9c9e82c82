"""The `fairway inspect` report as the text it prints (`render`), from `summarize`'s dict.

Why apart from `fairway.inspection`: the report is data (also printed as JSON with `--json`);
this is only its layout, read by nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
