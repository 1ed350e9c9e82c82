"""The two lanes both Fairway policies share: the Fast-lane score and the work-charge merge.

Must not import vllm. `FastLanePolicy` is the base class of `fairway-step` (the paper's per-step
rule, `fairway.policies.fairway_step`) and `fairway` (the charges carried across steps,
`fairway.policies.fairway`): the parameters both take, the patience (SLO) and the Fast score.
`merge` is the paper's merge of the two lanes, with the cross-step policy's two extensions (start
ledgers, free request slots). The lane-head selections at the bottom find the first entries of a
lane without sorting the whole queue (what the engine calls every step over 1,000s of requests).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fairway.policies.base import Policy
from fairway.policies.queue import PrefillingRequest, QueueColumns, QueuedRequest
from fairway.profiling.table import PrefillProfile, load

FAST, FAIR = "fast", "fair"


@dataclass(eq=False)
class FastLanePolicy(Policy):
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

    # --- the rule ---------------------------------------------------------------------------------

    def patience(self, prompt_tokens: np.ndarray) -> np.ndarray:
        """SLO in seconds of each prompt length: max(floor, multiplier x T(L)). The one patience
        function (elementwise, so a length gets the same float in any batch)."""
        if not isinstance(self.profile, PrefillProfile):
            return np.full(prompt_tokens.shape, self.patience_floor_s)
        prefill = self.profile.prefill_s_array(prompt_tokens)
        return np.maximum(self.patience_floor_s, self.patience_multiplier * prefill)

    def patience_s(self, prompt_tokens: int) -> float:
        """SLO of a prompt of this length, in seconds."""
        return float(self.patience(np.array([prompt_tokens], dtype=np.float64))[0])

    def wait_unit_s(self, prompt_tokens: int) -> float:
        """What a request's wait is divided by in its score (its SLO; `fairway-abswait`: the
        floor)."""
        return self.patience_s(prompt_tokens)

    def fast_score(self, request: QueuedRequest, now: float) -> float:
        """s = h / max(c, 1) + wait / SLO (or wait / floor for the absolute-wait ablation)."""
        wait = max(now - request.arrival, 0.0) / self.wait_unit_s(request.prompt_tokens)
        return request.cached_tokens / request.remaining + wait

    def fast_scores(self, queue: Sequence[QueuedRequest], now: float) -> list[float]:
        return [self.fast_score(request, now) for request in queue]

    # --- the same score over the queue's columns (must equal `fast_score` bit for bit) -----------

    def wait_units(self, prompt_tokens: np.ndarray) -> np.ndarray | float:
        """`wait_unit_s` of each prompt length; one number when every SLO is the floor (no
        profile), which divides as the array of it would, without an n-sized temporary."""
        if self.profile is None:
            return self.patience_floor_s
        return self.patience(prompt_tokens)

    def scores(self, queue: QueueColumns, now: float) -> np.ndarray:
        """`fast_score` of every row, float64 (the same IEEE operations in the same order)."""
        wait = np.maximum(now - queue.arrival, 0.0) / self.wait_units(queue.prompt_tokens)
        scores: np.ndarray = queue.cached_tokens / queue.remaining + wait
        return scores

    def running_scores(self, running: Sequence[PrefillingRequest], now: float) -> list[float]:
        """`fast_score` of each running prefill's view, as `scores` computes it for columns of
        the views (bit for bit), from three short arrays instead of the views' columns.
        # speed: three running prefills: 14.9 -> 5.4 us per call (their views' columns and
        # `scores` before; benchmarks/call_costs.py)"""
        arrival = np.array([p.arrival for p in running], dtype=np.float64)
        prompt = np.array([p.prompt_tokens for p in running], dtype=np.int64)
        remaining = np.array([p.remaining for p in running], dtype=np.int64)
        wait = np.maximum(now - arrival, 0.0) / self.wait_units(prompt)
        scores: list[float] = ((prompt - remaining) / np.maximum(remaining, 1.0) + wait).tolist()
        return scores


