"""Fairway: the Fast lane (cache benefit + relative wait) and the oldest request share every step.

Must not import vllm. Registered as `fairway`. The seed's per-step rule is `fairway-step`
(`fairway.policies.fairway_step`); both use the same Fast-lane score (`FastScore`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import ClassVar, NamedTuple

import numpy as np

from fairway.policies.base import (
    UNPLACED_LANE,
    PrefillingRequest,
    QueuedRequest,
    StepBudget,
    StepShare,
    register_policy,
)
from fairway.policies.columns import HeadOrder, QueueColumns, head_order
from fairway.policies.fairway_step import FastScore, _by_lane_keys, _Columns, _lane_top
from fairway.policies.share import NO_CAP, ShareLedger, _plan


@dataclass(slots=True)
class _Pending:
    """What one step's share promised, booked against the tokens vLLM scheduled."""

    front_id: str
    owed_fair: int
    owed_fast: int
    budget: int


class _Front(NamedTuple):
    """O, the Fair lane's front: a running prefill (`row` None) or the waiting request in `row`."""

    request_id: str
    demand: int  # its remaining uncached prompt tokens
    row: int | None


@dataclass(slots=True)
class _Lane:
    """One step's Fast lane as the split reads it (`_fast_prefix`): the queue's columns and
    scores, the lane's first entries but the front (`rest`) and their work as floats."""

    cols: _Columns
    scores: np.ndarray
    rest: np.ndarray
    work: list[float]


