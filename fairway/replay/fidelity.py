"""Fidelity statistics: a trace's live runs against its virtual replay, and the live engine's
steps against the replay's step-time model.

The virtual replay's numbers are only worth something if it predicts what a live server does with
the same trace and engine settings. `benchmarks/fidelity.py` runs both sides; this module says how
far apart they are:

- `comparison_rows`: per client x policy x phase, the virtual TTFT median / p90 / p99 beside the
  live ones, each as the median [min, max] over the runs (one run's tail is noisy; the range says
  how noisy).
- `rankings`: whether the replay orders the policies as the live server does, which is what a
  policy comparison relies on and what an error common to all policies leaves intact.
- `agreement`: the idle table and a model fitted to the live steps, each against live.
- `step_model_check`, `step_shapes`: the step-time model against each live engine step (the
  servers' step logs), to tell a mispriced step from a scheduling difference.

Rows are dicts, because they go into fidelity.json as they are; `fairway.replay.fidelity_markdown`
renders everything here as fidelity.md's tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from fairway.profiling.calibration import read_step_log
from fairway.profiling.step_time import for_profile
from fairway.profiling.table import PrefillProfile
from fairway.replay.results import ReplayResult
from fairway.replay.summary import ALL, summarize

#: One client x policy x phase of the comparison, JSON-ready (see `comparison_rows`).
ComparisonRow = dict[str, Any]
#: The live runs: {(client, policy): [the result of each run]}.
LiveRuns = dict[tuple[str, str], list[ReplayResult]]
#: The statistics compared, as they are named in a row's keys.
STATISTICS = ("median", "p90", "p99")
#: The statistics `rankings` and `agreement` judge (p90 is shown beside them, not judged).
JUDGED_STATISTICS = ("median", "p99")
#: Virtual values closer than this (relative) are a tie: the live order of a tie is not checked.
RANK_TIE = 0.05
#: Phases with fewer requests are shown but not counted in `agreement`: their p99 is their
#: worst request or close to it.
MIN_PHASE_REQUESTS = 30
#: |virtual / live - 1| within this counts as agreement.
AGREEMENT = 0.15
#: The `virtual_model` of rows whose virtual side is priced by the model fitted to the live steps.
FITTED_TO_LIVE_STEPS = "fitted to live steps"


@dataclass(frozen=True)
class Spread:
    """One statistic over the live runs: their median, min and max (None: no TTFT at all).

    The median of the runs rather than their mean, so that one disturbed run moves it less.
    """

    median: float | None
    lo: float | None
    hi: float | None

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread:
        """The spread of the runs' values; runs without the statistic (None) are left out."""
        got = [v for v in values if v is not None]
        if not got:
            return cls(None, None, None)
        return cls(float(np.median(got)), min(got), max(got))


def comparison_rows(runs: LiveRuns, virtual: Sequence[ReplayResult]) -> list[ComparisonRow]:
    """Per client x policy x phase: the virtual statistics beside the live runs' spread.

    A row has `client`, `policy`, `phase`, `n` (requests), `runs`, `live_errors` (over all
    runs), and for each of `STATISTICS`: `virtual_<stat>_s`, `live_<stat>_s` (median of the
    runs), `live_<stat>_min_s` and `live_<stat>_max_s`; then each run's median and p99
    (`live_medians_s`, `live_p99s_s`). A cell missing on either side has no row.
    """
    virtual_summary = summarize(list(virtual))
    rows = []
    for (client, policy), results in runs.items():
        trace_name = results[0].trace_name
        per_run = [summarize([r]) for r in results]
        for phase in virtual_summary.phases[trace_name]:
            v = virtual_summary.row(trace_name, policy, phase)
            cells = [s.row(trace_name, policy, phase) for s in per_run]
            live = [c for c in cells if c is not None]
            if v is None or len(live) != len(cells):
                continue
            row: ComparisonRow = {
                "client": client, "policy": policy, "phase": phase, "n": v.n,
                "runs": len(results), "live_errors": sum(c.n_errors for c in live),
            }
            for stat in STATISTICS:
                spread = Spread.of(getattr(c, f"{stat}_s") for c in live)
                row[f"virtual_{stat}_s"] = getattr(v, f"{stat}_s")
                row[f"live_{stat}_s"] = spread.median
                row[f"live_{stat}_min_s"] = spread.lo
                row[f"live_{stat}_max_s"] = spread.hi
            row["live_medians_s"] = [c.median_s for c in live]
            row["live_p99s_s"] = [c.p99_s for c in live]
            rows.append(row)
    return rows