def fast_lane_order(scores: Sequence[float], queue: Sequence[QueuedRequest]) -> list[int]:
    """The Fast lane: positions by score descending, then older, then queue position."""
    return sorted(range(len(queue)), key=lambda i: (-scores[i], queue[i].arrival))


def merge(
    fast: Sequence[int],
    fair: Sequence[int],
    work: Mapping[int, int] | Sequence[float] | np.ndarray,
    weight: float,
    ledgers: tuple[float, float] | None = None,
    slots: int | None = None,
    step_tokens: int | None = None,
    fit: bool = False,
    skipped: set[int] | None = None,
    turn_past: list[float] | None = None,
    rest: bool = True,
) -> tuple[list[int], list[str], list[str]]:
    """The paper's merge of two lanes over the same requests.

    `fast` and `fair` list the same requests (keys; waiting rows >= 0, running prefills < 0) in
    each lane's order; `ledgers` are the (fast, fair) ledgers to start from, or None for the
    paper's start (w x the Fast front's work, the Fair front's work). The lane with the smaller
    ledger places its first request not yet placed and adds its work (x weight for Fast); ties
    go to Fast. Each lane is read only at its first entry not yet placed, so the merge of two
    lane prefixes equals the whole lanes' until one prefix is used up, where it stops.

    `slots`: the step can start at most this many waiting requests. Once they are placed, only
    the running prefills are placed (a waiting request without a slot gets nothing, so it must
    not move the ledgers ahead of them), then the other waiting requests as before.
    Returns the placed keys, the lane that placed each, and the lane each is charged to: the
    placing lane, except that a Fair front (`fair[0]`, the oldest request) of at least
    w x `step_tokens` work, one the paper's per-step rule would starve, is charged to the Fair
    lane whichever lane places it. That changes no placement of the merge itself (its ledgers are
    the paper's), only what the step's tokens are booked as: without it the Fast lane would pay
    w x a whole chunk of the long front whenever its score put the front next (a running
    prefill's computed tokens raise its score), and the hits behind it would wait up to w steps
    while the Fair lane caught up.

    `fit` (with `step_tokens`): the Fast lane starts only what it finishes in the step. While
    the work placed so far is below `step_tokens`, a Fast-lane request whose work exceeds what
    is left is passed over by the Fast lane (it stays in the Fair lane, in its place there) and
    its key is added to `skipped`. Every partial start of a step is then the Fair lane's.

    `rest` False (with `slots`): stop once the running prefills are placed after the slots,
    leaving the other waiting requests unplaced (a caller that orders only that far).

    `turn_past` (given a lane prefix that the Fast lane may use up by passing over): the first
    time the Fast lane's turn comes with every key of `fast` placed or passed over, the room the
    step has left then is appended (its tokens minus the work placed; -inf when the fit test no
    longer applies, the step being full). The whole lane's merge would read its next key there:
    if no key beyond the prefix has work within that room, it passes over all of them and the
    Fast lane is done in both merges, so the prefix's merge is the whole lane's (the caller's
    test, `FairwayPolicy.ordering`).
    """
    placed: set[int] = set()
    keys: list[int] = []
    lanes: list[str] = []
    charged: list[str] = []
    if not fast or not fair:
        return keys, lanes, charged
    if ledgers is None:
        ledger = [weight * float(work[fast[0]]), float(work[fair[0]])]
    else:
        ledger = list(ledgers)
    front = fair[0]
    long_front = step_tokens is not None and float(work[front]) >= weight * step_tokens
    passed = set() if skipped is None else skipped
    gone_fast = placed | passed  # what the Fast lane skips: placed or passed over
    check_fit = fit and step_tokens is not None
    tokens = float(step_tokens) if step_tokens is not None else 0.0
    placed_work = 0.0
    waiting = 0
    # speed: lookups hoisted out of the loop (one set of what the Fast lane skips, counters kept,
    # no len() per turn): part of `fairway.ordering`'s 0.49 -> 0.46 ms (see there)

    def run(
        fast_keys: Sequence[int], fair_keys: Sequence[int], waiting_limit: int | None,
        whole_fast: bool = True,
    ) -> None:
        nonlocal placed_work, waiting
        n_fast, n_fair = len(fast_keys), len(fair_keys)
        limit = sys.maxsize if waiting_limit is None else waiting_limit
        fast_pos = fair_pos = 0
        while waiting < limit:
            while fast_pos < n_fast and fast_keys[fast_pos] in gone_fast:
                fast_pos += 1
            while fair_pos < n_fair and fair_keys[fair_pos] in placed:
                fair_pos += 1
            if fair_pos == n_fair or (fast_pos == n_fast and not passed):
                return
            if fast_pos < n_fast and ledger[0] <= ledger[1]:
                key = fast_keys[fast_pos]
                amount = float(work[key])
                if check_fit and placed_work < tokens and amount > tokens - placed_work:
                    passed.add(key)  # the Fast lane would start what it cannot finish: pass it
                    gone_fast.add(key)
                    continue
                ledger[0] += weight * amount
                lanes.append(FAST)
                charged.append(FAIR if key == front and long_front else FAST)
            else:
                if (fast_pos == n_fast and whole_fast and turn_past is not None
                        and not turn_past and ledger[0] <= ledger[1]):
                    room = tokens - placed_work
                    turn_past.append(room if check_fit and room > 0 else -math.inf)
                key = fair_keys[fair_pos]
                amount = float(work[key])
                ledger[1] += amount
                lanes.append(FAIR)
                charged.append(FAIR)
            placed.add(key)
            gone_fast.add(key)
            keys.append(key)
            placed_work += amount
            waiting += key >= 0

    if slots is None:
        run(fast, fair, None)
    else:
        run(fast, fair, max(0, slots))
        run([k for k in fast if k < 0], [k for k in fair if k < 0], None, whole_fast=False)
        if rest:
            run(fast, fair, None)
    return keys, lanes, charged


