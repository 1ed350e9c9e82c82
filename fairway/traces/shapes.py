"""Load shapes: offered load over time, in multiples of a capacity, with phase labels.

A shape is a sequence of phases (name, load, duration). Load is relative to a capacity in prefill
tokens/s (`capacity_tps`, by default the shipped profile's), so the same shape means the same
stress on any engine::

    request rate(t) = load(t) * capacity_tps / work_per_request

**Work** is measured in tokens, on one of two bases (a family parameter, ``work_basis``):

* ``prompt``: prompt tokens per request, i.e. the work if nothing were cached. The default of
  the SEC, long-document, MuSiQue and Mooncake families: a load of 1.0 saturates an engine that
  gets no cache hits, and the trace's ideal hit ratio (``fairway trace stats``) says how much a
  perfect cache could remove.
* ``ideal``: uncached tokens with an infinite cache, ``max(L - h, 1)`` where ``h`` is the tokens of
  the leading blocks some earlier request of the same trace already had (the unit
  `QueuedRequest.remaining` uses). A load of 1.0 saturates even a perfect cache. The flood
  family's default, because its flood phase is cheap cached requests whose cost is the suffix.

Families estimate the expected work per request (or session) from their own requests; the
header's ``info`` records the value used, and ``fairway trace stats`` prints the realised load of
each phase on both bases.

Arrivals are a seeded non-homogeneous Poisson process with a constant rate per phase: a
Poisson-distributed count per phase, placed uniformly in the phase (exact for Poisson, and cheap).
A request's phase label is the window it arrives in; the last phase extends to infinity for
labelling (late hops of an agent session keep the last label).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fairway.errors import TraceError
from fairway.traces.format import PhaseWindow

#: The two definitions of a request's work (see the module docstring).
WORK_BASES = ("prompt", "ideal")


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase: `load` x capacity of offered work for `duration_s` seconds, labelled `name`."""

    name: str
    load: float
    duration_s: float

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise TraceError(f"a phase needs a name, got {self.name!r}")
        if not math.isfinite(self.load) or self.load < 0:
            raise TraceError(f"phase {self.name}: load must be finite and >= 0, got {self.load}")
        if not math.isfinite(self.duration_s) or self.duration_s <= 0:
            raise TraceError(
                f"phase {self.name}: duration_s must be finite and > 0, got {self.duration_s}"
            )


@dataclass(frozen=True)
class LoadShape:
    """A named sequence of phases starting at t = 0."""

    name: str
    phases: tuple[Phase, ...]

    def __post_init__(self) -> None:
        if not self.phases:
            raise TraceError(f"shape {self.name!r} has no phases")
        starts = [0.0]
        for p in self.phases:
            starts.append(starts[-1] + p.duration_s)
        object.__setattr__(self, "_bounds", tuple(starts))

    @property
    def duration_s(self) -> float:
        """Total length in seconds."""
        return self._bounds[-1]  # type: ignore[attr-defined]

    def windows(self) -> tuple[PhaseWindow, ...]:
        """The phases as absolute windows [start_s, end_s)."""
        b = self._bounds  # type: ignore[attr-defined]
        return tuple(
            PhaseWindow(p.name, b[i], b[i + 1], p.load) for i, p in enumerate(self.phases)
        )

    def index_at(self, t: float) -> int:
        """Index of the phase whose window holds `t` (first before 0, last after the end)."""
        k = bisect.bisect_right(self._bounds, t) - 1  # type: ignore[attr-defined]
        return min(max(k, 0), len(self.phases) - 1)

    def phase_at(self, t: float) -> str:
        """Phase label of an arrival at `t` seconds."""
        return self.phases[self.index_at(t)].name

    def load_at(self, t: float) -> float:
        """Offered load (multiple of capacity) at `t`; 0 outside [0, duration_s)."""
        if t < 0 or t >= self.duration_s:
            return 0.0
        return self.phases[self.index_at(t)].load

    def mean_load(self) -> float:
        """Time-averaged load over the shape."""
        return sum(p.load * p.duration_s for p in self.phases) / self.duration_s


