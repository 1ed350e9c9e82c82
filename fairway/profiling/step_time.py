"""Step-time models: the time of one engine step from the prompt spans it computes.

One interface (`StepTimeModel.step_time_s(spans)`, as Vidur's execution-time predictors), three
implementations, so the virtual replay can price its steps with any of them:

- `TableStepTime`: from a prefill-time table T(L) (measured or estimated; the default);
- `QuadraticFit`: the profiler's least-squares curve T(L) = a + b*L + c*L^2;
- `CalibratedFit`: the self-calibrated fit of engine step times (o + b*tokens + c*pairs).

A table file names the model it was saved with (`"step_time": {"kind": ...}`, see
`fairway.profiling.table`); `for_profile` builds it. The two fits, and the reading of that entry,
are in `fairway.profiling.fits` (below the table, which checks its entry there).

All three have one shape. A step of the engine computes, for each scheduled request, the prompt
positions [start, end) (a whole prompt, a chunk of one, or the part after a cached prefix). Its
time is::

    step_s = o + sum over requests of (C(end) - C(start)),      C(L) = T(L) - o

with o the fixed per-step time (kernel launches, sampling, scheduling: what an idle engine pays
even for a one-token prompt) and C the *work curve*: the time of computing positions 0..L-1 beyond
the fixed part. C(0) = 0; below the table's first point C is the straight line from the origin to
(L_0, T(L_0) - o) (the table says nothing there, and a linear curve charges a token its average
cost); between points it follows the table; above the last point, the table's last slope.

Why a difference of C and not C(end - start): attention makes a position dearer the more tokens
come before it (C is superlinear), so the 300 new tokens after a 6,000-token cached prefix cost
more than a 300-token prompt, while the cached 6,000 cost nothing. One whole prompt on an idle
engine (one chunk from 0 to L, L within a step) costs o + C(L) = T(L): the table is reproduced
exactly where it was measured. A prompt split into k chunks costs k * o + C(L): chunking pays the
fixed part once per step, as on a real engine.

The fits use the same formula with a polynomial work curve: `QuadraticFit` o = a and
C(L) = b*L + c*L^2; `CalibratedFit` C(L) = b*L + c*L*(L+1)/2, whose difference C(end) - C(start)
is b*n + c*n*(start + (n + 1)/2) for n = end - start: per token plus per attention pair.

Decode tokens (max_tokens > 1, positions >= L) are charged by the same curve. That is a
prefill-node model; decode on a GPU is memory-bound and is not what the tables measure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from fairway.errors import ProfileError
from fairway.profiling.fits import CalibratedFit, QuadraticFit, Span, fit_from_spec, span_array
from fairway.profiling.table import PrefillProfile

__all__ = [
    "CalibratedFit",
    "QuadraticFit",
    "Span",
    "StepTimeModel",
    "TableStepTime",
    "for_profile",
    "profile_overhead_s",
]


@runtime_checkable
class StepTimeModel(Protocol):
    """Prices an engine step; what the virtual replay needs of a cost model."""

    def step_time_s(self, spans: Sequence[Span]) -> float:
        """Seconds of a step computing positions [start, end) of each scheduled request.

        An empty step (nothing scheduled) costs 0: the engine does not run one.

        Raises:
            ValueError: a span with start > end or a negative position.
        """
        ...

    def describe(self) -> dict[str, Any]:
        """JSON-able description (the replay copies it into its result's settings)."""
        ...

# --- the table ----------------------------------------------------------------------------------


def profile_overhead_s(profile: PrefillProfile) -> float | None:
    """The per-step fixed time a table declares, or None.

    Analytic tables (`scripts/estimate_profile.py`) record the constant they were built with in
    `metadata.constants.overhead_s`. Measured tables (`fairway profile`) record `metadata.
    overhead_s`, the client-side time of a 1-token prompt: one step's fixed time plus the HTTP
    round trip, the closest measurement of o there is (it slightly overstates it).
    """
    metadata = profile.metadata if isinstance(profile.metadata, Mapping) else {}
    constants = metadata.get("constants")
    for source in (constants if isinstance(constants, Mapping) else {}, metadata):
        value = source.get("overhead_s")
        if not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value):
            return float(value)
    return None