# --- the first entries of a lane, without sorting the whole queue ---------------------------------
# The merge reads each lane only at its first entry not yet placed, so k placements read at most
# the first k entries of each lane: a partial selection (O(n)) of those rows, every row tied with
# the k-th kept, then sorted by the lane's own keys, gives exactly the whole lane's first k.
# speed: scheduler_overhead.py busy 10000 fairway-step: 1.96 ms -> 0.54 ms per step (vs sorts)


def fast_lane_head(scores: np.ndarray, arrival: np.ndarray, head: int,
                   bound: HeadBound | None = None) -> np.ndarray:
    """The first `head` rows of the Fast lane whose scores are `scores` (`bound`: see there)."""
    n = len(scores)
    rows: np.ndarray | None
    if head >= n:
        rows = np.arange(n)
    elif head <= 0:
        return np.arange(0)
    else:
        rows = None if bound is None else bound.rows(scores, head, smallest=False)
        if rows is None:
            rows = largest_rows(scores, head)
    # score descending, then older; lexsort is stable, so row order breaks the last tie
    ordered: np.ndarray = rows[np.lexsort((arrival[rows], -scores[rows]))][:head]
    return ordered


def fair_lane_head(arrival: np.ndarray, head: int, bound: HeadBound | None = None) -> np.ndarray:
    """The first `head` rows of the Fair lane: arrival order, ties in row order (`bound`: see
    there)."""
    if head <= 0:
        return np.zeros(0, np.intp)
    rows = (None if bound is None or head >= len(arrival)
            else bound.rows(arrival, head, smallest=True))
    if rows is None:
        rows = smallest_rows(arrival, head)
    return rows[np.argsort(arrival[rows], kind="stable")][:head]


