"""Step-time models: the time of one engine step from the prompt spans it computes.

One interface (`StepTimeModel.step_time_s(spans)`, as Vidur's execution-time predictors), three
implementations, so the virtual replay can price its steps with any of them:

- `TableStepTime`: from a prefill-time table T(L) (measured or estimated; the default);
- `QuadraticFit`: the profiler's least-squares curve T(L) = a + b*L + c*L^2;
- `CalibratedFit`: the self-calibrated fit of engine step times (o + b*tokens + c*pairs).

A table file names the model it was saved with (`"step_time": {"kind": ...}`, see
`fairway.profiling.table`); `for_profile` builds it.

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
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from fairway.errors import ProfileError

if TYPE_CHECKING:
    from fairway.profiling.table import PrefillProfile

#: A prompt span computed in one step: positions [start, end) of one request.
Span = tuple[int, int]


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


def _span_array(spans: Sequence[Span]) -> np.ndarray:
    """`spans` as a (k, 2) float array; checks 0 <= start <= end."""
    arr = np.asarray(spans, dtype=np.float64).reshape(-1, 2)
    if np.any(arr[:, 0] > arr[:, 1]) or np.any(arr < 0):
        raise ValueError(f"bad spans (need 0 <= start <= end): {list(spans)}")
    return arr


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
        arr = _span_array(spans)
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


# --- the fitted curves ---------------------------------------------------------------------------


def _nonnegative(kind: str, **values: float) -> None:
    """A curve prices steps only with finite coefficients >= 0 (else a step could cost < 0)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value >= 0
        ):
            raise ProfileError(
                f"step_time {kind!r}: {name} must be a finite number >= 0, got {value!r}"
            )


@dataclass(frozen=True)
class QuadraticFit:
    """T(L) = a + b*L + c*L^2, the profiler's least-squares curve (`profiler.fit_quadratic`).

    As a step-time model: o = a, C(L) = b*L + c*L^2 (see the module docstring).
    """

    a_s: float
    b_s_per_token: float
    c_s_per_token2: float

    KIND = "quadratic"

    def __call__(self, prompt_tokens: Any) -> Any:
        """Seconds at `prompt_tokens` (a number or a numpy array)."""
        x = np.asarray(prompt_tokens, dtype=np.float64)
        result = self.a_s + self.b_s_per_token * x + self.c_s_per_token2 * x * x
        return float(result) if result.ndim == 0 else result

    def step_time_s(self, spans: Sequence[Span]) -> float:
        """Seconds of a step computing [start, end) of each request (`StepTimeModel`)."""
        if len(spans) == 0:
            return 0.0
        arr = _span_array(spans)
        work = self.b_s_per_token * arr + self.c_s_per_token2 * arr * arr
        return self.a_s + float(np.sum(work[:, 1] - work[:, 0]))

    def describe(self) -> dict[str, Any]:
        """JSON-able form (for the table's metadata)."""
        return {
            "formula": "T(L) = a + b*L + c*L^2 (weighted least squares, relative error)",
            "a_s": self.a_s,
            "b_s_per_token": self.b_s_per_token,
            "c_s_per_token2": self.c_s_per_token2,
        }

    def to_spec(self) -> dict[str, Any]:
        """The `step_time` entry of a table file."""
        return {"kind": self.KIND, "a_s": self.a_s, "b_s_per_token": self.b_s_per_token,
                "c_s_per_token2": self.c_s_per_token2}

    def check_prices_steps(self) -> None:
        """Raises ProfileError unless every coefficient is >= 0 (noise can make one negative)."""
        _nonnegative(self.KIND, a_s=self.a_s, b_s_per_token=self.b_s_per_token,
                     c_s_per_token2=self.c_s_per_token2)

    def __str__(self) -> str:
        return (
            f"T(L) = {self.a_s:.4g} s + {self.b_s_per_token:.4g} s/token * L + "
            f"{self.c_s_per_token2:.4g} s/token^2 * L^2"
        )


@dataclass(frozen=True, slots=True)
class CalibratedFit:
    """step_s = o + b*tokens + c*attention_pairs, fitted to engine step times (`calibration`).

    A chunk of n new tokens after p tokens already in the KV cache has n tokens and
    n * (p + (n + 1) / 2) (query, key) pairs of causal attention.
    """

    overhead_s: float
    per_token_s: float
    per_pair_s: float

    KIND = "calibrated"

    def step_s(self, tokens: float, pairs: float) -> float:
        """Predicted seconds of a step computing `tokens` tokens with `pairs` attention pairs."""
        return self.overhead_s + self.per_token_s * tokens + self.per_pair_s * pairs

    def step_time_s(self, spans: Sequence[Span]) -> float:
        """Seconds of a step computing [start, end) of each request (`StepTimeModel`)."""
        if len(spans) == 0:
            return 0.0
        arr = _span_array(spans)
        new = arr[:, 1] - arr[:, 0]
        pairs = new * (arr[:, 0] + (new + 1.0) / 2.0)
        return self.step_s(float(np.sum(new)), float(np.sum(pairs)))

    def prefill_s(self, prompt_tokens: float, chunk_tokens: int) -> float:
        """T(L): an idle prefill of `prompt_tokens`, in steps of at most `chunk_tokens`."""
        steps = max(1, math.ceil(prompt_tokens / chunk_tokens))
        pairs = prompt_tokens * (prompt_tokens + 1) / 2
        return steps * self.overhead_s + self.per_token_s * prompt_tokens + self.per_pair_s * pairs

    def describe(self) -> dict[str, Any]:
        """JSON-able description."""
        return {"model": "o + b*tokens + c*attention_pairs (self-calibrated)",
                **self.to_spec()}

    def to_spec(self) -> dict[str, Any]:
        """The `step_time` entry of a table file."""
        return {"kind": self.KIND, "overhead_s": self.overhead_s,
                "per_token_s": self.per_token_s, "per_pair_s": self.per_pair_s}


# --- the `step_time` entry of a table file -------------------------------------------------------

_FITS: dict[str, type[QuadraticFit] | type[CalibratedFit]] = {
    QuadraticFit.KIND: QuadraticFit,
    CalibratedFit.KIND: CalibratedFit,
}
#: The model kinds a table file can name.
KINDS = ("table", *_FITS)


def fit_from_spec(spec: Mapping[str, Any]) -> QuadraticFit | CalibratedFit | None:
    """The fitted curve a `step_time` entry saves; None for kind "table".

    Raises:
        ProfileError: not an object, an unknown kind, missing or extra fields, or a coefficient
            that is not a finite number >= 0.
    """
    if not isinstance(spec, Mapping):
        raise ProfileError(f'"step_time" must be an object with a "kind", got {spec!r}')
    kind = spec.get("kind")
    if kind == "table":
        if set(spec) != {"kind"}:
            raise ProfileError('step_time "table" takes no parameters (the table is the model)')
        return None
    cls = _FITS.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ProfileError(f"unknown step_time kind {kind!r}; known: {', '.join(KINDS)}")
    names = list(cls.__dataclass_fields__)
    given = {k: v for k, v in spec.items() if k != "kind"}
    if set(given) != set(names):
        raise ProfileError(
            f"step_time {kind!r} needs exactly the fields {', '.join(names)}; got "
            f"{', '.join(sorted(given)) or 'none'}"
        )
    _nonnegative(cls.KIND, **given)
    return cls(**{k: float(given[k]) for k in names})


def check_spec(spec: Mapping[str, Any]) -> None:
    """Validate a `step_time` entry (see `fit_from_spec`)."""
    fit_from_spec(spec)


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