def marked_fitted(rows: Iterable[ComparisonRow]) -> list[ComparisonRow]:
    """`rows` marked as priced by the model fitted to the live steps, so that fidelity.json can
    hold them beside the idle table's (which `agreement` reads as the unmarked rows)."""
    return [{**r, "virtual_model": FITTED_TO_LIVE_STEPS} for r in rows]


@dataclass(frozen=True)
class Ranking:
    """The policies of one client and phase, ordered by one statistic, virtual and live.

    Attributes:
        virtual, live: {policy: seconds}; a policy without the statistic counts as infinite.
        separated: policy pairs the replay separates (by more than `RANK_TIE`).
        same_order: of those, the pairs in the same order live.
    """

    client: str
    phase: str
    statistic: str
    virtual: dict[str, float]
    live: dict[str, float]
    same_order: int
    separated: int


def rankings(rows: Sequence[ComparisonRow]) -> list[Ranking]:
    """Per client and phase (the whole trace first) with two or more policies, and per
    `JUDGED_STATISTICS`: the policies ranked virtual and live, and how many of the pairs the
    replay separates keep their order live (a tie in the replay predicts no order)."""
    keys = sorted({(r["client"], r["phase"]) for r in rows},
                  key=lambda k: (k[0], k[1] != ALL))
    found = []
    for client, phase in keys:
        group = [r for r in rows if r["client"] == client and r["phase"] == phase]
        if len(group) < 2:
            continue
        for stat in JUDGED_STATISTICS:
            v = {r["policy"]: r[f"virtual_{stat}_s"] or float("inf") for r in group}
            live = {r["policy"]: r[f"live_{stat}_s"] or float("inf") for r in group}
            same = total = 0
            for a in v:
                for b in v:
                    if a < b and abs(v[a] - v[b]) > RANK_TIE * max(v[a], v[b]):
                        total += 1
                        same += (v[a] < v[b]) == (live[a] < live[b])
            found.append(Ranking(client, phase, stat, v, live, same, total))
    return found


@dataclass(frozen=True)
class Agreement:
    """The idle table's and the fitted model's virtual values against live.

    Attributes:
        pairs: (idle row, fitted row) of each client x policy x phase compared.
        within: per model ("idle", "fitted"), the statistics within `AGREEMENT` of live.
        inside: per model, the statistics inside the live runs' [min, max].
        total: the statistics compared (`JUDGED_STATISTICS` of each pair).
    """

    pairs: list[tuple[ComparisonRow, ComparisonRow]]
    within: dict[str, int]
    inside: dict[str, int]
    total: int


def agreement(idle: Sequence[ComparisonRow], fitted: Sequence[ComparisonRow]) -> Agreement:
    """The idle table's rows against the fitted model's, per client x policy x phase with
    `MIN_PHASE_REQUESTS`+ requests; rows marked fitted (`marked_fitted`) in `idle` are skipped."""
    by_key = {(r["client"], r["policy"], r["phase"]): r for r in fitted}
    pairs = []
    within = {"idle": 0, "fitted": 0}
    inside = {"idle": 0, "fitted": 0}
    total = 0
    for r in idle:
        g = by_key.get((r["client"], r["policy"], r["phase"]))
        if g is None or r["n"] < MIN_PHASE_REQUESTS or r.get("virtual_model"):
            continue
        pairs.append((r, g))
        for stat in JUDGED_STATISTICS:
            live, lo, hi = (r[f"live_{stat}_s"], r[f"live_{stat}_min_s"],
                            r[f"live_{stat}_max_s"])
            total += 1
            for model, row in (("idle", r), ("fitted", g)):
                v = row[f"virtual_{stat}_s"]
                within[model] += abs(v / live - 1) <= AGREEMENT
                inside[model] += lo <= v <= hi
    return Agreement(pairs, within, inside, total)


