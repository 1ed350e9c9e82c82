"""From a measured run to the table: non-decreasing medians, the fitted curve, the metadata.

Why apart from the measuring (`fairway.profiling.profiler`): this half is pure arithmetic on a
`ProfileRun` (no HTTP, no event loop), and a table can be re-derived from a run's samples without
a server. The result is a `fairway.profiling.table.PrefillProfile` plus the least-squares curve
T(L) = a + b*L + c*L^2 (`fairway.profiling.fits.QuadraticFit`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fairway.profiling.fits import QuadraticFit
from fairway.profiling.profiler import ProfileRun
from fairway.profiling.table import PrefillProfile

METHOD = (
    "client-side time from sending a /v1/completions request (token-id prompt, max_tokens=1, "
    "{mode}) to its first response token, one request at a time on an otherwise idle server; "
    "includes the HTTP round trip and request handling (see overhead_s, the same measurement "
    "for a 1-token prompt); prompts are random token ids whose first tokens are unique per "
    "request, so nothing hits the prefix cache; lengths are interleaved round-robin; median of "
    "{repeats} repetitions after {warmup} warm-up round(s)"
)


@dataclass(frozen=True)
class Adjustment:
    """A measured median changed to keep the table non-decreasing."""

    prompt_tokens: int
    measured_s: float
    stored_s: float


@dataclass(frozen=True)
class ProfileOutcome:
    """The table and what was derived on the way (for printing and plotting)."""

    run: ProfileRun
    profile: PrefillProfile
    fit: QuadraticFit
    adjustments: tuple[Adjustment, ...] = field(default_factory=tuple)


def non_decreasing(
    points: Sequence[tuple[int, float]],
) -> tuple[list[tuple[int, float]], list[Adjustment]]:
    """The least-squares non-decreasing fit of the medians (pool adjacent violators).

    Noise can make a longer prompt measure faster than a shorter one, which `PrefillProfile`
    rejects. Pooling each violating run to its mean moves the points as little as possible
    (in squared seconds), unlike a running maximum, which only ever raises them.
    """
    blocks: list[list[float]] = []  # [sum, count] per pooled block
    for _, t in points:
        blocks.append([t, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted = [s / c for s, c in blocks for _ in range(int(c))]
    result = [(n, fitted[i]) for i, (n, _) in enumerate(points)]
    adjusted = [
        Adjustment(n, t, fitted[i]) for i, (n, t) in enumerate(points) if fitted[i] != t
    ]
    return result, adjusted


def fit_quadratic(points: Sequence[tuple[int, float]]) -> QuadraticFit:
    """Least squares of T(L) = a + b*L + c*L^2 on relative error (each row divided by T).

    Relative, because the ladder spans two or three orders of magnitude of time: plain least
    squares would fit the longest prompts and ignore the short ones, where the fixed cost lives.
    Fewer points, fewer terms: two points give a line, one a proportion.
    """
    lengths = np.array([n for n, _ in points], dtype=np.float64)
    seconds = np.array([t for _, t in points], dtype=np.float64)
    degree = min(2, len(points) - 1)
    if degree == 0:
        return QuadraticFit(0.0, float(seconds[0] / lengths[0]), 0.0)
    scale = lengths.max()  # columns of similar size: a well-conditioned solve
    x = lengths / scale
    design = np.stack([x**k for k in range(degree + 1)], axis=1) / seconds[:, None]
    solved, *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
    coef = [float(c) / scale**k for k, c in enumerate(solved)] + [0.0] * (2 - degree)
    return QuadraticFit(coef[0], coef[1], coef[2])


def build_profile(
    run: ProfileRun,
    *,
    hardware: str,
    hardware_detected: bool,
    command: str | None = None,
    extra: dict[str, Any] | None = None,
    step_time: str = "table",
) -> ProfileOutcome:
    """The table (non-decreasing medians) with its metadata, and the fitted curve.

    `step_time`: what the replay prices steps with when given the table: "table" (the points)
    or "quadratic" (the fit, saved in the file's `step_time` entry).

    Raises:
        ProfileError: "quadratic" and a fitted coefficient is negative (it cannot price steps).
    """
    medians = run.medians()
    points, adjustments = non_decreasing(medians)
    fit = fit_quadratic(medians)
    settings = run.settings
    metadata: dict[str, Any] = {
        "source": "measured",
        "hardware": hardware,
        "hardware_detected": hardware_detected,
        "model": run.server.model,
        "vllm_version": run.server.vllm_version,
        "max_model_len": run.server.max_model_len,
        "date": run.date,
        "method": METHOD.format(
            mode="streaming" if settings.stream else "not streaming",
            repeats=settings.repeats, warmup=settings.warmup_rounds,
        ),
        "repetitions": settings.repeats,
        "warmup_rounds": settings.warmup_rounds,
        "overhead_s": round(run.overhead.median_s, 6),
        "fit": fit.describe(),
        "monotone": (
            "medians made non-decreasing by pool-adjacent-violators (least squares); "
            f"{len(adjustments)} point(s) changed, see adjusted"
        ),
        "adjusted": [[a.prompt_tokens, round(a.measured_s, 6), round(a.stored_s, 6)]
                     for a in adjustments],
        "samples_s": {str(s.prompt_tokens): [round(t, 6) for t in s.seconds]
                      for s in (run.overhead, *run.samples)},
        "measurement_wall_s": round(run.wall_s, 1),
        "generated_by": command or "fairway profile",
    }
    metadata.update(extra or {})
    spec = None
    if step_time == QuadraticFit.KIND:
        fit.check_prices_steps()
        spec = fit.to_spec()
    elif step_time != "table":
        raise ValueError(f"step_time must be 'table' or 'quadratic', got {step_time!r}")
    table = PrefillProfile(tuple((n, round(t, 6)) for n, t in points), metadata, spec)
    return ProfileOutcome(run, table, fit, tuple(adjustments))


