"""The measured table shown: as text (`fairway profile` prints it) and as a PNG plot.

Why apart: showing is not measuring or deriving, and the plot needs matplotlib, which the vLLM
container image lacks (imported only when a plot is drawn).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fairway.profiling.measured_profile import ProfileOutcome


def format_report(outcome: ProfileOutcome) -> str:
    """The table as text: per length median, spread, stored value, fit and throughput."""
    run, fit = outcome.run, outcome.fit
    stored = dict(outcome.profile.points)
    lines = [
        f"{'tokens':>8} {'median_s':>10} {'min_s':>10} {'max_s':>10} {'table_s':>10} "
        f"{'fit_s':>10} {'tokens/s':>10}"
    ]
    for s in run.samples:
        n = s.prompt_tokens
        lines.append(
            f"{n:>8} {s.median_s:>10.4f} {min(s.seconds):>10.4f} {max(s.seconds):>10.4f} "
            f"{stored[n]:>10.4f} {fit(n):>10.4f} {n / stored[n]:>10.0f}"
        )
    lines.append(f"overhead (1-token prompt, median): {run.overhead.median_s:.4f} s")
    lines.append(f"fit: {fit}")
    for a in outcome.adjustments:
        lines.append(
            f"note: T({a.prompt_tokens}) measured {a.measured_s:.4f} s, stored {a.stored_s:.4f} s "
            "(kept non-decreasing)"
        )
    return "\n".join(lines)


def plot_profile(outcome: ProfileOutcome, path: str | Path) -> Path:
    """A PNG of the samples (median and range), the stored table and the fitted curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run, fit = outcome.run, outcome.fit
    lengths = np.array([s.prompt_tokens for s in run.samples], dtype=np.float64)
    medians = np.array([s.median_s for s in run.samples])
    low = medians - np.array([min(s.seconds) for s in run.samples])
    high = np.array([max(s.seconds) for s in run.samples]) - medians
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.errorbar(lengths, medians, yerr=[low, high], fmt="o", capsize=3,
                label=f"median of {run.settings.repeats} (bars: min-max)")
    ax.plot(*zip(*outcome.profile.points, strict=True), "-", alpha=0.6, label="table")
    grid = np.geomspace(lengths.min(), lengths.max(), 200)
    ax.plot(grid, fit(grid), "--", label=f"fit: {fit}".replace("s/token", "s/tok"))
    ax.axhline(run.overhead.median_s, color="grey", linestyle=":", label="1-token round trip")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens L")
    ax.set_ylabel("idle prefill time T(L) [s]")
    meta = outcome.profile.metadata
    ax.set_title(f"{meta.get('model', run.server.model)}\n{meta.get('hardware', '?')}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