def _prefill_chunks(logged: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The prompt chunks (new tokens, tokens before) of a logged step; decode tokens are left
    out, since the model prices them like prompt tokens (the fidelity traces have max_tokens 1,
    so decodes are rare)."""
    return [(n, b) for n, b in logged if n > 1]


class ResidualFit(TypedDict):
    """measured - model = per_step + per_request * k over the steps' request counts k."""

    per_step: float
    per_request: float


class StepModelCheck(TypedDict):
    """The step-time model against one server's live steps (fidelity.json's step_model_check)."""

    steps: int
    measured_total_s: float
    model_total_s: float
    measured_over_model: float
    median_step_ratio: float
    residual_fit_s: ResidualFit
    median_requests_per_step: float
    ratio_steps_k_ge_4: float | None
    ratio_steps_k_1: float | None
    ratio_steps_with_context: float | None


def step_model_check(path: Path, profile: PrefillProfile) -> StepModelCheck | None:
    """Live engine steps (a step log) against the replay's step-time model.

    Per step with prompt chunks: measured seconds vs the replay's step-time model
    (`step_time.for_profile`) of its spans; the residual (measured - model) is fitted as
    r0 + r1 * k over the steps' request counts k, the term a per-request cost would add.
    None when the log is missing or has fewer than 3 such steps.
    """
    if not path.exists():
        return None
    model = for_profile(profile)
    measured, predicted, counts, context = [], [], [], []
    for logged, seconds in read_step_log(path):
        chunks = _prefill_chunks(logged)
        if not chunks:
            continue
        measured.append(seconds)
        predicted.append(model.step_time_s([(b, b + n) for n, b in chunks]))
        counts.append(len(chunks))
        context.append(sum(b for _, b in chunks))
    if len(measured) < 3:
        return None
    m, p, k = np.array(measured), np.array(predicted), np.array(counts, dtype=float)
    design = np.column_stack([np.ones_like(k), k])
    (r0, r1), *_ = np.linalg.lstsq(design, m - p, rcond=None)
    many = k >= 4
    cached = np.array(context) > 0
    return {
        "steps": len(m),
        "measured_total_s": float(m.sum()),
        "model_total_s": float(p.sum()),
        "measured_over_model": float(m.sum() / p.sum()),
        "median_step_ratio": float(np.median(m / p)),
        "residual_fit_s": {"per_step": float(r0), "per_request": float(r1)},
        "median_requests_per_step": float(np.median(k)),
        "ratio_steps_k_ge_4": float(m[many].sum() / p[many].sum()) if many.any() else None,
        "ratio_steps_k_1": float(m[k == 1].sum() / p[k == 1].sum()) if (k == 1).any() else None,
        "ratio_steps_with_context": (
            float(m[cached].sum() / p[cached].sum()) if any(c > 0 for c in context) else None
        ),
    }


#: `step_shapes` groups new tokens to the nearest 100 below this, and tokens before in bins
#: this wide.
SHAPE_BIN_TOKENS = 2048


@dataclass(frozen=True)
class StepShape:
    """Single-request live steps of one shape, measured against the model (medians, seconds)."""

    new_tokens: int
    tokens_before: int
    steps: int
    live_median_s: float
    model_median_s: float


def step_shapes(
    paths: Iterable[Path], profile: PrefillProfile, min_steps: int = 5
) -> list[StepShape]:
    """The single-request steps of the step logs (missing ones skipped), grouped by shape: new
    tokens (to 100 below `SHAPE_BIN_TOKENS`) and tokens before (from, `SHAPE_BIN_TOKENS` wide);
    groups of `min_steps`+ steps, sorted by shape. One request per step, so that a difference
    is the model's price of that shape and not how steps are shared."""
    model = for_profile(profile)
    groups: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for path in paths:
        if not path.exists():
            continue
        for logged, seconds in read_step_log(path):
            chunks = _prefill_chunks(logged)
            if len(chunks) != 1:
                continue
            n, before = chunks[0]
            key = (n if n >= SHAPE_BIN_TOKENS else round(n, -2),
                   before // SHAPE_BIN_TOKENS * SHAPE_BIN_TOKENS)
            groups.setdefault(key, []).append((seconds, model.step_time_s([(before, before + n)])))
    shapes = []
    for (n, before), pairs in sorted(groups.items()):
        if len(pairs) < min_steps:
            continue
        live, priced = np.median(np.array(pairs), axis=0)
        shapes.append(StepShape(n, before, len(pairs), float(live), float(priced)))
    return shapes