@dataclass(frozen=True)
class TableStepTime:
    """Step time from a table T(L): o + sum(C(end) - C(start)), C(L) = T(L) - o (module doc).

    Attributes:
        profile: the table T(L).
        step_overhead_s: o, seconds every non-empty step costs; None: the table's
            `metadata.constants.overhead_s` if present, else 0. Must be in [0, T(L_0)].
    """

    profile: PrefillProfile
    step_overhead_s: float | None = None
    # The work curve as a piecewise-linear table, starting at (0, 0); built in __post_init__.
    _lengths: np.ndarray = field(init=False, repr=False, compare=False)
    _work: np.ndarray = field(init=False, repr=False, compare=False)
    _tail_slope: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        overhead = self.step_overhead_s
        first_n, first_t = self.profile.points[0]
        if overhead is None:
            # From the table's metadata: a measured 1-token time can exceed the first point
            # by noise; it cannot be more than the shortest prefill, so it is capped there.
            overhead = min(max(profile_overhead_s(self.profile) or 0.0, 0.0), first_t)
        if not (math.isfinite(overhead) and 0.0 <= overhead <= first_t):
            raise ProfileError(
                f"step_overhead_s must be in [0, T({first_n}) = {first_t}] (the table's shortest "
                f"prefill includes one step's fixed time), got {overhead!r}"
            )
        object.__setattr__(self, "step_overhead_s", float(overhead))
        lengths = np.array([0.0, *(n for n, _ in self.profile.points)], dtype=np.float64)
        work = np.array([0.0, *(t - overhead for _, t in self.profile.points)], dtype=np.float64)
        if len(lengths) > 2:
            slope = (work[-1] - work[-2]) / (lengths[-1] - lengths[-2])
        else:  # a single point: proportional to L (as PrefillProfile extrapolates)
            slope = work[-1] / lengths[-1]
        object.__setattr__(self, "_lengths", lengths)
        object.__setattr__(self, "_work", work)
        object.__setattr__(self, "_tail_slope", float(slope))

    @property
    def overhead_s(self) -> float:
        """o, the resolved fixed time per step (seconds)."""
        return float(self.step_overhead_s)  # type: ignore[arg-type]

    def work_s(self, tokens: Any) -> Any:
        """C(L) in seconds for a length or an array of lengths (C(0) = 0, non-decreasing)."""
        x = np.asarray(tokens, dtype=np.float64)
        result = np.interp(x, self._lengths, self._work)
        above = x > self._lengths[-1]
        if np.any(above):
            result = np.where(
                above, self._work[-1] + self._tail_slope * (x - self._lengths[-1]), result
            )
        return float(result) if result.ndim == 0 else result

    def step_time_s(self, spans: Sequence[Span]) -> float:
        """Seconds of a step computing [start, end) of each request (`StepTimeModel`)."""
        if len(spans) == 0:
            return 0.0
        arr = span_array(spans)
        # One interpolation over both ends: a step has a handful of requests, so the numpy call
        # overhead, not the arithmetic, is what this saves.
        ends_then_starts = np.concatenate((arr[:, 1], arr[:, 0]))
        work = self.work_s(ends_then_starts)
        k = len(arr)
        return self.overhead_s + float(np.sum(work[:k]) - np.sum(work[k:]))

    def prefill_s(self, prompt_tokens: int, cached_tokens: int = 0, chunk_tokens: int = 0) -> float:
        """Idle-engine time of one prompt after a cached prefix, chunked at `chunk_tokens`.

        `chunk_tokens` = 0: one step. Used by tests and reports (e.g. the T(L) check).
        """
        todo = prompt_tokens - cached_tokens
        steps = 1 if chunk_tokens <= 0 else max(1, -(-todo // chunk_tokens))
        return steps * self.overhead_s + self.work_s(prompt_tokens) - self.work_s(cached_tokens)

    def describe(self) -> dict[str, Any]:
        """JSON-able description for result settings."""
        return {
            "model": "o + sum(C(end) - C(start)), C(L) = T(L) - o",
            "step_overhead_s": self.overhead_s,
            "profile": self.profile.describe(),
        }


# --- the model a table file names ----------------------------------------------------------------


def for_profile(profile: PrefillProfile, step_overhead_s: float | None = None) -> StepTimeModel:
    """The step-time model a table file names: the table itself unless it saved a fit.

    Args:
        profile: the table (its `step_time` entry, if any, names the model).
        step_overhead_s: the table model's fixed time per step (None: from the table's
            metadata); only for the table model (a fitted curve has its own).

    Raises:
        ProfileError: `step_overhead_s` given for a fitted curve, or out of range.
    """
    fit = None if profile.step_time is None else fit_from_spec(profile.step_time)
    if fit is None:
        return TableStepTime(profile, step_overhead_s)
    if step_overhead_s is not None:
        raise ProfileError(
            f"step_overhead_s applies to a table model; this table saves a {fit.KIND} fit, "
            "which has its own fixed time per step"
        )
    return fit