@register_policy("fairway")
@dataclass(eq=False)
class FairwayPolicy(FastScore):
    """A token share between the oldest request and the Fast lane that holds across steps.

    Lanes. The Fair lane's front O is the oldest request (by arrival, then running before waiting,
    then queue position) whose prefill is not finished: waiting, or running with a chunked prefill
    in progress. Every other waiting or prefilling request is in the Fast lane, ordered by
    `FastScore` (s = h / max(c, 1) + wait / SLO).

    The guarantee. Per step, let B be the token budget, P = B minus the tokens the running decodes
    need, w = fast_weight, F = floor(P / (1 + w)), d_O = O's remaining uncached prompt tokens,
    and D the Fast lane's remaining tokens (requests the engine can start this step). If
    d_O + D <= P, nothing is changed: no cap, vLLM's own result (O is first in the waiting order).
    Otherwise (a contested step):

    * O is scheduled at least a = min(d_O, E) tokens, E = clamp(F + fair deficit - fast deficit,
      F, P) >= F: so at least min(d_O, F) in every contested step until its prefill ends;
    * the other P - a tokens go in Fast-score order over every prefill candidate, O's remaining
      d_O - a included at O's own score (`_by_score`): while the Fast lane's requests outscore O
      they get at least min(D, P - a); when O outscores them (misses only, the oldest first), O
      gets the step. Running prefills this order does not reach are held back for the step.
      Exception: when O runs and the requests owed tokens wait, vLLM serves O first, so O may
      get more in that step (the Fast ledger books the shortfall);
    * the step is work-conserving: prefills get min(P, their demand) tokens in all, except a
      rounding remainder smaller than one request's cap where the prefills ahead of O are held
      back (below) or capped.

    Ledgers (`ShareLedger`): persistent across steps, fed with the prefill tokens vLLM scheduled
    per request (`on_step_end(..., prefill_by_request=...)`), reset when a step is not contested.
    A Fair deficit (O got less than min(d_O, F), e.g. its KV blocks did not fit) raises O's
    entitlement in the next contested steps.

    How (a plan per step, `fairway.policies.share.plan_step`, applied by the scheduler): one
    per-request cap for the step (vLLM's `long_prefill_token_threshold`, set for the step only)
    and O's place in vLLM's scan: O first in the waiting order, or last (after the Fast-lane
    waiting requests); when O runs, which Fast-lane prefills run before it this step. When O waits
    and the running Fast-lane prefills (served first by vLLM) would take more than P - a, the
    newest of them are held back for the step.

    Exceptions (the scan stops or skips before O in vLLM): O's KV blocks do not fit (vLLM's
    scan stops; the Fair deficit carries it to later steps); a preemption in the step (vLLM then
    admits nothing from the waiting queue); max_num_seqs reached (no waiting request can start);
    requests served before the policy's order (preempted ones kept at the head, KV-connector
    loads); chunked prefill off (order only); spec decode (decode tokens estimated as one each).

    Caller's contract: call `step_share()` before every step (also when only prefills run) and
    `on_step_end(..., prefill_by_request=)` after it; `order()` alone gives the waiting order
    (O first, then the Fast lane) without a split.
    """

    needs_cache_hits: ClassVar[bool] = True
    stateful: ClassVar[bool] = True
    shares_steps: ClassVar[bool] = True
    #: `step_share` also takes `QueueColumns` (the scheduler then skips building views).
    step_share_columns: ClassVar[bool] = True

    ledger: ShareLedger = field(init=False, repr=False, default_factory=ShareLedger)
    last_lanes: list[str] = field(init=False, repr=False, default_factory=list)
    #: The last step's share (None before the first step).
    last_share: StepShare | None = field(init=False, repr=False, default=None)
    _pending: _Pending | None = field(init=False, repr=False, default=None)
    #: Patience (SLO) by prompt length for the running prefills' scores, and the profile it is
    #: for: a running prefill's L does not change, so T(L) is interpolated once per length.
    _units: dict[int, float] = field(init=False, repr=False, default_factory=dict)
    _units_profile: object = field(init=False, repr=False, default=None)

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        return np.asarray(self.step_share(queue, (), None, now).waiting_order).tolist()

    def step_share(
        self,
        waiting: Sequence[QueuedRequest] | QueueColumns,
        prefilling: Sequence[PrefillingRequest],
        budget: StepBudget | None,
        now: float,
    ) -> StepShare:
        """The step's plan. `waiting` may be `QueueColumns` (the scheduler's numpy path):
        per-request Python work is then limited to the requests that can get tokens this step,
        and the waiting order is an intp array (no per-request Python objects)."""
        queue = waiting if isinstance(waiting, QueueColumns) else QueueColumns.of(waiting)
        n = len(queue)
        cols = _Columns.of_columns(queue)
        front_wait, front_run = _front(queue, prefilling)
        scan = budget.scan if budget is not None else None
        scores = self._scores(cols, now) if n else np.zeros(0)
        rest, partial, work = _fast_prefix(
            cols, scores, front_wait, budget, n if scan is None else scan
        )
        # O (if it waits), the lane's prefix, the other rows in row order (`order_head`)
        order = rest if front_wait is None else np.concatenate(([front_wait], rest))
        if partial:
            order = head_order(order, n)
        self._pending = None
        share = None
        if budget is not None and front_run is not None:
            o = prefilling[front_run]
            front = _Front(o.request_id, o.remaining, None)
        elif budget is not None and front_wait is not None:
            front = _Front(queue.ids_of([front_wait])[0], int(cols.work[front_wait]), front_wait)
        else:
            front = None
        if budget is not None and front is not None:
            share = self._split(
                order, front, _Lane(cols, scores, rest, work), prefilling, budget, now
            )
        self.last_lanes = _lanes(n, len(rest) + (front_wait is not None), front_wait, share)
        self.last_share = share = share or StepShare(order)
        return share

    def _split(
        self,
        order: np.ndarray | HeadOrder,
        front: _Front,
        lane: _Lane,
        prefilling: Sequence[PrefillingRequest],
        budget: StepBudget,
        now: float,
    ) -> StepShare:
        """The contested step's plan; an uncontested step resets the ledgers.

        Only the first `free_slots` Fast-lane waiting requests can start this step (vLLM's scan
        stops at the slot limit), so only their demands go into the plan (`_plan`, over plain
        ints); the largest demand of the others (never granted: the slots are gone by then) is
        computed only if the plan asks for it (it keeps the water level's fallback as with the
        whole queue).
        """
        front_id, front_demand, front_row = front
        free = budget.free_slots
        waiting, unreached = _step_head(lane.work, free, lane.rest, lane.cols.work, front_row)
        fast = [request for request in prefilling if request.request_id != front_id]
        ahead = list(budget.ahead)
        p = max(0, budget.tokens)
        slots = max(0, free - (0 if front_row is None else 1))
        reached = (ahead + waiting)[:slots]
        fast_demand = min(NO_CAP, sum([request.remaining for request in fast]) + sum(reached))
        floor = math.floor(p / (1.0 + self.fast_weight))
        if fast_demand == 0 or front_demand + fast_demand <= p or p == 0:
            self.ledger.reset()
            return StepShare(order, front_id, budget=p, floor=floor, front_demand=front_demand)
        target = min(front_demand, self.ledger.entitlement(floor, p))
        rest_budget = max(0, p - target - sum(ahead))
        extra, held = self._by_score(front, target, lane, prefilling, rest_budget, now)
        target += extra
        if held:
            fast = [request for request in fast if request.request_id not in held]
        running = [request.remaining for request in fast]
        plan = _plan(
            front_demand, front_row is not None, running, ahead, waiting, p, free, target, unreached
        )
        owed_fair, owed_fast = min(front_demand, floor), min(fast_demand, p - target)
        self._pending = _Pending(front_id, owed_fair, owed_fast, p)
        if front_row is not None and not plan.front_first:  # O behind everyone
            full = np.asarray(order)
            order = np.concatenate((full[1:], full[:1]))
        return StepShare(
            order,
            front_id,
            cap=min(plan.cap, p),
            running_first=tuple(request.request_id for request in fast[: plan.first]),
            hold=frozenset(r.request_id for r in fast[len(fast) - plan.hold :]) | held,
            budget=p,
            floor=floor,
            target=target,
            front_demand=front_demand,
        )

    def _by_score(
        self,
        front: _Front,
        target: int,
        lane: _Lane,
        prefilling: Sequence[PrefillingRequest],
        tokens: int,
        now: float,
    ) -> tuple[int, frozenset[str]]:
        """Hand out the tokens beyond O's share in Fast-score order, O included by its own score.

        Returns O's extra tokens and the running prefills that get nothing (held back for the
        step: vLLM would otherwise serve them first, ahead of better-scored waiting requests).
        The tokens run out within the shortest prefix of the Fast lane (`rest`, already in this
        order) whose demand covers them, so only that prefix can matter; the others are left out.
        """
        front_id, front_demand, front_row = front
        covered = _covering(lane.work, tokens)
        scores, arrival = _score_rows(lane, lane.rest[:covered])
        # (-score, arrival, tie, id, demand, running?), sorted as tuples: by score descending,
        # then arrival, then `tie` (insertion order, unique: a stable sort, and the rest of the
        # tuple is never compared); a waiting request's id is never read (None)
        entries = [
            (-s, a, i, None, int(w), False)
            for i, (s, a, w) in enumerate(zip(scores, arrival, lane.work[:covered], strict=True))
        ]
        entries += [
            (-score, p.arrival, tie, p.request_id, p.remaining, True)
            for tie, p, score in zip(
                count(covered), prefilling, self._prefill_scores(prefilling, now), strict=False
            )
        ]
        if front_row is not None:
            score, arrival_o = lane.scores.item(front_row), lane.cols.arrival.item(front_row)
            entries.append((-score, arrival_o, len(entries), front_id, front_demand, False))
        entries.sort()
        extra, held = 0, []
        for i, (_, _, _, request_id, demand, running) in enumerate(entries):
            if request_id == front_id:  # O's demand beyond its target
                demand -= target
            given = 0 if demand < 0 else demand if demand < tokens else tokens
            tokens -= given
            if request_id == front_id:
                extra = given
            elif running and given == 0:
                held.append(request_id)
            if tokens == 0:  # the others get nothing: the running ones but O are held back
                held += [e[3] for e in entries[i + 1 :] if e[5] and e[3] != front_id]
                break
        return extra, frozenset(held)

    def _prefill_scores(self, prefilling: Sequence[PrefillingRequest], now: float) -> list[float]:
        """The running prefills' Fast scores, the tokens already computed playing the cached part:
        what `_scores` gives for their columns, in scalar math (a handful of requests: numpy's
        per-call cost would dominate; float64 operations give numpy's elementwise results
        bit for bit). T(L) for the SLO still comes from the profile's array form, in one call."""
        if not prefilling:
            return []
        if self.profile is None:
            units = [self.patience_floor_s] * len(prefilling)
        else:
            units = self._units_of([p.prompt_tokens for p in prefilling])
        scores = []
        for p, unit in zip(prefilling, units, strict=True):  # max() as conditionals: cheaper
            remaining, wait = p.remaining, now - p.arrival
            computed = (p.prompt_tokens - remaining) / (1.0 if remaining < 1.0 else remaining)
            scores.append(computed + (0.0 if wait < 0.0 else wait) / unit)
        return scores

    def _units_of(self, prompts: list[int]) -> list[float]:
        """The patience of each prompt length, from the memo (`_units`); the lengths it lacks in
        one call of `_patience` (elementwise, so a length gets the same float in any batch)."""
        memo = self._units
        if self._units_profile is not self.profile or len(memo) > _MAX_UNITS:
            memo.clear()
            self._units_profile = self.profile
        missing = [length for length in prompts if length not in memo]
        if missing:
            units = self._patience(np.array(missing, np.float64)).tolist()
            memo.update(zip(missing, units, strict=True))
        return [memo[length] for length in prompts]

    def idle_step(self) -> None:
        """No prefill can run this step: not contested, as `step_share` would find (no Fast
        demand), so the ledgers reset and nothing is pending."""
        self.ledger.reset()
        self._pending = None
        self.last_share = None

    def on_step_end(
        self,
        admitted_ids: Sequence[str],
        prefill_tokens: int,
        prefill_by_request: Mapping[str, int] | None = None,
    ) -> None:
        """Book the step's scheduled prefill tokens in the ledgers (contested steps only)."""
        pending, self._pending = self._pending, None
        if pending is None or prefill_by_request is None:
            return
        got_fair = prefill_by_request.get(pending.front_id, 0)
        got_fast = sum(prefill_by_request.values()) - got_fair
        self.ledger.record(pending.owed_fair, got_fair, pending.owed_fast, got_fast, pending.budget)


