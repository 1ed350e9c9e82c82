"""Self-calibration's fit: learn a step-time model, and so T(L), from measured engine step times.

A profile table measured once goes stale when the engine's settings, the model or the machine
change; the engine's own steps measure the same costs all the time. `StepTimeCalibrator` is
engine-agnostic numpy (no vLLM); the scheduler's side (timing steps, reading vLLM's
`SchedulerOutput`, the gauge) is `fairway.vllm.calibrate` (option `self_calibrate`).

Cost model of one engine step (one forward pass over the chunks scheduled together)::

    step_s = o + b * sum_r n_r + c * sum_r n_r * (p_r + (n_r + 1) / 2)

n_r: tokens computed for request r in the step; p_r: tokens of r already in the KV cache before
the step (cached prefix plus earlier chunks). o is the fixed cost of a step (scheduling, launch,
sampling), b the cost per token (the weight matmuls), c the cost per (query, key) pair of
causal attention: the i-th token of the chunk attends to p_r + i positions, which sums to the
bracket. A decode token is a chunk with n_r = 1. The fit is least squares with exponential
forgetting (`half_life_steps`) and non-negative coefficients.

The idle prefill time of an L-token prompt, chunked by the step token budget B, is then::

    T(L) = ceil(L / B) * o + b * L + c * L * (L + 1) / 2

It is engine-side time: `fairway profile` measures from an HTTP client and so adds the request's
round trip (its `overhead_s`, typically a few ms) on top.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fairway.errors import ProfileError
from fairway.profiling.fits import CalibratedFit
from fairway.profiling.table import PrefillProfile

#: Feature scales: with tokens in thousands and pairs in millions the normal matrix stays
#: well-conditioned for prompts from 1 to 10^6 tokens.
_TOKEN_SCALE = 1e3
_PAIR_SCALE = 1e6
#: First point of the snapshot table's ladder.
_LADDER_START = 64
_SUBSETS = ((0, 1, 2), (0, 1), (0, 2), (1, 2), (0,), (1,), (2,))


@dataclass(frozen=True)
class CalibrationSettings:
    """Tuning of the calibrator; the defaults suit steps of 5 ms to 5 s.

    Attributes:
        half_life_steps: a step's weight halves after this many later steps (forgetting, so the
            fit follows a changed engine).
        min_steps: steps to see before the fit is used.
        skip_steps: first steps ignored (compilation and cache warm-up make them slow).
        max_condition: the fit is used only while the normalized normal matrix has a condition
            number below this (steps of too similar shapes cannot separate o, b and c).
        outlier_ratio: a step slower than this times the prediction is ignored (a GC pause, a
            compilation), unless `max_outliers_in_a_row` come in a row (then the engine changed).
        max_outliers_in_a_row: see `outlier_ratio`.
        refresh_steps: steps between two snapshots of the table (and gauge updates).
    """

    half_life_steps: float = 2000.0
    min_steps: int = 64
    skip_steps: int = 16
    max_condition: float = 1e7
    outlier_ratio: float = 5.0
    max_outliers_in_a_row: int = 16
    refresh_steps: int = 256

    def __post_init__(self) -> None:
        if not self.half_life_steps > 0:
            raise ValueError(f"half_life_steps must be > 0, got {self.half_life_steps}")
        if self.min_steps < 3 or self.skip_steps < 0 or self.refresh_steps < 1:
            raise ValueError("min_steps must be >= 3, skip_steps >= 0 and refresh_steps >= 1")
        if not self.outlier_ratio > 1 or self.max_outliers_in_a_row < 1:
            raise ValueError("outlier_ratio must be > 1 and max_outliers_in_a_row >= 1")


def chunk_features(chunks: Iterable[tuple[int, int]]) -> tuple[float, float]:
    """(sum of tokens, sum of attention pairs) of a step's (new_tokens, computed_before) chunks."""
    tokens = pairs = 0.0
    for n, p in chunks:
        tokens += n
        pairs += n * (p + (n + 1) / 2)
    return tokens, pairs