def _shape(name: str, *phases: tuple[str, float, float]) -> LoadShape:
    return LoadShape(name, tuple(Phase(n, load, d) for n, load, d in phases))


#: Named shapes. `spike` is the SEC default: calm, a burst near capacity, a 60 s spike at twice
#: the capacity, then calm again so that queues can drain (6 minutes in all).
SHAPES: dict[str, LoadShape] = {
    "spike": _shape(
        "spike", ("calm", 0.5, 120.0), ("burst", 0.9, 90.0), ("spike", 2.0, 60.0),
        ("calm", 0.5, 90.0),
    ),
    "steady": _shape("steady", ("steady", 0.8, 360.0)),
    "calm": _shape("calm", ("calm", 0.5, 360.0)),
    "overload": _shape(
        "overload", ("calm", 0.5, 60.0), ("overload", 1.3, 240.0), ("calm", 0.5, 60.0)
    ),
    "flood": _shape(
        "flood", ("backlog", 1.3, 60.0), ("flood", 0.9, 90.0), ("calm", 0.3, 150.0)
    ),
}


def get_shape(spec: str) -> LoadShape:
    """A named shape, or an inline one: ``NAME:LOAD:DURATION_S[,NAME:LOAD:DURATION_S...]``.

    Example: ``calm:0.5:30,spike:2:10`` is 30 s at half the capacity, then 10 s at twice it.
    """
    if spec in SHAPES:
        return SHAPES[spec]
    if ":" not in spec:
        raise TraceError(
            f"unknown shape {spec!r}; named shapes: {', '.join(sorted(SHAPES))}, or inline "
            "NAME:LOAD:DURATION_S[,...] (e.g. calm:0.5:30,spike:2:10)"
        )
    phases = []
    for part in spec.split(","):
        fields = part.strip().split(":")
        if len(fields) != 3:
            raise TraceError(f"shape {spec!r}: phase {part!r} must be NAME:LOAD:DURATION_S")
        name, load, duration = fields
        try:
            numbers = float(load), float(duration)
        except ValueError:
            raise TraceError(
                f"shape {spec!r}: phase {part!r}: LOAD and DURATION_S must be numbers"
            ) from None
        try:
            phases.append(Phase(name.strip(), *numbers))
        except TraceError as exc:  # the range check's own message (load >= 0, duration > 0)
            raise TraceError(f"shape {spec!r}: {exc}") from None
    return LoadShape(spec, tuple(phases))


def phase_rates(
    shape: LoadShape, capacity_tps: float, work_per_request: float | Mapping[str, float]
) -> list[float]:
    """Arrival rate (1/s) of each phase: load x capacity_tps / expected work per arrival.

    Args:
        shape: the load shape.
        capacity_tps: prefill capacity in tokens/s.
        work_per_request: expected work in tokens of one arrival (a request, or a whole agent
            session), or a mapping from phase name to it when the mix differs by phase.
    """
    if not math.isfinite(capacity_tps) or capacity_tps <= 0:
        raise TraceError(f"capacity_tps must be a positive number, got {capacity_tps}")
    rates = []
    for p in shape.phases:
        work = work_per_request if isinstance(work_per_request, int | float) else (
            work_per_request[p.name]
        )
        if not math.isfinite(work) or work <= 0:
            raise TraceError(f"phase {p.name}: expected work per request must be > 0, got {work}")
        rates.append(p.load * capacity_tps / work)
    return rates


def poisson_arrivals(
    shape: LoadShape, rates: Sequence[float], rng: np.random.Generator
) -> np.ndarray:
    """Sorted arrival times of a Poisson process with rate `rates[k]` in phase k."""
    times = []
    for window, rate in zip(shape.windows(), rates, strict=True):
        length = window.end_s - window.start_s
        count = int(rng.poisson(rate * length))
        times.append(np.sort(window.start_s + length * rng.random(count)))
    return np.concatenate(times) if times else np.empty(0)


def check_work_basis(basis: str) -> None:
    """Reject an unknown `work_basis` with the allowed values."""
    if basis not in WORK_BASES:
        raise TraceError(f"work_basis must be one of {', '.join(WORK_BASES)}, got {basis!r}")
