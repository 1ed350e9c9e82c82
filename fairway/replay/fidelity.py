"""Fidelity statistics: the live runs of one trace against its virtual replay, per client,
policy and phase, and the live engine steps against the replay's step-time model.

`benchmarks/fidelity.py` runs the replays (servers, clients, the virtual clock); this module turns
their results and the servers' step logs into the rows of fidelity.json and the tables of
fidelity.md.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from fairway.replay import report
from fairway.replay.results import ReplayResult


@dataclasses.dataclass(frozen=True)
class Spread:
    """One statistic over the live runs: their median, min and max (None: no TTFT at all)."""

    median: float | None
    lo: float | None
    hi: float | None

    @classmethod
    def of(cls, values: list[float | None]) -> Spread:
        import numpy as np

        got = [v for v in values if v is not None]
        if not got:
            return cls(None, None, None)
        return cls(float(np.median(got)), min(got), max(got))


def comparison(
    runs: dict[tuple[str, str], list[ReplayResult]], virtual: list[ReplayResult]
) -> tuple[str, list[dict]]:
    """Per client x policy x phase: virtual, live median of runs [min-max], virtual / live."""
    rows = []
    lines = [
        "| client | policy | phase | n | runs | failed | virtual median | live median [min-max] "
        "| v/l | virtual p90 | live p90 [min-max] | v/l | virtual p99 | live p99 [min-max] | v/l |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    s_virt = report.summarize(virtual)
    for (client, policy), results in runs.items():
        t = results[0].trace_name
        per_run = [report.summarize([r]) for r in results]
        for phase in s_virt.phases[t]:
            v = s_virt.row(t, policy, phase)
            stats = [s.row(t, policy, phase) for s in per_run]
            if v is None or any(a is None for a in stats):
                continue
            med = Spread.of([a.median_s for a in stats])  # type: ignore[union-attr]
            p90 = Spread.of([a.p90_s for a in stats])  # type: ignore[union-attr]
            p99 = Spread.of([a.p99_s for a in stats])  # type: ignore[union-attr]
            failed = sum(a.n_errors for a in stats)  # type: ignore[union-attr]
            row = {
                "client": client, "policy": policy, "phase": phase, "n": v.n,
                "runs": len(results), "live_errors": failed,
                "virtual_median_s": v.median_s, "live_median_s": med.median,
                "live_median_min_s": med.lo, "live_median_max_s": med.hi,
                "virtual_p90_s": v.p90_s, "live_p90_s": p90.median,
                "live_p90_min_s": p90.lo, "live_p90_max_s": p90.hi,
                "virtual_p99_s": v.p99_s, "live_p99_s": p99.median,
                "live_p99_min_s": p99.lo, "live_p99_max_s": p99.hi,
                "live_medians_s": [a.median_s for a in stats],  # type: ignore[union-attr]
                "live_p99s_s": [a.p99_s for a in stats],  # type: ignore[union-attr]
            }
            rows.append(row)
            lines.append(
                f"| {client} | {policy} | {phase} | {v.n} | {len(results)} | {failed} | "
                f"{_f(v.median_s)} | {_spread(med)} | {_ratio(v.median_s, med.median)} | "
                f"{_f(v.p90_s)} | {_spread(p90)} | {_ratio(v.p90_s, p90.median)} | "
                f"{_f(v.p99_s)} | {_spread(p99)} | {_ratio(v.p99_s, p99.median)} |"
            )
    return "\n".join(lines) + "\n", rows


#: Virtual values closer than this (relative) are a tie: the live order of a tie is not checked.
RANK_TIE = 0.05


def ranking(rows: list[dict]) -> str:
    """Per client, phase and statistic: the policies ranked virtual and live, and whether every
    pair the replay separates (by more than RANK_TIE) is in the same order live."""
    lines = ["| client | phase | statistic | virtual ranking | live ranking | pairs in the same "
             "order |", "|---|---|---|---|---|---|"]
    keys = sorted({(r["client"], r["phase"]) for r in rows}, key=lambda k: (k[0], k[1] != "all"))
    for client, phase in keys:
        group = [r for r in rows if r["client"] == client and r["phase"] == phase]
        if len(group) < 2:
            continue
        for stat in ("median", "p99"):
            v = {r["policy"]: r[f"virtual_{stat}_s"] or float("inf") for r in group}
            live = {r["policy"]: r[f"live_{stat}_s"] or float("inf") for r in group}
            same = total = 0
            for a in v:
                for b in v:
                    if a < b and abs(v[a] - v[b]) > RANK_TIE * max(v[a], v[b]):
                        total += 1
                        same += (v[a] < v[b]) == (live[a] < live[b])
            lines.append(f"| {client} | {phase} | {stat} | {_ranked(v)} | {_ranked(live)} | "
                         f"{same} of {total} |")
    return "\n".join(lines) + "\n"


def _ranked(values: dict[str, float]) -> str:
    return " < ".join(f"{p} ({values[p]:.2f})" for p in sorted(values, key=values.__getitem__))


def step_model_check(path: Path, profile: Any) -> dict[str, Any] | None:
    """Live engine steps (a step log) against the replay's step-time model.

    Per step: measured seconds vs the replay's step-time model (`step_time.for_profile`) of its
    spans; the residual
    (measured - model) is fitted as r0 + r1 * k over the steps' request counts k, the term a
    per-request cost would add. Prefill steps only (a decode token is priced like a prompt
    token by the model; the fidelity traces have max_tokens 1, so decodes are rare).
    """
    import numpy as np

    from fairway.profiling.calibration import read_step_log
    from fairway.profiling.step_time import for_profile

    if not path.exists():
        return None
    model = for_profile(profile)
    measured, predicted, counts, context = [], [], [], []
    for logged, seconds in read_step_log(path):
        chunks = [(n, b) for n, b in logged if n > 1]
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
            float(m[np.array(context) > 0].sum() / p[np.array(context) > 0].sum())
            if any(c > 0 for c in context) else None
        ),
    }


#: Phases with fewer requests are shown but not counted in `agreement` (the issue's rule).
MIN_PHASE_REQUESTS = 30
#: |virtual / live - 1| within this counts as agreement.
AGREEMENT = 0.15


def agreement(idle: list[dict], fitted: list[dict]) -> str:
    """Idle table vs the model fitted to live steps, per client x policy x phase with
    `MIN_PHASE_REQUESTS`+ requests: live median of the runs [range] and virtual / live of both;
    then how many medians and p99s each gets within `AGREEMENT` and inside the live range."""
    by_key = {(r["client"], r["policy"], r["phase"]): r for r in fitted}
    lines = ["| client | policy | phase | n | live median, s [min-max of runs] | v/l idle table | "
             "v/l fitted | live p99, s [min-max] | v/l idle table | v/l fitted |",
             "|---|---|---|---:|---|---:|---:|---|---:|---:|"]
    within = {"idle": 0, "fitted": 0}
    inside = {"idle": 0, "fitted": 0}
    total = 0
    for r in idle:
        g = by_key.get((r["client"], r["policy"], r["phase"]))
        if g is None or r["n"] < MIN_PHASE_REQUESTS or r.get("virtual_model"):
            continue
        cells = []
        for stat in ("median", "p99"):
            live, lo, hi = (r[f"live_{stat}_s"], r[f"live_{stat}_min_s"],
                            r[f"live_{stat}_max_s"])
            total += 1
            ratios = []
            for label, row in (("idle", r), ("fitted", g)):
                v = row[f"virtual_{stat}_s"]
                within[label] += abs(v / live - 1) <= AGREEMENT
                inside[label] += lo <= v <= hi
                ratios.append(f"{v / live:.2f}")
            cells.append(f"{live:.2f} [{lo:.2f}-{hi:.2f}] | {' | '.join(ratios)}")
        lines.append(f"| {r['client']} | {r['policy']} | {r['phase']} | {r['n']} | "
                     f"{' | '.join(cells)} |")
    lines.append("")
    lines.append(
        f"Within {AGREEMENT:.0%} of the live value: idle table {within['idle']} of {total}, "
        f"fitted {within['fitted']} of {total}; inside the live range: idle table "
        f"{inside['idle']}, fitted {inside['fitted']} of {total}."
    )
    return "\n".join(lines) + "\n"


def step_shapes(paths: list[Path], profile: Any, min_steps: int = 5) -> str:
    """Single-request steps of the step logs grouped by shape (new tokens, to 100 below 2,048;
    tokens before, to 2,048): median measured seconds against the replay's model."""
    import numpy as np

    from fairway.profiling.calibration import read_step_log
    from fairway.profiling.step_time import for_profile

    model = for_profile(profile)
    groups: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for path in paths:
        if not path.exists():
            continue
        for logged, seconds in read_step_log(path):
            chunks = [(n, b) for n, b in logged if n > 1]
            if len(chunks) != 1:
                continue
            n, before = chunks[0]
            key = (n if n >= 2048 else round(n, -2), before // 2048 * 2048)
            groups.setdefault(key, []).append((seconds, model.step_time_s([(before, before + n)])))
    lines = ["| new tokens | tokens before (from; 2,048 wide) | steps | live median ms | model "
             "median ms |",
             "|---:|---:|---:|---:|---:|"]
    for (n, before), pairs in sorted(groups.items()):
        if len(pairs) < min_steps:
            continue
        live, priced = np.median(np.array(pairs), axis=0)
        lines.append(f"| {n} | {before} | {len(pairs)} | {1e3 * live:.0f} | {1e3 * priced:.0f} |")
    return "\n".join(lines) + "\n"


def step_table(steps: dict[str, Any]) -> str:
    """The step-model check per policy as Markdown."""
    lines = ["| policy | steps | measured / model (sum) | median step ratio | residual per step "
             "ms | per request ms | ratio k=1 | ratio k>=4 | ratio with cached context |",
             "|---|---|---|---|---|---|---|---|---|"]
    for policy, c in steps.items():
        if c is None:
            lines.append(f"| {policy} | — | | | | | | | |")
            continue
        fit = c["residual_fit_s"]
        lines.append(
            f"| {policy} | {c['steps']} | {c['measured_over_model']:.2f} | "
            f"{c['median_step_ratio']:.2f} | {1e3 * fit['per_step']:.1f} | "
            f"{1e3 * fit['per_request']:.1f} | {_opt(c['ratio_steps_k_1'])} | "
            f"{_opt(c['ratio_steps_k_ge_4'])} | {_opt(c['ratio_steps_with_context'])} |"
        )
    return "\n".join(lines) + "\n"


def _opt(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def _spread(s: Spread) -> str:
    if s.median is None:
        return "—"
    return f"{s.median:.3f} [{s.lo:.3f}-{s.hi:.3f}]"


def _f(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or not b else f"{a / b:.2f}"
