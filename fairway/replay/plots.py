"""The report's figures: TTFT over time with the phases shaded, and per-phase TTFT CDFs.

matplotlib is imported inside the plotting functions: importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fairway.replay.results import ReplayResult
from fairway.replay.summary import ALL

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
