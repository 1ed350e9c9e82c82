"""What a trace asks of a scheduler: lengths, ideal prefix reuse, load per phase, work spread.

Definitions (block-granular on the trace's content blocks, infinite cache, arrival order):

* **ideal hit** of a request: tokens of its longest run of leading blocks that an earlier request
  also started with (the chain of blocks, not the block ids alone, since a prefix cache keys each
  block by everything before it). **Ideal hit ratio** = sum of ideal hits / sum of prompt tokens.
* **work** of a request: ``max(L - hit, 1)``, the uncached tokens with an infinite cache (the unit
  of `QueuedRequest.remaining`).
* **reusable content**: tokens of the distinct prefix blocks (nodes of the prefix tree) that at
  least one later request hits, i.e. what a cache must hold to get every ideal hit.
* **work spread**: requests arriving in the same window of `window_s` seconds (windows
  ``[k * window_s, (k + 1) * window_s)`` from t = 0) are queued together; the spread of a window is
  its largest work / its smallest work. Windows with fewer than two requests are skipped. The
  median and max are over windows; per phase, over the windows of that phase's requests.
* **offered load** of a phase: work (or prompt tokens) arriving in it / (its length x the header's
  capacity_tps). A phase's length is its header window (the last one stretched to the last
  arrival); without windows, the trace's span.

Percentiles use linear interpolation between order statistics (numpy's default).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fairway.traces.format import Block, Trace, TraceRequest

PERCENTILES = (10, 50, 90, 99)
#: Label used for requests whose phase is null.
NO_PHASE = "-"


class PrefixTree:
    """A trie of block chains: which prefixes earlier requests had, and which were reused.

    Each node is ``[children, tokens, reused]``; lists rather than objects keep the Mooncake
    conversation trace (290k blocks) in a fraction of a second.
    """

    def __init__(self) -> None:
        self.root: list[Any] = [{}, 0, False]

    def add(self, blocks: Sequence[Block]) -> int:
        """Insert one request; return its ideal hit in tokens (leading blocks seen before)."""
        node = self.root
        hit = 0
        i = 0
        while i < len(blocks):
            child = node[0].get(blocks[i][0])
            if child is None:
                break
            child[2] = True
            hit += child[1]
            node = child
            i += 1
        for block_id, tokens in blocks[i:]:
            child = [{}, tokens, False]
            node[0][block_id] = child
            node = child
        return hit

    def reusable_tokens(self) -> tuple[int, int]:
        """(tokens of reused nodes, number of reused nodes)."""
        tokens = count = 0
        stack = [self.root]
        while stack:
            node = stack.pop()
            for child in node[0].values():
                if child[2]:
                    tokens += child[1]
                    count += 1
                stack.append(child)
        return tokens, count


def ideal_hits(requests: Iterable[TraceRequest]) -> list[int]:
    """Ideal hit in tokens of each request, in the given (arrival) order."""
    tree = PrefixTree()
    return [tree.add(r.blocks) for r in requests]


def ideal_work(requests: Sequence[TraceRequest]) -> list[int]:
    """Work of each request with an infinite cache: max(L - ideal hit, 1)."""
    hits = ideal_hits(requests)
    return [max(r.prompt_tokens - h, 1) for r, h in zip(requests, hits, strict=True)]


def request_work(requests: Sequence[TraceRequest], basis: str) -> list[int]:
    """Work of each request on a basis of `fairway.traces.shapes.WORK_BASES`."""
    if basis == "prompt":
        return [r.prompt_tokens for r in requests]
    return ideal_work(requests)


@dataclass(frozen=True)
class SpreadStats:
    """Work spread over windows (None when no window holds two requests)."""

    median: float | None
    max: float | None
    num_windows: int


@dataclass(frozen=True)
class PhaseStats:
    """One phase's share of the trace."""

    phase: str
    num_requests: int
    start_s: float
    end_s: float
    prompt_tokens: int
    work_tokens: int
    ideal_hit_ratio: float
    offered_load_prompt: float | None
    offered_load_ideal: float | None
    work_spread: SpreadStats