#: `FairwayPolicy._units` is cleared when it holds more prompt lengths than this.
_MAX_UNITS = 4096


def _front(
    waiting: QueueColumns, prefilling: Sequence[PrefillingRequest]
) -> tuple[int | None, int | None]:
    """O: (index in `waiting`, None) or (None, index in `prefilling`); both None: no request."""
    best_wait = waiting.oldest_row if len(waiting) else None  # first of equals
    arrivals = [p.arrival for p in prefilling]
    best_run = arrivals.index(min(arrivals)) if arrivals else None  # first of equals
    if best_run is not None and (
        best_wait is None or arrivals[best_run] <= waiting.arrival.item(best_wait)
    ):
        return None, best_run
    return best_wait, None


def _lanes(n: int, placed: int, front: int | None, share: StepShare | None) -> list[str]:
    """Lane labels of the waiting order's positions: the `placed` head "fast", the other rows
    `UNPLACED_LANE`; O, when it waits and the step is split, "fair" wherever `_split` put it
    (first, or moved behind everyone: the rotation moves the labels with it)."""
    lanes = ["fast"] * placed
    lanes += [UNPLACED_LANE] * (n - placed)
    if front is not None and share is not None:
        if share.waiting_order[0] == front:
            lanes[0] = "fair"
        else:
            del lanes[0]
            lanes.append("fair")
    return lanes