class StepTimeCalibrator:
    """Exponentially weighted, non-negative least squares of the step cost model.

    Keeps only the weighted normal equations (3x3 + 3 + 1 numbers): O(1) memory, a few
    microseconds per step. The solve runs when the fit is asked for, not per step.
    """

    def __init__(self, chunk_tokens: int, settings: CalibrationSettings | None = None) -> None:
        """Args:
        chunk_tokens: the engine's step token budget (max_num_batched_tokens), for T(L).
        settings: tuning (defaults: `CalibrationSettings()`).
        """
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
        self.chunk_tokens = chunk_tokens
        self.settings = settings or CalibrationSettings()
        self._decay = 0.5 ** (1.0 / self.settings.half_life_steps)
        self._xtx = np.zeros((3, 3))
        self._xty = np.zeros(3)
        self._yty = 0.0
        self._model: CalibratedFit | None = None
        self._solved = True  # nothing new since the last solve
        self._outliers_in_a_row = 0
        #: Steps offered, steps used in the fit, steps rejected as outliers.
        self.num_seen = 0
        self.num_used = 0
        self.num_outliers = 0

    def observe(self, chunks: Iterable[tuple[int, int]], seconds: float) -> bool:
        """Add one step of (new_tokens, computed_before) chunks; True if it entered the fit."""
        tokens, pairs = chunk_features(chunks)
        return self.observe_totals(tokens, pairs, seconds)

    def observe_totals(self, tokens: float, pairs: float, seconds: float) -> bool:
        """Add one step given its feature sums; True if it entered the fit."""
        self.num_seen += 1
        if tokens <= 0 or not seconds > 0 or not math.isfinite(seconds):
            return False
        if self.num_seen <= self.settings.skip_steps:
            return False
        if self._is_outlier(tokens, pairs, seconds):
            return False
        x = np.array([1.0, tokens / _TOKEN_SCALE, pairs / _PAIR_SCALE])
        d = self._decay
        self._xtx *= d
        self._xtx += np.outer(x, x)
        self._xty *= d
        self._xty += seconds * x
        self._yty = d * self._yty + seconds * seconds
        self.num_used += 1
        self._solved = False
        return True

    def _is_outlier(self, tokens: float, pairs: float, seconds: float) -> bool:
        model = self._model  # the last solved fit: a solve per step would cost ~0.2 ms
        if model is None:
            return False
        if seconds <= self.settings.outlier_ratio * model.step_s(tokens, pairs):
            self._outliers_in_a_row = 0
            return False
        self._outliers_in_a_row += 1
        if self._outliers_in_a_row >= self.settings.max_outliers_in_a_row:
            self._outliers_in_a_row = 0  # not noise: the engine got slower; learn it
            return False
        self.num_outliers += 1
        return True

    @property
    def ready(self) -> bool:
        """Whether the fit is usable: enough steps, shapes varied enough, a positive T."""
        return self.model() is not None

    def model(self) -> CalibratedFit | None:
        """The current coefficients, or None while the fit is not usable."""
        if not self._solved:
            self._model = self._solve()
            self._solved = True
        return self._model

    def _solve(self) -> CalibratedFit | None:
        if self.num_used < self.settings.min_steps:
            return None
        diag = np.sqrt(np.diag(self._xtx))
        if not (diag > 0).all():
            return None
        normalized = self._xtx / np.outer(diag, diag)
        if np.linalg.cond(normalized) > self.settings.max_condition:
            return None
        coef = _nonnegative_least_squares(self._xtx, self._xty, self._yty)
        if coef is None:
            return None
        model = CalibratedFit(
            float(coef[0]), float(coef[1]) / _TOKEN_SCALE, float(coef[2]) / _PAIR_SCALE
        )
        return model if model.prefill_s(1, self.chunk_tokens) > 0 else None

    def prefill_s(self, prompt_tokens: float) -> float | None:
        """Calibrated T(L) in seconds, or None while the fit is not usable."""
        model = self.model()
        return None if model is None else model.prefill_s(prompt_tokens, self.chunk_tokens)

    def profile(self, max_tokens: int, **metadata: Any) -> PrefillProfile | None:
        """A `PrefillProfile` of the current fit up to `max_tokens`, or None while not usable.

        Points: a ladder with ratio 1.5 (64, 96, 128, 192, ...) and `max_tokens` itself, so the
        table's linear interpolation stays within a few % of the quadratic curve.
        """
        model = self.model()
        if model is None:
            return None
        lengths = _ladder(max_tokens)
        points = tuple((n, model.prefill_s(n, self.chunk_tokens)) for n in lengths)
        meta = {
            "source": "self-calibrated",
            "method": "exponentially weighted least squares of engine step times: step_s = o + "
            "b*tokens + c*attention_pairs; T(L) = ceil(L/B)*o + b*L + c*L*(L+1)/2 "
            "(engine-side, no HTTP round trip)",
            "coefficients": {"o_s": model.overhead_s, "b_s_per_token": model.per_token_s,
                             "c_s_per_pair": model.per_pair_s},
            "chunk_tokens": self.chunk_tokens,
            "steps_used": self.num_used,
            "half_life_steps": self.settings.half_life_steps,
            **metadata,
        }
        return PrefillProfile(points, meta, step_time=model.to_spec())


