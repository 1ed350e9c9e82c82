"""Prefill-time tables: T(L), the idle prefill time of an L-token prompt on one GPU + model.

Fairway's patience (the SLO in `wait/SLO`) and the replay's cost model both read this table.

File format (JSON)::

    {
      "fairway_profile": 1,
      "metadata": {"hardware": "...", "model": "...", "source": "measured|estimate", ...},
      "points": [[prompt_tokens, seconds], ...],
      "step_time": {"kind": "table" | "quadratic" | "calibrated", ...}   (optional)
    }

Points are sorted by prompt length, lengths strictly increasing, times positive and
non-decreasing. Between points T is linear. Below the first point T is the first point's time (a
prefill never costs less than the shortest one measured: fixed per-step costs dominate there).
Above the last point T follows the straight line through the last two points (with a single point:
proportional to L), which underestimates the quadratic attention term far beyond the table; profile
up to the model's maximum length to avoid relying on it.

`step_time` (optional; absent means "table") says which step-time model the virtual replay prices
steps with (`fairway.profiling.step_time`): the table itself, or a fitted curve saved with its
coefficients (the profiler's quadratic fit, a self-calibrated fit). The points are always there:
they are the policies' T(L) (patience), whichever model prices the steps.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from fairway.errors import ProfileError
from fairway.profiling.fits import check_spec

FORMAT_VERSION = 1
#: The shipped default table (an analytic estimate, not a measurement).
DEFAULT_PROFILE = "a6000-llama3.1-8b-estimate"


@dataclass(frozen=True)
class PrefillProfile:
    """T(L) from measured or estimated points; immutable and cheap to query.

    Attributes:
        points: ((prompt_tokens, seconds), ...) sorted by prompt_tokens.
        metadata: where the numbers come from (hardware, model, engine version, date, method).
        step_time: the saved step-time model of the replay, `{"kind": ..., coefficients}`;
            None: the table itself (see `fairway.profiling.step_time.for_profile`).
    """

    points: tuple[tuple[int, float], ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    step_time: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        points = tuple((p[0], p[1]) for p in self.points)
        object.__setattr__(self, "points", points)
        _validate(points)
        if self.step_time is not None:
            check_spec(self.step_time)
        object.__setattr__(self, "_lengths", [p[0] for p in points])

    def prefill_s(self, prompt_tokens: float) -> float:
        """T(L): idle prefill time in seconds of a prompt of `prompt_tokens` tokens."""
        pts = self.points
        lengths: list[int] = self._lengths  # type: ignore[attr-defined]
        if prompt_tokens <= lengths[0]:
            return pts[0][1]
        if prompt_tokens >= lengths[-1]:
            if len(pts) == 1:
                return pts[0][1] * prompt_tokens / pts[0][0]
            (l0, t0), (l1, t1) = pts[-2], pts[-1]
        else:
            k = bisect.bisect_right(lengths, prompt_tokens)
            (l0, t0), (l1, t1) = pts[k - 1], pts[k]
        return t0 + (t1 - t0) * (prompt_tokens - l0) / (l1 - l0)

    def prefill_s_array(self, prompt_tokens: np.ndarray) -> np.ndarray:
        """T(L) for many lengths at once (same rule as `prefill_s`; for the per-step pre-pass)."""
        lengths = np.asarray(self._lengths, dtype=np.float64)  # type: ignore[attr-defined]
        times = np.asarray([t for _, t in self.points], dtype=np.float64)
        result = np.interp(prompt_tokens, lengths, times)  # clamps below the first point
        above = prompt_tokens > lengths[-1]
        if above.any():
            if len(lengths) == 1:
                slope = times[0] / lengths[0]
            else:
                slope = (times[-1] - times[-2]) / (lengths[-1] - lengths[-2])
            result[above] = times[-1] + slope * (prompt_tokens[above] - lengths[-1])
        return result

    def capacity_tps(self, chunk_tokens: int = 2048) -> float:
        """Prefill throughput in tokens/s when every step computes `chunk_tokens` fresh tokens.

        This is the unit in which load shapes express stress, so that the same shape means the
        same overload on any engine whose table is known.
        """
        return chunk_tokens / self.prefill_s(chunk_tokens)

    def describe(self) -> dict[str, Any]:
        """A short JSON-able description (for logs and result files)."""
        return {
            "metadata": dict(self.metadata),
            "num_points": len(self.points),
            "max_tokens": self.points[-1][0],
        }

    def to_json(self) -> dict[str, Any]:
        """The file representation."""
        data: dict[str, Any] = {
            "fairway_profile": FORMAT_VERSION,
            "metadata": dict(self.metadata),
            "points": [[n, t] for n, t in self.points],
        }
        if self.step_time is not None:
            data["step_time"] = dict(self.step_time)
        return data

    def save(self, path: str | Path) -> None:
        """Write the table as JSON (creating parent directories)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")


