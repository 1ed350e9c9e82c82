"""The fitted step-time curves, and the `step_time` entry of a table file that saves one.

- `QuadraticFit`: the profiler's least-squares curve T(L) = a + b*L + c*L^2;
- `CalibratedFit`: the self-calibrated fit of engine step times (o + b*tokens + c*pairs).

Both are `StepTimeModel`s (`fairway.profiling.step_time`, whose docstring derives the formula
they share with the table model). A table file (`fairway.profiling.table`) saves a fit as
`"step_time": {"kind": ..., coefficients}`; `fit_from_spec` reads that entry back. This module
sits below both: the table checks its entry here without importing the step-time models that
are built on the table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairway.errors import ProfileError

#: A prompt span computed in one step: positions [start, end) of one request.
Span = tuple[int, int]


def span_array(spans: Sequence[Span]) -> np.ndarray:
    """`spans` as a (k, 2) float array; checks 0 <= start <= end."""
    arr = np.asarray(spans, dtype=np.float64).reshape(-1, 2)
    if np.any(arr[:, 0] > arr[:, 1]) or np.any(arr < 0):
        raise ValueError(f"bad spans (need 0 <= start <= end): {list(spans)}")
    return arr


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
    """T(L) = a + b*L + c*L^2, the least-squares curve of `measured_profile.fit_quadratic`.

    As a step-time model: o = a, C(L) = b*L + c*L^2 (see `fairway.profiling.step_time`).
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
        arr = span_array(spans)
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
        arr = span_array(spans)
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
