"""Self-calibration (option `self_calibrate`, off by default): learn T(L) from measured step times.

A profile table measured once goes stale when the engine's settings, the model or the machine
change; the engine's own steps measure the same costs all the time. The core
(`StepTimeCalibrator`) is engine-agnostic numpy and imports no vLLM, so the unit tests run
without it; `SchedulerCalibration` reads vLLM's `SchedulerOutput` by attribute (fields tagged
below) and is what the scheduler mixin calls. Logging goes through the `fairway` logger, to which
the plugin attaches vLLM's handlers (`vllm.logger` is not imported, for the same reason).

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

import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairway.profile import PrefillProfile

logger = logging.getLogger(__name__)

#: Feature scales: with tokens in thousands and pairs in millions the normal matrix stays
#: well-conditioned for prompts from 1 to 10^6 tokens.
_TOKEN_SCALE = 1e3
_PAIR_SCALE = 1e6
#: Lengths of the published `fairway:calibrated_prefill_seconds` series (those <= max_model_len).
GAUGE_LENGTHS = (512, 2048, 8192, 32768)
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


@dataclass(frozen=True, slots=True)
class StepCostModel:
    """Fitted coefficients of the step cost model (see the module docstring)."""

    overhead_s: float
    per_token_s: float
    per_pair_s: float

    def step_s(self, tokens: float, pairs: float) -> float:
        """Predicted seconds of a step computing `tokens` tokens with `pairs` attention pairs."""
        return self.overhead_s + self.per_token_s * tokens + self.per_pair_s * pairs

    def prefill_s(self, prompt_tokens: float, chunk_tokens: int) -> float:
        """T(L): an idle prefill of `prompt_tokens`, in steps of at most `chunk_tokens`."""
        steps = max(1, math.ceil(prompt_tokens / chunk_tokens))
        pairs = prompt_tokens * (prompt_tokens + 1) / 2
        return steps * self.overhead_s + self.per_token_s * prompt_tokens + self.per_pair_s * pairs


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
        self._model: StepCostModel | None = None
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

    def model(self) -> StepCostModel | None:
        """The current coefficients, or None while the fit is not usable."""
        if not self._solved:
            self._model = self._solve()
            self._solved = True
        return self._model

    def _solve(self) -> StepCostModel | None:
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
        model = StepCostModel(
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
        return PrefillProfile(points, meta)


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


# --- vLLM adapter ---------------------------------------------------------------------------------


def step_chunks(scheduler_output: Any) -> list[tuple[int, int]]:
    """(new_tokens, computed_before) per request of a vLLM `SchedulerOutput` (read-only).

    `num_computed_tokens` in the output is the value before this step: vLLM builds the request
    data before it advances the counters (`_update_after_schedule`).
    """
    scheduled: Mapping[str, int] = scheduler_output.num_scheduled_tokens  # vLLM internal
    chunks = [
        (scheduled.get(req.req_id, 0), req.num_computed_tokens)  # vLLM internal: NewRequestData
        for req in scheduler_output.scheduled_new_reqs
    ]
    cached = scheduler_output.scheduled_cached_reqs  # vLLM internal: CachedRequestData
    chunks += [
        (scheduled.get(req_id, 0), computed)
        for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=False)
    ]
    return [(n, p) for n, p in chunks if n > 0]


_gauge: Any = None


def _calibrated_gauge() -> Any:
    """The process-wide `fairway:calibrated_prefill_seconds` gauge (created on first use)."""
    global _gauge
    if _gauge is None:
        from prometheus_client import Gauge

        _gauge = Gauge(
            "fairway:calibrated_prefill_seconds",
            "Self-calibrated idle prefill time T(L) of a prompt of prompt_tokens tokens, from "
            "the engine's own step times (option self_calibrate).",
            ("model_name", "engine", "policy", "prompt_tokens"),
            multiprocess_mode="mostrecent",
        )
    return _gauge


class SchedulerCalibration:
    """The scheduler's side: times steps, feeds the calibrator, swaps the policy's profile.

    Step time: the model runs step N from when it was scheduled, but not before step N-1's
    output arrived (one device, steps in sequence), until step N's output arrives::

        step_s(N) = t_update(N) - max(t_schedule(N), t_update(N-1))

    with t_schedule at the end of `schedule()` and t_update at the entry of
    `update_from_output()`. Synchronous engine: the execute-model time. Async scheduling (step
    N+1 scheduled while N runs): the time between consecutive outputs while the engine is busy.
    """

    def __init__(
        self,
        calibrator: StepTimeCalibrator,
        *,
        max_model_len: int,
        policy: Any = None,
        labels: Mapping[str, str] | None = None,
        clock: Any = time.perf_counter,
    ) -> None:
        """Args:
        calibrator: the fit.
        max_model_len: longest prompt of the snapshot tables and gauge lengths.
        policy: an object with a `profile` attribute (FairwayPolicy) that gets each snapshot;
            None: only publish.
        labels: model_name, engine and policy labels of the gauge; None: no gauge (no
            `log_stats`).
        clock: seconds, monotonic.
        """
        self.calibrator = calibrator
        self.max_model_len = max_model_len
        self.policy = policy if hasattr(policy, "profile") else None
        self.profile: PrefillProfile | None = None
        self._clock = clock
        self._scheduled_at: dict[int, float] = {}
        self._last_update: float = -math.inf
        self._since_refresh = 0
        self._gauges = None
        if labels is not None:
            lengths = [n for n in GAUGE_LENGTHS if n <= max_model_len] or [max_model_len]
            gauge = _calibrated_gauge()
            self._gauges = {
                n: gauge.labels(labels["model_name"], labels["engine"], labels["policy"], str(n))
                for n in lengths
            }

    def on_schedule(self, scheduler_output: Any) -> None:
        """Call at the end of `schedule()`."""
        if len(self._scheduled_at) > 64:  # outputs never answered (aborted engine): forget
            self._scheduled_at.clear()
        self._scheduled_at[id(scheduler_output)] = self._clock()

    def on_update(self, scheduler_output: Any) -> None:
        """Call at the entry of `update_from_output()`, before vLLM processes the output."""
        now = self._clock()
        scheduled_at = self._scheduled_at.pop(id(scheduler_output), None)
        previous, self._last_update = self._last_update, now
        if scheduled_at is None or not scheduler_output.total_num_scheduled_tokens:
            return
        self.observe_step(scheduler_output, now - max(scheduled_at, previous))

    def observe_step(self, scheduler_output: Any, step_seconds: float) -> None:
        """Feed one step (its scheduler output and measured seconds); refresh now and then."""
        self.calibrator.observe(step_chunks(scheduler_output), step_seconds)
        self._since_refresh += 1
        if self._since_refresh >= self.calibrator.settings.refresh_steps:
            self.refresh()

    def refresh(self) -> PrefillProfile | None:
        """Snapshot the fit: give it to the policy and the gauge (when usable)."""
        self._since_refresh = 0
        profile = self.calibrator.profile(self.max_model_len)
        if profile is None:
            return None
        first = self.profile is None
        self.profile = profile
        if self.policy is not None:
            self.policy.profile = profile  # read by FairwayPolicy._patience at the next step
        if self._gauges is not None:
            for n, series in self._gauges.items():
                series.set(profile.prefill_s(n))
        if first:
            model = self.calibrator.model()
            logger.info(
                "Fairway self-calibration is in use after %d steps: step_s = %.4g + %.4g*tokens "
                "+ %.4g*pairs; T(2048) = %.4g s.",
                self.calibrator.num_used, model.overhead_s, model.per_token_s,
                model.per_pair_s, profile.prefill_s(2048),
            )
        return profile


def for_scheduler(scheduler: Any) -> SchedulerCalibration | None:
    """The calibration of a Fairway scheduler, or None unless its `self_calibrate` option is on.

    Reads `fairway_options`, `fairway_policy`, `fairway_metrics` and vLLM's `vllm_config`.
    """
    options = scheduler.fairway_options
    if not getattr(options, "self_calibrate", False):
        return None
    config = scheduler.vllm_config  # vLLM internal: Scheduler.vllm_config
    metrics = getattr(scheduler, "fairway_metrics", None)
    calibrator = StepTimeCalibrator(int(config.scheduler_config.max_num_batched_tokens))
    return SchedulerCalibration(
        calibrator,
        max_model_len=int(config.model_config.max_model_len),
        policy=scheduler.fairway_policy,
        labels=None if metrics is None else dict(metrics.labels),
    )
