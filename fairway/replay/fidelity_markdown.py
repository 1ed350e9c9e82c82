"""fidelity.md's tables, rendered from the statistics of `fairway.replay.fidelity`.

TTFTs in seconds with three decimals (a tiny CPU model's are tens of milliseconds), ratios and
ranked values with two, step times in milliseconds; "—" where a value is missing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fairway.replay.fidelity import (
    AGREEMENT,
    JUDGED_STATISTICS,
    SHAPE_BIN_TOKENS,
    STATISTICS,
    Agreement,
    ComparisonRow,
    Ranking,
    StepModelCheck,
    StepShape,
    agreement,
    rankings,
)


def comparison_table(rows: Sequence[ComparisonRow]) -> str:
    """Per client x policy x phase: virtual, live median of runs [min-max], virtual / live."""
    lines = [
        "| client | policy | phase | n | runs | failed | virtual median | live median [min-max] "
        "| v/l | virtual p90 | live p90 [min-max] | v/l | virtual p99 | live p99 [min-max] | v/l |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["client"], r["policy"], r["phase"], str(r["n"]), str(r["runs"]),
                 str(r["live_errors"])]
        for stat in STATISTICS:
            virtual, live = r[f"virtual_{stat}_s"], r[f"live_{stat}_s"]
            cells += [_seconds(virtual), _spread(r, stat), _ratio(virtual, live)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def ranking_table(found: Sequence[Ranking]) -> str:
    """One line per ranking: the policies in order virtual and live, and the pairs that agree."""
    lines = ["| client | phase | statistic | virtual ranking | live ranking | pairs in the same "
             "order |", "|---|---|---|---|---|---|"]
    for r in found:
        lines.append(f"| {r.client} | {r.phase} | {r.statistic} | {_ranked(r.virtual)} | "
                     f"{_ranked(r.live)} | {r.same_order} of {r.separated} |")
    return "\n".join(lines) + "\n"


def agreement_table(found: Agreement) -> str:
    """Per client x policy x phase compared: live median of the runs [range] and virtual / live
    of both models; then how many medians and p99s each gets within `AGREEMENT` and inside the
    live range."""
    lines = ["| client | policy | phase | n | live median, s [min-max of runs] | v/l idle table | "
             "v/l fitted | live p99, s [min-max] | v/l idle table | v/l fitted |",
             "|---|---|---|---:|---|---:|---:|---|---:|---:|"]
    for idle, fitted in found.pairs:
        cells = []
        for stat in JUDGED_STATISTICS:
            live, lo, hi = (idle[f"live_{stat}_s"], idle[f"live_{stat}_min_s"],
                            idle[f"live_{stat}_max_s"])
            ratios = [f"{row[f'virtual_{stat}_s'] / live:.2f}" for row in (idle, fitted)]
            cells.append(f"{live:.2f} [{lo:.2f}-{hi:.2f}] | {' | '.join(ratios)}")
        lines.append(f"| {idle['client']} | {idle['policy']} | {idle['phase']} | {idle['n']} | "
                     f"{' | '.join(cells)} |")
    within, inside, total = found.within, found.inside, found.total
    lines.append("")
    lines.append(
        f"Within {AGREEMENT:.0%} of the live value: idle table {within['idle']} of {total}, "
        f"fitted {within['fitted']} of {total}; inside the live range: idle table "
        f"{inside['idle']}, fitted {inside['fitted']} of {total}."
    )
    return "\n".join(lines) + "\n"


def step_check_table(checks: Mapping[str, StepModelCheck | None]) -> str:
    """The step-model check per policy ("—": no step log, or too few steps in it)."""
    lines = ["| policy | steps | measured / model (sum) | median step ratio | residual per step "
             "ms | per request ms | ratio k=1 | ratio k>=4 | ratio with cached context |",
             "|---|---|---|---|---|---|---|---|---|"]
    for policy, c in checks.items():
        if c is None:
            lines.append(f"| {policy} | — | | | | | | | |")
            continue
        fit = c["residual_fit_s"]
        lines.append(
            f"| {policy} | {c['steps']} | {c['measured_over_model']:.2f} | "
            f"{c['median_step_ratio']:.2f} | {1e3 * fit['per_step']:.1f} | "
            f"{1e3 * fit['per_request']:.1f} | {_optional_ratio(c['ratio_steps_k_1'])} | "
            f"{_optional_ratio(c['ratio_steps_k_ge_4'])} | "
            f"{_optional_ratio(c['ratio_steps_with_context'])} |"
        )
    return "\n".join(lines) + "\n"


def step_shapes_table(shapes: Sequence[StepShape]) -> str:
    """Single-request step shapes: median measured milliseconds against the model's."""
    lines = [f"| new tokens | tokens before (from; {SHAPE_BIN_TOKENS:,} wide) | steps | live "
             "median ms | model median ms |",
             "|---:|---:|---:|---:|---:|"]
    for s in shapes:
        lines.append(f"| {s.new_tokens} | {s.tokens_before} | {s.steps} | "
                     f"{1e3 * s.live_median_s:.0f} | {1e3 * s.model_median_s:.0f} |")
    return "\n".join(lines) + "\n"


def fitted_section(
    step_time: Mapping[str, Any] | None,
    idle: Sequence[ComparisonRow],
    fitted: Sequence[ComparisonRow],
) -> str:
    """The comparison and ranking again with the virtual side priced by the step-time model
    fitted to the live step logs (`step_time`, its spec), then both models' agreement with live.
    """
    return ("Virtual side priced by the step-time model fitted to the live step logs "
            f"({step_time}):\n\n" + comparison_table(fitted) + "\n"
            + ranking_table(rankings(fitted)) + "\n" + agreement_table(agreement(idle, fitted)))


def _ranked(values: Mapping[str, float]) -> str:
    return " < ".join(f"{p} ({values[p]:.2f})" for p in sorted(values, key=values.__getitem__))


def _optional_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _spread(row: ComparisonRow, stat: str) -> str:
    """The live runs' median [min-max] of `stat`."""
    median = row[f"live_{stat}_s"]
    if median is None:
        return "—"
    return f"{median:.3f} [{row[f'live_{stat}_min_s']:.3f}-{row[f'live_{stat}_max_s']:.3f}]"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or not b else f"{a / b:.2f}"