@dataclass(frozen=True)
class TraceStats:
    """Summary of a trace (see the module docstring for each definition)."""

    family: str
    num_requests: int
    span_s: float
    capacity_tps: float | None
    prompt_tokens_total: int
    prompt_tokens_mean: float
    prompt_percentiles: dict[str, float]
    ideal_hit_tokens: int
    ideal_hit_ratio: float
    reusable_tokens: int
    reusable_blocks: int
    distinct_blocks: int
    window_s: float
    work_spread: SpreadStats
    phases: tuple[PhaseStats, ...]

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (the `--json` output)."""
        return asdict(self)


def _spread(groups: Iterable[Sequence[int]]) -> SpreadStats:
    ratios = [max(g) / min(g) for g in groups if len(g) >= 2]
    if not ratios:
        return SpreadStats(None, None, 0)
    return SpreadStats(float(np.median(ratios)), float(max(ratios)), len(ratios))


def _percentiles(values: Sequence[int]) -> dict[str, float]:
    if not values:
        return {f"p{p}": 0.0 for p in PERCENTILES} | {"max": 0.0}
    arr = np.asarray(values, dtype=float)
    out = {f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES}
    out["max"] = float(arr.max())
    return out


def _phase_extents(trace: Trace, span_s: float) -> dict[str, float]:
    """Seconds each phase label covers (its windows; the last window reaches the last arrival)."""
    windows = trace.header.phases
    extents: dict[str, float] = defaultdict(float)
    for i, w in enumerate(windows):
        end = max(w.end_s, span_s) if i == len(windows) - 1 else w.end_s
        extents[w.name] += end - w.start_s
    return extents


def trace_stats(trace: Trace, window_s: float = 10.0) -> TraceStats:
    """Analyse `trace` (see the module docstring); `window_s` groups arrivals for the spread."""
    if not window_s > 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    reqs = trace.requests
    tree = PrefixTree()
    hits = [tree.add(r.blocks) for r in reqs]
    lengths = [r.prompt_tokens for r in reqs]
    work = [max(n - h, 1) for n, h in zip(lengths, hits, strict=True)]
    reusable, reusable_blocks = tree.reusable_tokens()
    span = reqs[-1].arrival_s if reqs else 0.0
    total = sum(lengths)
    capacity = trace.header.capacity_tps

    windows: dict[int, list[int]] = defaultdict(list)
    by_phase: dict[str, list[int]] = defaultdict(list)
    phase_windows: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, r in enumerate(reqs):
        k = math.floor(r.arrival_s / window_s)
        phase = r.phase if r.phase is not None else NO_PHASE
        windows[k].append(work[i])
        by_phase[phase].append(i)
        phase_windows[(phase, k)].append(work[i])

    extents = _phase_extents(trace, span)
    phases = []
    for phase, idx in by_phase.items():
        p_prompt = sum(lengths[i] for i in idx)
        p_work = sum(work[i] for i in idx)
        p_hits = sum(hits[i] for i in idx)
        start, end = reqs[idx[0]].arrival_s, reqs[idx[-1]].arrival_s
        seconds = extents.get(phase) or (span if span > 0 else None)
        load_p = load_i = None
        if capacity and seconds:
            load_p = p_prompt / seconds / capacity
            load_i = p_work / seconds / capacity
        phases.append(PhaseStats(
            phase=phase,
            num_requests=len(idx),
            start_s=start,
            end_s=end,
            prompt_tokens=p_prompt,
            work_tokens=p_work,
            ideal_hit_ratio=p_hits / p_prompt if p_prompt else 0.0,
            offered_load_prompt=load_p,
            offered_load_ideal=load_i,
            work_spread=_spread(g for (ph, _), g in phase_windows.items() if ph == phase),
        ))
    distinct = {b for r in reqs for b, _ in r.blocks}
    return TraceStats(
        family=trace.header.family,
        num_requests=len(reqs),
        span_s=span,
        capacity_tps=capacity,
        prompt_tokens_total=total,
        prompt_tokens_mean=total / len(reqs) if reqs else 0.0,
        prompt_percentiles=_percentiles(lengths),
        ideal_hit_tokens=sum(hits),
        ideal_hit_ratio=sum(hits) / total if total else 0.0,
        reusable_tokens=reusable,
        reusable_blocks=reusable_blocks,
        distinct_blocks=len(distinct),
        window_s=window_s,
        work_spread=_spread(windows.values()),
        phases=tuple(phases),
    )


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def format_stats(stats: TraceStats) -> str:
    """Human-readable report (what `fairway trace stats` prints)."""
    p = stats.prompt_percentiles
    lines = [
        f"family: {stats.family}",
        f"requests: {stats.num_requests}  span: {stats.span_s:.1f} s  "
        f"capacity: {_fmt(stats.capacity_tps, '.1f')} tokens/s",
        f"prompt tokens: mean {stats.prompt_tokens_mean:.0f}  p10 {p['p10']:.0f}  "
        f"p50 {p['p50']:.0f}  p90 {p['p90']:.0f}  p99 {p['p99']:.0f}  max {p['max']:.0f}  "
        f"total {stats.prompt_tokens_total}",
        f"ideal prefix-hit ratio (infinite cache): {stats.ideal_hit_ratio:.3f}",
        f"reusable content: {stats.reusable_tokens} tokens in {stats.reusable_blocks} blocks "
        f"({stats.distinct_blocks} distinct block ids)",
        f"work spread (max/min work per {stats.window_s:g} s window): median "
        f"{_fmt(stats.work_spread.median, '.1f')}  max {_fmt(stats.work_spread.max, '.1f')}  "
        f"over {stats.work_spread.num_windows} windows",
        "",
        f"{'phase':<10} {'n':>6} {'from_s':>8} {'to_s':>8} {'load(prompt)':>12} "
        f"{'load(ideal)':>11} {'hit':>6} {'spread p50':>10} {'spread max':>10}",
    ]
    for ph in stats.phases:
        lines.append(
            f"{ph.phase:<10} {ph.num_requests:>6} {ph.start_s:>8.1f} {ph.end_s:>8.1f} "
            f"{_fmt(ph.offered_load_prompt):>12} {_fmt(ph.offered_load_ideal):>11} "
            f"{ph.ideal_hit_ratio:>6.3f} {_fmt(ph.work_spread.median, '.1f'):>10} "
            f"{_fmt(ph.work_spread.max, '.1f'):>10}"
        )
    return "\n".join(lines)