def _score_rows(lane: _Lane, rows: np.ndarray) -> tuple[list[float], list[float]]:
    """The scores and arrivals of these rows: element by element for the few rows a step's
    tokens usually cover (each numpy call costs more than a handful of `item`s), else gathered."""
    if len(rows) > 8:
        return lane.scores[rows].tolist(), lane.cols.arrival[rows].tolist()
    scores, arrival = lane.scores.item, lane.cols.arrival.item
    indices = rows.tolist()
    return [scores(i) for i in indices], [arrival(i) for i in indices]


def _covering(work: list[float], tokens: int) -> int:
    """The length of the shortest prefix of the lane whose `work` covers `tokens` (the tokens
    run out within it; all of `work` if it never does)."""
    covered = 0.0
    for length, amount in enumerate(work, 1):
        covered += amount
        if covered >= tokens:
            return length
    return len(work)


def _step_head(
    work: list[float], free: int, rest: np.ndarray, all_work: np.ndarray, front: int | None
) -> tuple[list[int], Callable[[], int]]:
    """The demands of the first `free` Fast-lane waiting requests (`work` is the lane's, from
    `_fast_prefix`): vLLM's scan can start no more than `free` of them; and the largest demand
    of every other row but the front, asked for lazily (`_largest_past`)."""
    head = max(0, free)
    if head > _MANY_SLOTS:  # many free slots (a large max_num_seqs): convert in numpy
        demands = all_work[rest[:head]].astype(np.int64).tolist()
    else:
        demands = list(map(int, work[:head]))
    return demands, _largest_past(all_work, rest[:head], front)