@dataclass(slots=True)
class HeadBound:
    """A lane head's bound kept from one step to the next: the rows within it are the candidates.

    The first `head` rows of a lane are among the rows whose key is within any bound that at
    least `head` rows reach (every row tied with the head-th too), whatever changed since the
    bound was set; so a bound is only a filter, and the lane head found through it is exact. A
    step reads the rows within the bound (one comparison) and sorts just them, instead of
    selecting the head from the whole queue (`smallest_rows`, `largest_rows`: several numpy
    calls). A new bound is set, `SLACK` x the head deep, when fewer than `head` rows reach the
    old one (the Fair lane: its oldest left) or more than `SLACK` x `SLACK` x `head` do (the
    Fast lane: every waiting request's score rises with its wait), or more than half the queue;
    its rows are then the step's answer, so a step selects at most once. A head of a quarter of
    the queue or more keeps no bound (one `SLACK` x as deep would pass over half of it), nor does
    a NaN score (it counts as the largest): the selection answers.
    """

    # speed: Fairway's own step at 1,000 waiting, the same node switched step by step, 1,200
    # steps: 0.343 -> 0.323 ms prefilling, 0.371 -> 0.360 admitting, 0.350 -> 0.327 busy
    # (1.03-1.07 x); at 10,000 prefilling 0.787 -> 0.727 (1.08 x), admitting and busy 0.97 and
    # 1.12 x over 23-127 steps (`benchmarks/token_reach.py --switch kept-bound`, docs/results.md
    # "Lane heads from a bound kept across steps")

    value: float = math.nan

    def rows(self, values: np.ndarray, head: int, smallest: bool) -> np.ndarray | None:
        """Rows (increasing) whose value is within the bound: a superset of the `head` smallest
        (largest); None when no bound holds them without holding too many (the caller selects
        the head). A bound that fails is replaced here, and its rows are the answer when it
        holds them: the selection that sets it is the step's only one. 1 <= head < len(values)."""
        if self.value == self.value:
            rows = self._within(values, head, smallest)
            if rows is not None:
                return rows
        deep = SLACK * head
        if deep >= len(values) // 2:  # a bound that deep passes over half the queue: none
            self.value = math.nan
            return None
        self.value = kth_smallest(values, deep) if smallest else kth_largest(values, deep + 1)
        return self._within(values, head, smallest) if self.value == self.value else None

    def _within(self, values: np.ndarray, head: int, smallest: bool) -> np.ndarray | None:
        """The rows within the bound, if at least `head` and at most min(half the queue,
        `SLACK` x `SLACK` x `head`) of them (and, for the largest, no NaN among them)."""
        if smallest:
            rows = np.flatnonzero(values <= self.value)
        else:  # NaN passes, so that a NaN anywhere is seen
            rows = np.flatnonzero(~(values < self.value))
        if head <= len(rows) <= min(len(values) // 2, SLACK * SLACK * head) and (
            smallest or not math.isnan(values[rows].sum())
        ):
            return rows
        return None


#: How deep a new `HeadBound` reaches, in heads (and SLACK^2 heads: when to set a new one).
SLACK = 2


def smallest_rows(key: np.ndarray, head: int) -> np.ndarray:
    """Rows whose `key` is among the `head` smallest, every row tied with the head-th included,
    in increasing row order (so a stable sort of them keeps queue position as the last tie)."""
    n = len(key)
    if head >= n:
        return np.arange(n)
    rows = _bounded_rows(key, head, smallest=True)
    if rows is None:
        return (key <= kth_smallest(key, head - 1)).nonzero()[0]
    near = key[rows]
    kth = _kth(near, head - 1)
    kept: np.ndarray = rows[near <= kth]
    return kept