def _validate(points: tuple[tuple[Any, Any], ...]) -> None:
    if not points:
        raise ProfileError("a profile table needs at least one (prompt_tokens, seconds) point")
    prev_n, prev_t = 0, 0.0
    for i, (n, t) in enumerate(points):
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ProfileError(f"point {i}: prompt_tokens must be a positive integer, got {n!r}")
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
            raise ProfileError(f"point {i}: seconds must be a positive finite number, got {t!r}")
        if n <= prev_n:
            raise ProfileError(
                f"point {i}: prompt_tokens must be strictly increasing ({n} after {prev_n})"
            )
        if t < prev_t:
            raise ProfileError(
                f"point {i}: seconds must be non-decreasing in prompt length "
                f"(T({n}) = {t} < T({prev_n}) = {prev_t})"
            )
        prev_n, prev_t = n, t
    check_plausible(points)


#: No single prefill takes an hour: a larger value is a unit mistake (ms, us) or a broken fit.
MAX_PREFILL_S = 3600.0
#: No engine prefills ten million tokens a second: a faster point is a unit mistake as well.
MAX_TOKENS_PER_S = 1e7


def check_plausible(points: Iterable[tuple[int, float]]) -> None:
    """Refuse times no hardware produces (the table's other checks only ask for order).

    A table with 1e9 s per prefill, or one in milliseconds read as seconds, would pass the
    ordering checks and silently make every patience (3 x T) and every replayed step absurd.

    Raises:
        ProfileError: the first point outside the bounds, and what the bound means.
    """
    for i, (n, t) in enumerate(points):
        if t > MAX_PREFILL_S:
            raise ProfileError(
                f"point {i}: T({n}) = {t:g} s is implausible (more than {MAX_PREFILL_S:g} s for "
                "one prefill); the table holds seconds per prefill: check the units"
            )
        if n / t > MAX_TOKENS_PER_S:
            raise ProfileError(
                f"point {i}: T({n}) = {t:g} s is implausible ({n / t:.3g} tokens/s, more than "
                f"{MAX_TOKENS_PER_S:g}); the table holds seconds per prefill: check the units"
            )


def from_json(data: Mapping[str, Any], source: str = "<data>") -> PrefillProfile:
    """Build a table from its parsed JSON; errors name the source."""
    if not isinstance(data, Mapping) or data.get("fairway_profile") != FORMAT_VERSION:
        raise ProfileError(
            f"{source}: not a Fairway profile table (expected a JSON object with "
            f'"fairway_profile": {FORMAT_VERSION})'
        )
    raw = data.get("points")
    if not isinstance(raw, list) or not all(isinstance(p, list) and len(p) == 2 for p in raw):
        raise ProfileError(f'{source}: "points" must be a list of [prompt_tokens, seconds] pairs')
    metadata = data.get("metadata", {})
    if not isinstance(metadata, Mapping):
        raise ProfileError(f'{source}: "metadata" must be an object')
    step_time = data.get("step_time")
    try:
        return PrefillProfile(tuple((p[0], p[1]) for p in raw), metadata, step_time)
    except ProfileError as exc:
        raise ProfileError(f"{source}: {exc}") from None


def load(path_or_name: str | Path) -> PrefillProfile:
    """Load a table from a file path, or a shipped table by name (see `shipped_names()`)."""
    path = Path(path_or_name)
    if not path.exists() and str(path_or_name) in shipped_names():
        text = resources.files("fairway.profiles").joinpath(f"{path_or_name}.json").read_text()
        source = f"shipped profile {path_or_name!r}"
    else:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ProfileError(
                f"cannot read profile table {str(path)!r}: {exc.strerror}; shipped tables: "
                f"{', '.join(shipped_names())}"
            ) from None
        source = str(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{source}: invalid JSON ({exc})") from None
    return from_json(data, source)


def shipped_names() -> list[str]:
    """Names of the tables shipped in `fairway/profiles/`."""
    folder = resources.files("fairway.profiles")
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def default_profile() -> PrefillProfile:
    """The shipped default: the analytic RTX A6000 / Llama-3.1-8B estimate."""
    return load(DEFAULT_PROFILE)


def from_points(points: Iterable[tuple[int, float]], **metadata: Any) -> PrefillProfile:
    """Convenience constructor (sorted by length)."""
    return PrefillProfile(tuple(sorted(points)), metadata)
