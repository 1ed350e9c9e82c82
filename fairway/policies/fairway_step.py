"""The seed Fairway rule, one step at a time: a Fast lane and a Fair lane merged by work charges.

Must not import vllm. Registered as `fairway-step`, and the ablations `fairway-abswait` (wait in
absolute seconds) and `fairway-nofair` (Fast lane only), which stay on this per-step rule. The
cross-step version (`fairway`, `fairway.policies.fairway`) shares the Fast-lane score defined here
(`FastScore`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal, NamedTuple

import numpy as np

from fairway.policies.base import UNPLACED_LANE, Policy, QueuedRequest, register_policy
from fairway.policies.columns import HeadOrder, QueueColumns, head_order
from fairway.profiling.table import PrefillProfile, load

WaitMode = Literal["relative", "absolute"]


class _Columns(NamedTuple):
    """The queue as numpy columns: the pre-pass runs every step over 1,000s of requests (a
    tuple: built every step, where a frozen dataclass's __init__ costs more)."""

    arrival: np.ndarray
    prompt: np.ndarray
    cached: np.ndarray
    work: np.ndarray  # QueuedRequest.remaining: max(prompt - cached, 1)

    @classmethod
    def of(cls, queue: Sequence[QueuedRequest]) -> _Columns:
        n = len(queue)
        arrival = np.fromiter((r.arrival for r in queue), np.float64, n)
        prompt = np.fromiter((r.prompt_tokens for r in queue), np.float64, n)
        cached = np.fromiter((r.cached_tokens for r in queue), np.float64, n)
        return cls(arrival, prompt, cached, np.maximum(prompt - cached, 1.0))

    @classmethod
    def of_columns(cls, queue: QueueColumns) -> _Columns:
        """The scheduler's columns (the same values `of` computes from views). L and h stay
        int64: they are only divided and interpolated, which converts them exactly, and every
        n-sized temporary costs (at 10,000 waiting, fresh pages each step on some VMs)."""
        return cls(queue.arrival, queue.prompt_tokens, queue.cached_tokens, queue.remaining)


@dataclass(eq=False)
class FastScore(Policy):
    """The Fast lane's score and the parameters both Fairway policies share (a base class).

    Fast lane, highest score first (ties: older first, then queue position)::

        s = h / max(c, 1) + wait / SLO,    SLO = max(patience_floor_s, patience_multiplier * T(L))

    with h the cached prefix tokens, c the tokens still to compute, L the prompt length, wait =
    now - arrival (>= 0) and T the idle prefill time from the profile table. The first term is
    RAGCache's order; the second makes every request's urgency grow at a rate relative to its own
    size, so a short prompt that waited 2 s with 1 s of patience (term 2) outranks a long one that
    waited 2 s with 4 s of patience (term 0.5).
    """

    #: Charge on Fast-lane work in the merge (> 0): hits may take 1 / fast_weight of the oldest
    #: request's work before it is placed, and under contention (fairway) the Fair lane gets
    #: fast_weight / (1 + fast_weight) of the prefill tokens. Larger: closer to FCFS.
    fast_weight: float = 4.0
    #: SLO = patience_multiplier x T(L) (> 0).
    patience_multiplier: float = 3.0
    #: Lower bound of the SLO in seconds (> 0); also the unit of wait for `fairway-abswait`.
    patience_floor_s: float = 1.0
    #: Prefill-time table T(L) (object, path or shipped name); None: every SLO is the floor.
    profile: PrefillProfile | str | None = None
    needs_cache_hits: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for name in ("fast_weight", "patience_multiplier", "patience_floor_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
            if value == float("inf"):
                raise ValueError(f"{name} must be finite, got {value!r}")
        if isinstance(self.profile, str):
            self.profile = load(self.profile)
        elif self.profile is not None and not isinstance(self.profile, PrefillProfile):
            raise ValueError(
                f"profile must be a PrefillProfile, a path or None, got {self.profile!r}"
            )

    def patience_s(self, prompt_tokens: int) -> float:
        """SLO of a prompt of this length, in seconds."""
        return float(self._patience(np.array([prompt_tokens], dtype=np.float64))[0])

    def _patience(self, prompt_tokens: np.ndarray) -> np.ndarray:
        if self.profile is None:
            return np.full(prompt_tokens.shape, self.patience_floor_s)
        prefill = self.profile.prefill_s_array(prompt_tokens)
        return np.maximum(self.patience_floor_s, self.patience_multiplier * prefill)

    def fast_score(self, request: QueuedRequest, now: float) -> float:
        """s = h / max(c, 1) + wait / SLO (or wait / floor for the absolute-wait ablation)."""
        return float(self._scores(_Columns.of([request]), now)[0])

    def _wait_unit(self, cols: _Columns) -> np.ndarray | float:
        """The SLO each request's wait is divided by: one number when every SLO is the floor
        (no profile), which divides as the array of it would, without an n-sized temporary."""
        if self.profile is None:
            return self.patience_floor_s
        return self._patience(cols.prompt)

    def _scores(self, cols: _Columns, now: float) -> np.ndarray:
        # in place where it can: each n-sized temporary is fresh memory every step
        wait = np.subtract(now, cols.arrival)
        np.maximum(wait, 0.0, out=wait)
        wait /= self._wait_unit(cols)
        scores = np.divide(cols.cached, cols.work)
        scores += wait
        return scores

    def _fast_lane(self, cols: _Columns, now: float) -> list[int]:
        """Indices by descending Fast score; ties older first, then queue position."""
        # lexsort: the last key is primary; it is stable, so queue position breaks the last tie.
        return np.lexsort((cols.arrival, -self._scores(cols, now))).tolist()

    def _fast_head(self, cols: _Columns, now: float, head: int) -> np.ndarray:
        """The first `head` entries of `_fast_lane`, in O(n) numpy plus a sort of the top."""
        return _lane_head(self._scores(cols, now), cols.arrival, head)


def _lane_head(scores: np.ndarray, arrival: np.ndarray, head: int) -> np.ndarray:
    """The first `head` rows of the Fast lane whose scores are `scores`: the rows `_lane_top`
    keeps, in the lane's order (`_by_lane_keys`)."""
    return _by_lane_keys(_lane_top(scores, head)[0], scores, arrival)[:head]


def _lane_top(scores: np.ndarray, head: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows whose score is among the `head` highest, every row tied with the head-th included,
    in increasing row order; and the mask of them over all rows (None when they are all rows)."""
    n = len(scores)
    if head >= n:
        return np.arange(n), None
    if head <= 0:
        return np.arange(0), np.zeros(n, dtype=bool)
    kept = scores >= _kth_smallest(scores, n - head)
    return kept.nonzero()[0], kept  # the methods: numpy's function wrappers cost more here


def _by_lane_keys(rows: np.ndarray, scores: np.ndarray, arrival: np.ndarray) -> np.ndarray:
    """`rows` (increasing) in the Fast lane's order: score descending, then older; lexsort is
    stable, so row order breaks the last tie. Only these rows' scores are negated."""
    return rows[np.lexsort((arrival[rows], -scores[rows]))]


def _top(key: np.ndarray, head: int) -> np.ndarray:
    """Rows whose `key` is among the `head` smallest, every row tied with the head-th included,
    in increasing row order (so a stable sort of them keeps queue position as the last tie)."""
    n = len(key)
    if head >= n:
        return np.arange(n)
    return (key <= _kth_smallest(key, head - 1)).nonzero()[0]


def _kth_smallest(values: np.ndarray, k: int) -> float:
    """The value at position `k` of `values` sorted (a partition of a copy, O(n))."""
    part = values.copy()
    part.partition(k)
    return part[k]


@register_policy("fairway-step")
@register_policy("fairway-abswait", wait_mode="absolute")
@register_policy("fairway-nofair", fair_lane=False)
@dataclass(eq=False)
class FairwayStepPolicy(FastScore):
    """The seed rule: two lanes over the waiting queue, merged by work charges, every step anew.

    Fast lane: `FastScore`'s order. `fairway-abswait` uses wait / patience_floor_s instead of
    wait / SLO (absolute seconds, same scale at the floor).

    Fair lane: arrival order, oldest first.

    Merge (work charges): each lane has a ledger that starts at the work (`remaining`, uncached
    tokens) of its front request, Fast-lane work counted `fast_weight` times. The lane with the
    smaller ledger places its next request not yet placed and adds that request's (weighted) work;
    ties go to Fast. A request placed by one lane is skipped by the other. Consequence: the work
    placed ahead of the oldest request M is at most M.remaining / fast_weight plus one request's
    overshoot. The bound holds per step (ledgers reset every step): M starts in this step only if
    that is less than the step's token budget. A miss of fast_weight x budget tokens or more gets
    nothing while hits keep filling the steps, until its wait/SLO term lifts it in the Fast lane
    (benchmarks/e3_flood.py measures this); and once M has started, vLLM serves it first with the
    whole budget. `fairway` (the charges carried across steps) fixes both.

    Worked example: five hits of 300 uncached tokens and an older 6,000-token miss M. Fast ledger
    1,200 (4 x 300) vs Fair ledger 6,000: H1..H4 bring Fast to 6,000, the tie goes to Fast (H5,
    7,200), then Fair places M. 1,500 tokens (= M/4) go ahead of M; with a 2,048-token step
    budget M gets the other 548 tokens of the step.

    Caller's contract: call `order()` before every step with the whole waiting queue and the
    current time on the clock of `QueuedRequest.arrival`. The policy keeps no state across steps;
    `last_lanes` reports which lane placed each position of the last order (for metrics).

    Head only (`order_head`, what the scheduler calls): the merge reads each lane only at its
    first entry not yet placed, and after k placements at most k entries of a lane are placed, so
    the first `head` placements read only the first `head` entries of each lane. These are found
    exactly by a partial selection (every entry tied with the head-th kept, then sorted with the
    lane's own keys), and the merge runs `head` times: the first `head` positions equal
    `order()`'s; the other rows follow in queue order, labelled `UNPLACED_LANE`.
    """

    #: "relative" (wait / SLO) or "absolute" (wait / patience_floor_s): the E4 ablation.
    wait_mode: WaitMode = "relative"
    #: False: Fast lane only (the `fairway-nofair` ablation).
    fair_lane: bool = True

    last_lanes: list[str] = field(init=False, repr=False, default_factory=list)
    orders_head: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.wait_mode not in ("relative", "absolute"):
            raise ValueError(f"wait_mode must be 'relative' or 'absolute', got {self.wait_mode!r}")
        if not isinstance(self.fair_lane, bool):
            raise ValueError(f"fair_lane must be true or false, got {self.fair_lane!r}")

    def _wait_unit(self, cols: _Columns) -> np.ndarray | float:
        if self.wait_mode == "relative":
            return self._patience(cols.prompt)
        return self.patience_floor_s

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        return self._order(_Columns.of(queue), now)

    def order_columns(self, cols: QueueColumns, now: float) -> list[int]:
        """`order()` over the scheduler's numpy columns (no views built): the same order."""
        return self._order(_Columns.of_columns(cols), now)

    def _order(self, cols: _Columns, now: float) -> list[int]:
        fast = self._fast_lane(cols, now)
        if not self.fair_lane:
            self.last_lanes = ["fast"] * len(fast)
            return fast
        fair = np.argsort(cols.arrival, kind="stable").tolist()
        return self._merge(cols.work.tolist(), fast, fair, len(fast))

    def order_head(self, cols: QueueColumns, now: float, head: int) -> HeadOrder | np.ndarray:
        """The first `head` positions of `order()` exactly, then the rest in row order (see the
        class docstring), a short head as a `HeadOrder`; O(n) numpy and O(head) Python."""
        n = len(cols)
        head = max(0, min(head, n))
        columns = _Columns.of_columns(cols)
        fast = self._fast_head(columns, now, head)
        if not self.fair_lane:
            first = fast.tolist()
            self.last_lanes = ["fast"] * head
        else:
            fair = _top(columns.arrival, head)
            fair = fair[np.argsort(columns.arrival[fair], kind="stable")][:head]
            work = columns.work  # read only at the rows the merge places
            first = self._merge(work, fast.tolist(), fair.tolist(), head)
        self.last_lanes += [UNPLACED_LANE] * (n - head)
        return head_order(first, n)

    def _merge(
        self, work: Sequence[float] | np.ndarray, fast: list[int], fair: list[int], count: int
    ) -> list[int]:
        """Interleave the two lanes by work charges (see the class docstring), `count` placements.

        Each lane is read only at its first entry not yet placed, so `fast` and `fair` need only
        their first `count` entries."""
        if count == 0:
            self.last_lanes = []
            return []
        weight = self.fast_weight
        placed: set[int] = set()
        result: list[int] = []
        lanes: list[str] = []
        fast_pos = fair_pos = 0
        fast_ledger = weight * float(work[fast[0]])
        fair_ledger = float(work[fair[0]])
        for _ in range(count):
            while fast[fast_pos] in placed:
                fast_pos += 1
            while fair[fair_pos] in placed:
                fair_pos += 1
            if fast_ledger <= fair_ledger:
                i = fast[fast_pos]
                fast_ledger += weight * float(work[i])
                lanes.append("fast")
            else:
                i = fair[fair_pos]
                fair_ledger += float(work[i])
                lanes.append("fair")
            placed.add(i)
            result.append(i)
        self.last_lanes = lanes
        return result