def largest_rows(values: np.ndarray, head: int) -> np.ndarray:
    """Rows whose value is among the `head` largest (NaN counting as the largest, but never
    kept), every row tied with the head-th included, in increasing row order; 1 <= head < n."""
    rows = _bounded_rows(values, head, smallest=False)
    if rows is None:
        return (values >= kth_largest(values, head)).nonzero()[0]
    near = values[rows]
    kth = _kth(near, len(near) - head)
    kept: np.ndarray = rows[near >= kth]
    return kept


#: A selection of the k smallest (largest) of more than LEAD_MIN values first finds a bound that
#: at least k values reach and at most half do, and partitions only the values within it. Two
#: bounds are tried: the k-th smallest (largest) of the first LEAD_FACTOR x k values (the queue's
#: first rows hold the requests placed at the last step, so few values pass it), then that of an
#: evenly spaced sample of about SAMPLE values (a queue in any order: about k + a few x the
#: spacing pass it), the tighter first. Exact for any values: a bound is never past the answer,
#: and a bound that fewer than k values reach is not used.
#: # speed: `benchmarks/token_reach.py --switch lane-bound` (see docs/results.md); the sample's
#: # bound: `fair_lane_head`, 20 rows of 10,000 shuffled arrivals, 38.5 -> 15.5 us per call
#: # (the first rows' bound only, which a shuffled queue defeats; benchmarks/call_costs.py)
LEAD_MIN = 256
LEAD_FACTOR = 2
SAMPLE = 128


def _bounds(values: np.ndarray, count: int, smallest: bool) -> list[float]:
    """The bounds `_bounded_rows` tries: from the first rows, then from a sample."""
    n = len(values)
    bounds: list[float] = []
    lead = LEAD_FACTOR * count
    if lead <= n // 2:
        first = values[:lead].copy()
        at = count - 1 if smallest else lead - count
        first.partition(at)
        bounds.append(first[at])
    sample = values[:: max(1, n // SAMPLE)].copy()
    size = len(sample)
    share = count * size / n  # sampled values expected among the `count` smallest (largest)
    rank = int(share + 2.0 * math.sqrt(share) + 2.0)  # a few past that, so that >= count pass
    if rank < size:
        at = rank if smallest else size - 1 - rank
        sample.partition(at)
        bounds.append(sample[at])
    return bounds


def _bounded_rows(values: np.ndarray, count: int, smallest: bool) -> np.ndarray | None:
    """The rows (increasing) of the values at or within a bound that at least `count` and at
    most half of the values reach (`_bounds`): they hold the `count` smallest (largest, NaN
    counting as the largest); None when no bound does."""
    n = len(values)
    if n <= LEAD_MIN:
        return None
    # the tighter bound first; a NaN bound would pass nothing (smallest) or every value
    bounds = sorted((b for b in _bounds(values, count, smallest) if b == b), reverse=not smallest)
    for bound in bounds:
        # NaN passes a finite bound of the largest values (NaN counts as the largest): as a sort
        rows = np.flatnonzero(values <= bound if smallest else ~(values < bound))
        if count <= len(rows) <= n // 2:
            return rows
    return None


def _kth(values: np.ndarray, k: int) -> float:
    """The value at position `k` of `values` sorted (NaN last), by a partition of a copy."""
    part = values.copy()
    part.partition(k)
    return float(part[k])


def kth_smallest(values: np.ndarray, k: int) -> float:
    """The value at position `k` of `values` sorted (NaN last): a partition, O(n), of the
    values within a bound when one is found (`_bounded_rows`)."""
    rows = _bounded_rows(values, k + 1, smallest=True)
    return _kth(values if rows is None else values[rows], k)


def kth_largest(values: np.ndarray, k: int) -> float:
    """The value at position `len(values) - k` of `values` sorted (NaN last), 1 <= k <= n: the
    k-th largest, NaN counting as the largest (`_bounded_rows`)."""
    rows = _bounded_rows(values, k, smallest=False)
    near = values if rows is None else values[rows]
    return _kth(near, len(near) - k)