#: `_step_head` converts the demands of more free slots than this in numpy (same ints: positive
#: whole floats below 2**53 truncate alike).
_MANY_SLOTS = 16


def _largest_past(work: np.ndarray, head: np.ndarray, front: int | None) -> Callable[[], int]:
    """The largest work of the rows outside `head` and the front (0 if none), computed on the
    first call only: the plan rarely needs it, and it is an O(n) pass."""
    memo: list[int] = []

    def largest() -> int:
        if not memo:
            excluded = head if front is None else np.append(head, front)  # distinct rows
            memo.append(int(_max_outside(work, excluded)) if len(excluded) < len(work) else 0)
        return memo[0]

    return largest


def _max_outside(values: np.ndarray, excluded: np.ndarray) -> float:
    """max(values) over the rows not in `excluded` (distinct, fewer than all rows). The
    largest value usually lies outside the few excluded rows: then no n-sized mask is built."""
    largest = values.max()
    if not (values[excluded] == largest).any():
        return float(largest)
    others = np.ones(len(values), dtype=bool)
    others[excluded] = False
    return float(values[others].max())


#: The first prefix `_fast_prefix` tries (grown 4x while too short): a few more rows than a
#: step with 16 free slots reads; each row of the prefix is sorted, moved and checked every step.
_MIN_PREFIX = 16


def _fast_prefix(
    cols: _Columns,
    scores: np.ndarray,
    front: int | None,
    budget: StepBudget | None,
    scan: int,
) -> tuple[np.ndarray, bool, list[float]]:
    """The Fast lane's first entries but the front (`rest`), exactly (descending score, then
    older, then position): the whole lane, or a prefix long enough for everything the step's
    plan reads; whether it is only a prefix (the other rows then follow in row order, the
    front's place aside: `HeadOrder`); and the work of `rest`'s first entries, as floats
    (`_lane_work`).

    The plan reads the first `free_slots` requests after the front (`_step_head`), the shortest
    prefix whose work covers the step's tokens (`_covering`, at most P) and the first `scan`
    positions of the order (vLLM's scan reaches no further). A prefix found by partial selection
    (`_lane_top`: every row tied with the last one kept, then sorted by the lane's keys) is grown
    until it holds all three; O(n) numpy per try and a sort of the prefix."""
    n = len(scores)
    if budget is None or scan >= n:
        rest = _without(np.lexsort((cols.arrival, -scores)), front)
        return rest, False, _lane_work(cols.work, rest, budget)
    need = max(scan, budget.free_slots) + 1  # + 1: the front may sit among them
    k = min(n, max(need, _MIN_PREFIX))
    while True:
        top, kept = _lane_top(scores, k)
        fast = _by_lane_keys(top, scores, cols.arrival)
        rest = _without(fast[:k], front)
        if kept is None:  # k >= n: the whole lane
            return rest, False, _lane_work(cols.work, rest, budget)
        if len(rest) >= need - 1:
            work = cols.work[rest].tolist()
            if sum(work) >= max(0, budget.tokens):
                return rest, True, work
        k = min(n, 4 * k)


def _without(rows: np.ndarray, front: int | None) -> np.ndarray:
    return rows[rows != front] if front is not None else rows


def _lane_work(work: np.ndarray, rest: np.ndarray, budget: StepBudget | None) -> list[float]:
    """The work of the whole lane's first max(free_slots, P) + 1 entries: the plan reads no
    further (`_step_head` reads free_slots, and each entry's work is at least 1, so P + 1 of
    them cover P tokens, `_covering`). None without a budget (no plan)."""
    if budget is None:
        return []
    return work[rest[: max(budget.free_slots, budget.tokens, 0) + 1]].tolist()
