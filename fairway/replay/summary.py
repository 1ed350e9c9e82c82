"""TTFT statistics of replay results: per-phase percentiles, the hit / miss split, starvation.

Percentiles are numpy's `percentile(..., method="linear")` (the default, "type 7": linear
interpolation between the two nearest ranks) over the requests that produced a first token.
Errored requests have no TTFT: they are counted in `n_errors`, never silently dropped (the target
rule, `fairway.replay.targets`, fails a policy with errors in a phase).

Every summary also splits TTFT by cache hit vs miss (`fairway.replay.results.HIT_DEFINITION`):
a cache-greedy order can have a fine overall median while its few misses carry most of the
waiting, which the per-phase rows hide. Results without cached-token counts (a live server that
does not report them) get no split: the report says "unavailable" instead of guessing.

The starvation flag lives here, not with the targets: it compares a policy with its own tail,
not with a reference policy, and every `Summary` carries it.

A trace with agent sessions also gets the session view (`fairway.replay.session_view`): sessions,
their end-to-end time and the turns that reused their session's context; none without sessions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from fairway.replay.results import ReplayResult, RequestResult
from fairway.replay.session_view import session_facts

PERCENTILE_METHOD: Final = "linear"
#: The pseudo-phase that holds every request of a trace.
ALL = "all"
#: Starved: the worst TTFT exceeds STARVATION_FACTOR x the policy's own p99 (all requests).
STARVATION_FACTOR = 3.0


@dataclass(frozen=True, slots=True)
class PhaseStats:
    """TTFT statistics of one policy in one phase of one trace (seconds; None without data)."""

    trace_name: str
    policy: str
    phase: str
    n: int
    n_errors: int
    median_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None


@dataclass(frozen=True, slots=True)
class Starvation:
    """The starvation check of one policy on one trace: `max_s > STARVATION_FACTOR * p99_s`."""

    trace_name: str
    policy: str
    max_s: float | None
    p99_s: float | None
    starved: bool


@dataclass(frozen=True, slots=True)
class HitMissStats:
    """TTFT of one policy's cache hits and misses in one phase of one trace (seconds).

    Attributes:
        available: the result has cached-token counts (else every other field is empty).
        n_hit, n_miss: requests of each class, errored ones included.
        n_unknown: requests whose cached tokens are unknown (never scheduled, or not reported).
        hit_median_s, hit_p99_s, miss_median_s, miss_p99_s, miss_max_s: over requests with a TTFT.
        miss_ttft_share: the misses' share of the summed TTFT of all classified requests with a
            TTFT (SGLang #31954: ~5% of requests, misses, carried ~75% of it under LPM).
    """

    trace_name: str
    policy: str
    phase: str
    available: bool
    n_hit: int = 0
    n_miss: int = 0
    n_unknown: int = 0
    hit_median_s: float | None = None
    hit_p99_s: float | None = None
    miss_median_s: float | None = None
    miss_p99_s: float | None = None
    miss_max_s: float | None = None
    miss_ttft_share: float | None = None


@dataclass(frozen=True, slots=True)
class SessionStats:
    """The agent sessions of one policy on one trace (`fairway.replay.session_view`).

    Attributes:
        n_sessions: sessions (distinct `session` tags).
        n_complete: sessions whose every turn got a first token.
        median_s, p99_s: end-to-end seconds of the complete sessions; None without any.
        n_turns_with_parent, n_hits, n_unknown: turns with a parent, the hits at admission
            among them, and those whose cached tokens are unknown.
    """

    trace_name: str
    policy: str
    n_sessions: int
    n_complete: int
    median_s: float | None
    p99_s: float | None
    n_turns_with_parent: int
    n_hits: int
    n_unknown: int


@dataclass(frozen=True)
class Summary:
    """Everything the tables need, in report order.

    Attributes:
        traces: trace names in order of first appearance.
        policies: per trace, policy names in the order the results were given.
        phases: per trace, phase labels by first arrival, then `ALL`.
        rows: one `PhaseStats` per trace x policy x phase, in the order above.
        starvation: one `Starvation` per trace x policy.
        hit_miss: one `HitMissStats` per trace x policy x phase, in the order of `rows`.
        sessions: one `SessionStats` per trace x policy whose result has sessions.
    """

    traces: list[str]
    policies: dict[str, list[str]]
    phases: dict[str, list[str]]
    rows: list[PhaseStats]
    starvation: list[Starvation]
    percentile_method: str = PERCENTILE_METHOD
    hit_miss: list[HitMissStats] = dataclasses.field(default_factory=list)
    sessions: list[SessionStats] = dataclasses.field(default_factory=list)

    def row(self, trace_name: str, policy: str, phase: str) -> PhaseStats | None:
        """The stats of one cell, or None when that policy or phase is absent."""
        for r in self.rows:
            if (r.trace_name, r.policy, r.phase) == (trace_name, policy, phase):
                return r
        return None

    def hit_miss_row(self, trace_name: str, policy: str, phase: str) -> HitMissStats | None:
        """The hit / miss split of one cell, or None when that policy or phase is absent."""
        for r in self.hit_miss:
            if (r.trace_name, r.policy, r.phase) == (trace_name, policy, phase):
                return r
        return None


Stat = float | None


def ttft_stats(ttfts: Sequence[float]) -> tuple[Stat, Stat, Stat, Stat]:
    """(median, p90, p99, max) of `ttfts` with numpy's linear method; all None when empty."""
    if len(ttfts) == 0:
        return None, None, None, None
    values = np.asarray(ttfts, dtype=float)
    median, p90, p99 = np.percentile(values, [50, 90, 99], method=PERCENTILE_METHOD)
    return float(median), float(p90), float(p99), float(values.max())


def _phase_stats(trace_name: str, policy: str, phase: str, reqs: list[RequestResult]) -> PhaseStats:
    ttfts = [t for t in (r.ttft_s for r in reqs) if t is not None]
    median, p90, p99, worst = ttft_stats(ttfts)
    return PhaseStats(trace_name, policy, phase, len(reqs), len(reqs) - len(ttfts),
                      median, p90, p99, worst)


def hit_miss_stats(
    trace_name: str, policy: str, phase: str, reqs: list[RequestResult], available: bool
) -> HitMissStats:
    """Split `reqs` into hits and misses (`RequestResult.hit`) and give each class's TTFT."""
    if not available:
        return HitMissStats(trace_name, policy, phase, False)
    hits = [r for r in reqs if r.hit is True]
    misses = [r for r in reqs if r.hit is False]
    hit_ttfts = [t for t in (r.ttft_s for r in hits) if t is not None]
    miss_ttfts = [t for t in (r.ttft_s for r in misses) if t is not None]
    hit_median, _, hit_p99, _ = ttft_stats(hit_ttfts)
    miss_median, _, miss_p99, miss_max = ttft_stats(miss_ttfts)
    total = sum(hit_ttfts) + sum(miss_ttfts)
    share = sum(miss_ttfts) / total if total > 0 else None
    return HitMissStats(
        trace_name, policy, phase, True, len(hits), len(misses),
        len(reqs) - len(hits) - len(misses), hit_median, hit_p99, miss_median, miss_p99,
        miss_max, share,
    )


def phase_order(results: Iterable[ReplayResult]) -> list[str]:
    """Phase labels sorted by their earliest arrival over all `results` (ties: first seen).

    Requests without a phase appear only under `ALL`, which is not part of this list.
    """
    first: dict[str, tuple[float, int]] = {}
    for result in results:
        for r in result.requests:
            if r.phase is None:
                continue
            if r.phase == ALL:
                raise ValueError(f"phase label {ALL!r} is reserved for the whole trace")
            seen = first.get(r.phase)
            if seen is None:
                first[r.phase] = (r.arrival_s, len(first))
            elif r.arrival_s < seen[0]:
                first[r.phase] = (r.arrival_s, seen[1])
    return sorted(first, key=lambda p: first[p])


def group_by_trace(results: Sequence[ReplayResult]) -> dict[str, list[ReplayResult]]:
    """Results by trace (first-appearance order); a trace x policy given twice is ambiguous."""
    by_trace: dict[str, list[ReplayResult]] = {}
    for result in results:
        group = by_trace.setdefault(result.trace_name, [])
        if any(g.policy == result.policy for g in group):
            raise ValueError(
                f"two results for policy {result.policy!r} on trace {result.trace_name!r}; "
                "give each trace x policy once"
            )
        group.append(result)
    return by_trace


def starvation_check(trace_name: str, policy: str, reqs: list[RequestResult]) -> Starvation:
    """Flag a policy whose worst TTFT is far beyond its own tail (one request left behind)."""
    _, _, p99, worst = ttft_stats([t for t in (r.ttft_s for r in reqs) if t is not None])
    starved = p99 is not None and worst is not None and worst > STARVATION_FACTOR * p99
    return Starvation(trace_name, policy, worst, p99, starved)


def session_stats(trace_name: str, policy: str, reqs: list[RequestResult]
                  ) -> SessionStats | None:
    """The session view of one result as stats; None when it has no sessions."""
    facts = session_facts(reqs)
    if facts is None:
        return None
    median, _, p99, _ = ttft_stats(facts.end_to_end_s)
    return SessionStats(trace_name, policy, facts.n_sessions, len(facts.end_to_end_s), median,
                        p99, facts.n_turns_with_parent, facts.n_hits, facts.n_unknown)


def summarize(results: list[ReplayResult]) -> Summary:
    """Per trace x policy x phase TTFT statistics, the starvation flags and the session view.

    Raises:
        ValueError: a trace x policy pair appears twice, or a phase is labelled `ALL`.
    """
    by_trace = group_by_trace(results)
    policies: dict[str, list[str]] = {}
    phases: dict[str, list[str]] = {}
    rows: list[PhaseStats] = []
    starvation: list[Starvation] = []
    hit_miss: list[HitMissStats] = []
    sessions: list[SessionStats] = []
    for trace_name, group in by_trace.items():
        policies[trace_name] = [g.policy for g in group]
        phases[trace_name] = [*phase_order(group), ALL]
        for result in group:
            # A result that knows no request's cached tokens has no split (live, not reported).
            available = any(r.cached_tokens is not None for r in result.requests)
            for phase in phases[trace_name]:
                reqs = [r for r in result.requests if phase == ALL or r.phase == phase]
                rows.append(_phase_stats(trace_name, result.policy, phase, reqs))
                hit_miss.append(hit_miss_stats(trace_name, result.policy, phase, reqs, available))
            starvation.append(starvation_check(trace_name, result.policy, result.requests))
            found = session_stats(trace_name, result.policy, result.requests)
            if found is not None:
                sessions.append(found)
    return Summary(list(by_trace), policies, phases, rows, starvation, hit_miss=hit_miss,
                   sessions=sessions)
