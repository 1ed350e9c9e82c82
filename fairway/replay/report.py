"""The replay report: Markdown and JSON of a `Summary`, and `write_report` (tables, JSON, plots).

The statistics are `fairway.replay.summary`'s, the six targets `fairway.replay.targets`', the
figures `fairway.replay.plots`'; this module lays them out. Every report splits TTFT by cache hit
vs miss (`fairway.replay.results.HIT_DEFINITION`) and says "unavailable" where a result has no
cached-token counts. A trace with agent sessions gets a session table (`fairway.replay.
session_view`); a trace without has none, and its JSON has no `sessions` key.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fairway.replay.plots import plot_cdf, plot_ttft_over_time
from fairway.replay.results import HIT_DEFINITION, ReplayResult, safe_name
from fairway.replay.session_view import SESSION_END_TO_END_DEFINITION, SESSION_HIT_DEFINITION
from fairway.replay.summary import STARVATION_FACTOR, Summary, group_by_trace, summarize
from fairway.replay.targets import (
    MEDIAN_REFERENCE,
    P99_REFERENCE,
    TARGET_FACTOR,
    TARGET_PHASES,
    six_targets,
)

logger = logging.getLogger(__name__)

REPORT_FORMAT = "fairway.report/1"


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
    sessions = session_table(summary, trace_name)
    if sessions:
        lines += ["", "### Sessions (end to end in ms)", "", f"{SESSION_END_TO_END_DEFINITION}; "
                  f"{SESSION_HIT_DEFINITION}.", "", *sessions]
    return lines


def session_table(summary: Summary, trace_name: str) -> list[str]:
    """Markdown rows of the session view of one trace; empty when it has no sessions."""
    rows = [
        [s.policy, str(s.n_sessions), str(s.n_complete), _ms(s.median_s), _ms(s.p99_s),
         f"{s.n_hits} / {s.n_turns_with_parent}"
         + (f" (+{s.n_unknown} unknown)" if s.n_unknown else "")]
        for s in summary.sessions if s.trace_name == trace_name
    ]
    if not rows:
        return []
    return _table(["policy", "sessions", "complete", "end-to-end median", "end-to-end p99",
                   "hits at admission / turns with a parent"], rows)


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
    traces: dict[str, dict[str, Any]] = {}
    for t in summary.traces:
        traces[t] = {
            "policies": summary.policies[t],
            "phases": summary.phases[t],
            "rows": [dataclasses.asdict(r) for r in summary.rows if r.trace_name == t],
            "starvation": [dataclasses.asdict(s) for s in summary.starvation if s.trace_name == t],
            "targets": six_targets(summary, t),
            "hit_miss": [dataclasses.asdict(h) for h in summary.hit_miss if h.trace_name == t],
        }
        sessions = [dataclasses.asdict(s) for s in summary.sessions if s.trace_name == t]
        if sessions:  # absent for a trace without sessions
            traces[t]["sessions"] = sessions
    definitions = {"session_end_to_end_definition": SESSION_END_TO_END_DEFINITION,
                   "session_hit_definition": SESSION_HIT_DEFINITION} if summary.sessions else {}
    return {
        "format": REPORT_FORMAT,
        "percentile_method": summary.percentile_method,
        "hit_definition": HIT_DEFINITION,
        "target_phases": list(TARGET_PHASES),
        "target_factor": TARGET_FACTOR,
        "starvation_factor": STARVATION_FACTOR,
        **definitions,
        "traces": traces,
    }


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
    groups = group_by_trace(results)
    for trace_name in summary.traces:
        name = safe_name(trace_name)
        phases = summary.phases[trace_name]
        paths[f"ttft_over_time/{trace_name}"] = plot_ttft_over_time(
            groups[trace_name], phases, out / f"ttft_over_time-{name}.png")
        paths[f"cdf/{trace_name}"] = plot_cdf(groups[trace_name], phases, out / f"cdf-{name}.png")
    logger.info("wrote report for %d traces to %s", len(summary.traces), out)
    return paths