def read_step_log(path: str | Path) -> Iterator[tuple[list[tuple[int, int]], float]]:
    """The steps of a step log (option `step_log`): ([(new tokens, tokens before), ...], seconds).

    Raises:
        ProfileError: the file cannot be read or a line is not a step record.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ProfileError(f"cannot read the step log {path}: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            chunks = [(int(n), int(b)) for n, b in record["chunks"]]
            seconds = float(record["s"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ProfileError(f"{path}:{number}: not a step record ({exc})") from None
        yield chunks, seconds


def fit_step_log(
    paths: Sequence[str | Path], chunk_tokens: int, max_tokens: int
) -> PrefillProfile | None:
    """A table whose step-time model is fitted to step logs (option `step_log`), or None.

    Every logged step counts with the same weight (no forgetting, none skipped): the result is
    the engine's average step cost over the logged traffic, load included, which is what a
    replay of that traffic should price its steps with. Steps slower than 5x the fit are
    dropped as in self-calibration. None when the steps are too few or too alike to separate
    o, b and c.

    Raises:
        ProfileError: a file is missing or a line is not a step record.
    """
    settings = CalibrationSettings(half_life_steps=1e12, skip_steps=0)
    calibrator = StepTimeCalibrator(chunk_tokens, settings)
    for path in paths:
        for chunks, seconds in read_step_log(path):
            calibrator.observe(chunks, seconds)
    return calibrator.profile(
        max_tokens, source="fitted to step logs", step_logs=[str(p) for p in paths],
        method="least squares of the logged engine step times (no forgetting): step_s = o + "
        "b*tokens + c*attention_pairs; T(L) = ceil(L/B)*o + b*L + c*L*(L+1)/2 (engine-side, no "
        "HTTP round trip)",
    )


def _nonnegative_least_squares(
    xtx: np.ndarray, xty: np.ndarray, yty: float
) -> np.ndarray | None:
    """argmin ||y - X beta||^2 over beta >= 0, from the normal equations, by enumeration.

    With three coefficients the exact answer is the best non-negative solution among the 7
    subsets of active terms (the unconstrained one wins whenever it is non-negative).
    """
    best: tuple[float, np.ndarray] | None = None
    ridge = 1e-12 * float(np.trace(xtx))
    for subset in _SUBSETS:
        idx = list(subset)
        a = xtx[np.ix_(idx, idx)] + ridge * np.eye(len(idx))
        try:
            beta = np.linalg.solve(a, xty[idx])
        except np.linalg.LinAlgError:
            continue
        if (beta < 0).any():
            continue
        full = np.zeros(3)
        full[idx] = beta
        sse = yty - 2.0 * float(full @ xty) + float(full @ xtx @ full)
        if best is None or sse < best[0]:
            best = (sse, full)
    return None if best is None else best[1]


def _ladder(max_tokens: int) -> list[int]:
    lengths: list[int] = []
    n = float(min(_LADDER_START, max_tokens))
    while round(n) < max_tokens:
        if not lengths or round(n) > lengths[-1]:
            lengths.append(round(n))
        n *= 1.5
    return [*lengths, max_tokens]
