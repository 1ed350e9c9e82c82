"""TTFT tables, the six targets, the starvation flag and plots from replay results.

Percentiles are numpy's `percentile(..., method="linear")` (the default, "type 7": linear
interpolation between the two nearest ranks) over the requests that produced a first token.
Errored requests have no TTFT: they are counted in `n_errors`, never silently dropped, and a policy
with errors in a phase fails that phase's targets (its percentiles would flatter it otherwise).

Every report also splits TTFT by cache hit vs miss (`fairway.replay.results.HIT_DEFINITION`):
a cache-greedy order can have a fine overall median while its few misses carry most of the
waiting, which the per-phase rows hide. Results without cached-token counts (a live server that
does not report them) get no split: the report says "unavailable" instead of guessing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from fairway.replay.results import HIT_DEFINITION, ReplayResult, RequestResult, safe_name

logger = logging.getLogger(__name__)

PERCENTILE_METHOD: Final = "linear"
#: The pseudo-phase that holds every request of a trace.
ALL = "all"
#: Phases that carry targets, and the reference policy of each statistic.
TARGET_PHASES = ("calm", "burst", "spike")
MEDIAN_REFERENCE = "lpm"
P99_REFERENCE = "fcfs"
#: A target is met when the policy's value is <= TARGET_FACTOR x the reference's value.
TARGET_FACTOR = 1.1
#: Starved: the worst TTFT exceeds STARVATION_FACTOR x the policy's own p99 (all requests).
STARVATION_FACTOR = 3.0
REPORT_FORMAT = "fairway.report/1"

PASS, FAIL, NA = "pass", "fail", "n/a"


@dataclass(frozen=True, slots=True)
class PhaseStats:
    """TTFT statistics of one policy in one phase of one trace (seconds; None without data)."""

    trace_name: str
    policy: str
    phase: str
    n: int
    n_errors: int
    median_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None


@dataclass(frozen=True, slots=True)
class Starvation:
    """The starvation check of one policy on one trace: `max_s > STARVATION_FACTOR * p99_s`."""

    trace_name: str
    policy: str
    max_s: float | None
    p99_s: float | None
    starved: bool


@dataclass(frozen=True, slots=True)
class HitMissStats:
    """TTFT of one policy's cache hits and misses in one phase of one trace (seconds).

    Attributes:
        available: the result has cached-token counts (else every other field is empty).
        n_hit, n_miss: requests of each class, errored ones included.
        n_unknown: requests whose cached tokens are unknown (never scheduled, or not reported).
        hit_median_s, hit_p99_s, miss_median_s, miss_p99_s, miss_max_s: over requests with a TTFT.
        miss_ttft_share: the misses' share of the summed TTFT of all classified requests with a
            TTFT (SGLang #31954: ~5% of requests, misses, carried ~75% of it under LPM).
    """

    trace_name: str
    policy: str
    phase: str
    available: bool
    n_hit: int = 0
    n_miss: int = 0
    n_unknown: int = 0
    hit_median_s: float | None = None
    hit_p99_s: float | None = None
    miss_median_s: float | None = None
    miss_p99_s: float | None = None
    miss_max_s: float | None = None
    miss_ttft_share: float | None = None


@dataclass(frozen=True)
class Summary:
    """Everything the tables need, in report order.

    Attributes:
        traces: trace names in order of first appearance.
        policies: per trace, policy names in the order the results were given.
        phases: per trace, phase labels by first arrival, then `ALL`.
        rows: one `PhaseStats` per trace x policy x phase, in the order above.
        starvation: one `Starvation` per trace x policy.
        hit_miss: one `HitMissStats` per trace x policy x phase, in the order of `rows`.
    """

    traces: list[str]
    policies: dict[str, list[str]]
    phases: dict[str, list[str]]
    rows: list[PhaseStats]
    starvation: list[Starvation]
    percentile_method: str = PERCENTILE_METHOD
    hit_miss: list[HitMissStats] = dataclasses.field(default_factory=list)

    def row(self, trace_name: str, policy: str, phase: str) -> PhaseStats | None:
        """The stats of one cell, or None when that policy or phase is absent."""
        for r in self.rows:
            if (r.trace_name, r.policy, r.phase) == (trace_name, policy, phase):
                return r
        return None

    def hit_miss_row(self, trace_name: str, policy: str, phase: str) -> HitMissStats | None:
        """The hit / miss split of one cell, or None when that policy or phase is absent."""
        for r in self.hit_miss:
            if (r.trace_name, r.policy, r.phase) == (trace_name, policy, phase):
                return r
        return None


# --- statistics ----------------------------------------------------------------------------------


Stat = float | None


def ttft_stats(ttfts: Sequence[float]) -> tuple[Stat, Stat, Stat, Stat]:
    """(median, p90, p99, max) of `ttfts` with numpy's linear method; all None when empty."""
    if len(ttfts) == 0:
        return None, None, None, None
    values = np.asarray(ttfts, dtype=float)
    median, p90, p99 = np.percentile(values, [50, 90, 99], method=PERCENTILE_METHOD)
    return float(median), float(p90), float(p99), float(values.max())


def _phase_stats(trace_name: str, policy: str, phase: str, reqs: list[RequestResult]) -> PhaseStats:
    ttfts = [t for t in (r.ttft_s for r in reqs) if t is not None]
    median, p90, p99, worst = ttft_stats(ttfts)
    return PhaseStats(trace_name, policy, phase, len(reqs), len(reqs) - len(ttfts),
                      median, p90, p99, worst)


def hit_miss_stats(
    trace_name: str, policy: str, phase: str, reqs: list[RequestResult], available: bool
) -> HitMissStats:
    """Split `reqs` into hits and misses (`RequestResult.hit`) and give each class's TTFT."""
    if not available:
        return HitMissStats(trace_name, policy, phase, False)
    hits = [r for r in reqs if r.hit is True]
    misses = [r for r in reqs if r.hit is False]
    hit_ttfts = [t for t in (r.ttft_s for r in hits) if t is not None]
    miss_ttfts = [t for t in (r.ttft_s for r in misses) if t is not None]
    hit_median, _, hit_p99, _ = ttft_stats(hit_ttfts)
    miss_median, _, miss_p99, miss_max = ttft_stats(miss_ttfts)
    total = sum(hit_ttfts) + sum(miss_ttfts)
    share = sum(miss_ttfts) / total if total > 0 else None
    return HitMissStats(
        trace_name, policy, phase, True, len(hits), len(misses),
        len(reqs) - len(hits) - len(misses), hit_median, hit_p99, miss_median, miss_p99,
        miss_max, share,
    )


def phase_order(results: Iterable[ReplayResult]) -> list[str]:
    """Phase labels sorted by their earliest arrival over all `results` (ties: first seen).

    Requests without a phase appear only under `ALL`, which is not part of this list.
    """
    first: dict[str, tuple[float, int]] = {}
    for result in results:
        for r in result.requests:
            if r.phase is None:
                continue
            if r.phase == ALL:
                raise ValueError(f"phase label {ALL!r} is reserved for the whole trace")
            seen = first.get(r.phase)
            if seen is None:
                first[r.phase] = (r.arrival_s, len(first))
            elif r.arrival_s < seen[0]:
                first[r.phase] = (r.arrival_s, seen[1])
    return sorted(first, key=lambda p: first[p])


def _group(results: Sequence[ReplayResult]) -> dict[str, list[ReplayResult]]:
    """Results by trace (first-appearance order); a trace x policy given twice is ambiguous."""
    by_trace: dict[str, list[ReplayResult]] = {}
    for result in results:
        group = by_trace.setdefault(result.trace_name, [])
        if any(g.policy == result.policy for g in group):
            raise ValueError(
                f"two results for policy {result.policy!r} on trace {result.trace_name!r}; "
                "give each trace x policy once"
            )
        group.append(result)
    return by_trace


def starvation_check(trace_name: str, policy: str, reqs: list[RequestResult]) -> Starvation:
    """Flag a policy whose worst TTFT is far beyond its own tail (one request left behind)."""
    _, _, p99, worst = ttft_stats([t for t in (r.ttft_s for r in reqs) if t is not None])
    starved = p99 is not None and worst is not None and worst > STARVATION_FACTOR * p99
    return Starvation(trace_name, policy, worst, p99, starved)


def summarize(results: list[ReplayResult]) -> Summary:
    """Per trace x policy x phase TTFT statistics and the starvation flags.

    Raises:
        ValueError: a trace x policy pair appears twice, or a phase is labelled `ALL`.
    """
    by_trace = _group(results)
    policies: dict[str, list[str]] = {}
    phases: dict[str, list[str]] = {}
    rows: list[PhaseStats] = []
    starvation: list[Starvation] = []
    hit_miss: list[HitMissStats] = []
    for trace_name, group in by_trace.items():
        policies[trace_name] = [g.policy for g in group]
        phases[trace_name] = [*phase_order(group), ALL]
        for result in group:
            # A result that knows no request's cached tokens has no split (live, not reported).
            available = any(r.cached_tokens is not None for r in result.requests)
            for phase in phases[trace_name]:
                reqs = [r for r in result.requests if phase == ALL or r.phase == phase]
                rows.append(_phase_stats(trace_name, result.policy, phase, reqs))
                hit_miss.append(hit_miss_stats(trace_name, result.policy, phase, reqs, available))
            starvation.append(starvation_check(trace_name, result.policy, result.requests))
    return Summary(list(by_trace), policies, phases, rows, starvation, hit_miss=hit_miss)


# --- the six targets -----------------------------------------------------------------------------


def _target(
    summary: Summary, trace_name: str, policy: str, phase: str, statistic: str, reference: str
) -> dict[str, Any]:
    """One target: the policy's `statistic` in `phase` <= TARGET_FACTOR x the reference's.

    "n/a" (never "pass") when the reference or the phase is missing or has no TTFT; "fail" when the
    policy has errored requests in the phase, since their TTFT is unknown and at least the timeout.
    """
    attr = f"{statistic}_s"
    own = summary.row(trace_name, policy, phase)
    ref = summary.row(trace_name, reference, phase)
    value = getattr(own, attr) if own else None
    ref_value = getattr(ref, attr) if ref else None
    limit = TARGET_FACTOR * ref_value if ref_value is not None else None
    record = {
        "phase": phase, "statistic": statistic, "reference": reference, "value_s": value,
        "reference_s": ref_value, "limit_s": limit, "n_errors": own.n_errors if own else None,
    }
    if own is None or own.n == 0:
        return {**record, "status": NA, "reason": f"no {phase!r} requests for {policy!r}"}
    if ref is None or ref.n == 0:
        return {**record, "status": NA, "reason": f"no {phase!r} requests for {reference!r}"}
    if limit is None:
        return {**record, "status": NA, "reason": f"{reference!r} has no TTFT in {phase!r}"}
    if own.n_errors:
        return {**record, "status": FAIL, "reason": f"{own.n_errors} errored requests"}
    if value is None:
        return {**record, "status": NA, "reason": f"{policy!r} has no TTFT in {phase!r}"}
    status = PASS if value <= limit else FAIL
    return {**record, "status": status, "reason": f"{value:.6g} s vs limit {limit:.6g} s"}


def six_targets(summary: Summary, trace_name: str) -> dict[str, Any]:
    """The six targets of every policy on one trace.

    For each phase in `TARGET_PHASES`: median <= 1.1 x `lpm`'s median, p99 <= 1.1 x `fcfs`'s p99.

    Returns:
        {"trace_name", "factor", "references": {"median": "lpm", "p99": "fcfs"},
         "policies": {policy: {"met": int, "n_a": int, "total": 6,
                               "targets": {"calm.median": {... "status": "pass"|"fail"|"n/a"}}}}}

    Raises:
        ValueError: `trace_name` is not in the summary (the message lists the traces).
    """
    if trace_name not in summary.policies:
        raise ValueError(f"no trace {trace_name!r} in the summary; traces: {summary.traces}")
    checks = (("median", MEDIAN_REFERENCE), ("p99", P99_REFERENCE))
    per_policy: dict[str, Any] = {}
    for policy in summary.policies[trace_name]:
        targets = {
            f"{phase}.{stat}": _target(summary, trace_name, policy, phase, stat, ref)
            for phase in TARGET_PHASES
            for stat, ref in checks
        }
        statuses = [t["status"] for t in targets.values()]
        per_policy[policy] = {
            "met": statuses.count(PASS), "n_a": statuses.count(NA), "total": len(targets),
            "targets": targets,
        }
    return {
        "trace_name": trace_name,
        "factor": TARGET_FACTOR,
        "references": {"median": MEDIAN_REFERENCE, "p99": P99_REFERENCE},
        "policies": per_policy,
    }


# --- Markdown ------------------------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000:.1f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _met_cell(entry: dict[str, Any]) -> str:
    cell = f"{entry['met']}/{entry['total']}"
    return f"{cell} ({entry['n_a']} n/a)" if entry["n_a"] else cell


def _targets_summary_md(summary: Summary) -> list[str]:
    """Policy -> met/6 per trace (one column per trace)."""
    targets = {t: six_targets(summary, t)["policies"] for t in summary.traces}
    policies: list[str] = []
    for trace_name in summary.traces:
        policies += [p for p in summary.policies[trace_name] if p not in policies]
    rows = [
        [p, *(_met_cell(targets[t][p]) if p in targets[t] else "—" for t in summary.traces)]
        for p in policies
    ]
    return _table(["policy", *summary.traces], rows)


def _trace_md(summary: Summary, trace_name: str) -> list[str]:
    stats = [r for r in summary.rows if r.trace_name == trace_name]
    lines = [f"## Trace `{trace_name}`", "", "### TTFT by phase (ms)", ""]
    lines += _table(
        ["policy", "phase", "n", "errors", "median", "p90", "p99", "max"],
        ([r.policy, r.phase, str(r.n), str(r.n_errors), _ms(r.median_s), _ms(r.p90_s),
          _ms(r.p99_s), _ms(r.max_s)] for r in stats),
    )
    targets = six_targets(summary, trace_name)["policies"]
    keys = [f"{phase}.{stat}" for phase in TARGET_PHASES for stat in ("median", "p99")]
    lines += ["", f"### Targets (median <= {TARGET_FACTOR} x {MEDIAN_REFERENCE}, "
              f"p99 <= {TARGET_FACTOR} x {P99_REFERENCE})", ""]
    lines += _table(
        ["policy", *(k.replace(".", " ") for k in keys), "met"],
        ([p, *(t["targets"][k]["status"] for k in keys), _met_cell(t)] for p, t in targets.items()),
    )
    lines += ["", "### TTFT by cache hit / miss (ms)", "", f"{HIT_DEFINITION}.", ""]
    lines += hit_miss_table(summary, trace_name)
    lines += ["", f"### Starvation (worst TTFT > {STARVATION_FACTOR:g} x own p99)", ""]
    lines += _table(
        ["policy", "max", "p99", "starved"],
        ([s.policy, _ms(s.max_s), _ms(s.p99_s), "yes" if s.starved else "no"]
         for s in summary.starvation if s.trace_name == trace_name),
    )
    return lines


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def hit_miss_table(summary: Summary, trace_name: str, phases: Sequence[str] | None = None
                   ) -> list[str]:
    """Markdown rows of the hit / miss split of one trace (all its phases, or `phases`)."""
    rows = []
    for r in summary.hit_miss:
        if r.trace_name != trace_name or (phases is not None and r.phase not in phases):
            continue
        if not r.available:
            rows.append([r.policy, r.phase, "unavailable: the result has no cached-token "
                         "counts", *[""] * 7])
            continue
        unknown = f" (+{r.n_unknown} unknown)" if r.n_unknown else ""
        rows.append([
            r.policy, r.phase, f"{r.n_hit} / {r.n_miss}{unknown}", _ms(r.hit_median_s),
            _ms(r.hit_p99_s), _ms(r.miss_median_s), _ms(r.miss_p99_s), _ms(r.miss_max_s),
            _share(r.miss_ttft_share),
            _share(r.n_miss / (r.n_hit + r.n_miss)) if r.n_hit + r.n_miss else "—",
        ])
    return _table(["policy", "phase", "hits / misses", "hit median", "hit p99", "miss median",
                   "miss p99", "miss max", "misses' share of TTFT", "miss share of requests"],
                  rows)


def to_markdown(summary: Summary) -> str:
    """Markdown: targets summary, then per trace the phase, target and starvation tables."""
    method = summary.percentile_method
    lines = [
        "# Replay report", "",
        f"TTFT percentiles: numpy `percentile(method=\"{method}\")` over requests "
        "that produced a first token; errored requests are counted under `errors`, not in the "
        "percentiles, and fail their phase's targets. Times in ms.", "",
        "## Targets met", "",
    ]
    lines += _targets_summary_md(summary)
    for trace_name in summary.traces:
        lines += ["", *_trace_md(summary, trace_name)]
    return "\n".join(lines) + "\n"


def to_json(summary: Summary) -> dict[str, Any]:
    """Everything in the summary plus the targets, JSON-ready and in report order."""
    traces = {}
    for t in summary.traces:
        traces[t] = {
            "policies": summary.policies[t],
            "phases": summary.phases[t],
            "rows": [dataclasses.asdict(r) for r in summary.rows if r.trace_name == t],
            "starvation": [dataclasses.asdict(s) for s in summary.starvation if s.trace_name == t],
            "targets": six_targets(summary, t),
            "hit_miss": [dataclasses.asdict(h) for h in summary.hit_miss if h.trace_name == t],
        }
    return {
        "format": REPORT_FORMAT,
        "percentile_method": summary.percentile_method,
        "hit_definition": HIT_DEFINITION,
        "target_phases": list(TARGET_PHASES),
        "target_factor": TARGET_FACTOR,
        "starvation_factor": STARVATION_FACTOR,
        "traces": traces,
    }


# --- plots ---------------------------------------------------------------------------------------

#: TTFTs are drawn on a log axis; a zero TTFT (possible on a virtual clock) is drawn here instead.
_LOG_FLOOR_S = 1e-6


def _phase_spans(
    group: Sequence[ReplayResult], phases: Sequence[str]
) -> list[tuple[str, float, float]]:
    """(phase, start, end) of each contiguous run of one phase, for shading.

    Runs, not one span per label: a trace may return to `calm` after its spike. The arrivals of
    the first result are used (all policies replay the same trace; live send times differ by ms).
    """
    spans: list[tuple[str, float, float]] = []
    source = next((g for g in group if any(r.phase in phases for r in g.requests)), None)
    if source is None:
        return spans
    for r in sorted(source.requests, key=lambda r: r.arrival_s):
        if r.phase is None or r.phase not in phases:
            continue
        if spans and spans[-1][0] == r.phase:
            spans[-1] = (r.phase, spans[-1][1], r.arrival_s)
        else:
            spans.append((r.phase, r.arrival_s, r.arrival_s))
    # Close each run where the next starts, so the shading has no gaps between phases.
    return [(p, start, spans[i + 1][1] if i + 1 < len(spans) else end)
            for i, (p, start, end) in enumerate(spans)]


def _shade_phases(ax: Any, spans: list[tuple[str, float, float]]) -> None:
    transform = ax.get_xaxis_transform()  # x in data, y in axes fraction
    for i, (phase, start, end) in enumerate(spans):
        ax.axvspan(start, end, color="0.85" if i % 2 == 0 else "0.93", zorder=0)
        ax.text((start + end) / 2, 1.01, phase, transform=transform, ha="center", va="bottom",
                fontsize=8)


def plot_ttft_over_time(group: Sequence[ReplayResult], phases: Sequence[str], path: Path) -> Path:
    """Scatter of TTFT (log) against arrival, one colour per policy, phases shaded and labelled.

    Errored requests are drawn as crosses along the top edge so failures stay visible.
    """
    from matplotlib.figure import Figure  # lazy: tables do not need matplotlib

    fig = Figure(figsize=(10, 5), layout="tight")
    ax = fig.add_subplot()
    _shade_phases(ax, _phase_spans(group, [p for p in phases if p != ALL]))
    top = ax.get_xaxis_transform()
    for i, result in enumerate(group):
        color = f"C{i % 10}"
        ok = [(r.arrival_s, max(r.ttft_s, _LOG_FLOOR_S)) for r in result.requests
              if r.ttft_s is not None]
        failed = [r.arrival_s for r in result.requests if r.ttft_s is None]
        label = result.policy + (f" ({len(failed)} errors)" if failed else "")
        if ok:
            xs, ys = zip(*ok, strict=True)
            ax.scatter(xs, ys, s=6, alpha=0.6, color=color, label=label, rasterized=True)
        if failed:
            ax.plot(failed, [0.97] * len(failed), "x", color=color, transform=top,
                    label=None if ok else label)
    if any(r.ttft_s is not None for g in group for r in g.requests):
        ax.set_yscale("log")
    ax.set_xlabel("arrival (s)")
    ax.set_ylabel("TTFT (s)")
    ax.legend(loc="upper left", fontsize=8)
    fig.savefig(path, dpi=110)
    return path


def plot_cdf(group: Sequence[ReplayResult], phases: Sequence[str], path: Path) -> Path:
    """One subplot per phase, one TTFT CDF per policy.

    The y value is the fraction of *all* the phase's requests, so a policy with errors ends below 1.
    """
    from matplotlib.figure import Figure

    cols = min(3, len(phases))
    rows = -(-len(phases) // cols)
    fig = Figure(figsize=(4.2 * cols, 3.4 * rows), layout="tight")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, phase in zip(axes, phases, strict=False):
        for i, result in enumerate(group):
            reqs = [r for r in result.requests if phase == ALL or r.phase == phase]
            ttfts = np.sort([max(r.ttft_s, _LOG_FLOOR_S) for r in reqs if r.ttft_s is not None])
            if len(ttfts):
                ys = np.arange(1, len(ttfts) + 1) / len(reqs)
                ax.step(ttfts, ys, where="post", color=f"C{i % 10}", label=result.policy)
        ax.set_title(phase)
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("TTFT (s)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    for ax in axes[len(phases):]:
        ax.set_visible(False)
    fig.savefig(path, dpi=110)
    return path


# --- files ---------------------------------------------------------------------------------------


def write_report(results: list[ReplayResult], out_dir: str | Path) -> dict[str, Path]:
    """Write `report.md`, `report.json` and two PNGs per trace into `out_dir` (created).

    Returns:
        {"markdown": path, "json": path, "ttft_over_time/<trace>": path, "cdf/<trace>": path, ...}
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(results)
    paths = {"markdown": out / "report.md", "json": out / "report.json"}
    paths["markdown"].write_text(to_markdown(summary), encoding="utf-8")
    paths["json"].write_text(
        json.dumps(to_json(summary), indent=1, allow_nan=False) + "\n", encoding="utf-8"
    )
    groups = _group(results)
    for trace_name in summary.traces:
        name = safe_name(trace_name)
        phases = summary.phases[trace_name]
        paths[f"ttft_over_time/{trace_name}"] = plot_ttft_over_time(
            groups[trace_name], phases, out / f"ttft_over_time-{name}.png")
        paths[f"cdf/{trace_name}"] = plot_cdf(groups[trace_name], phases, out / f"cdf-{name}.png")
    logger.info("wrote report for %d traces to %s", len(summary.traces), out)
    return paths
