"""Fairway: the Fast lane (cache benefit + relative wait) and the oldest request share every step.

Must not import vllm. Registered as `fairway`. The seed's per-step rule is `fairway-step`
(`fairway.policies.fairway_step`); both use the same Fast-lane score (`FastScore`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fairway.policies.base import (
    UNPLACED_LANE,
    PrefillingRequest,
    QueuedRequest,
    StepBudget,
    StepShare,
    register_policy,
)
from fairway.policies.columns import QueueColumns
from fairway.policies.fairway_step import FastScore, _Columns, _lane_head
from fairway.policies.share import Item, ShareLedger, demand_served, plan_step


@dataclass(slots=True)
class _Pending:
    """What one step's share promised, booked against the tokens vLLM scheduled."""

    front_id: str
    owed_fair: int
    owed_fast: int
    budget: int


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
        fast = _fast_prefix(cols, -scores, front_wait, budget, n if scan is None else scan)
        rest = fast[fast != front_wait] if front_wait is not None else fast
        lead = np.array([] if front_wait is None else [front_wait], dtype=np.intp)
        if len(fast) == n:  # the whole lane: the order the policy defines
            share = StepShare(np.concatenate((lead, rest)))
        else:  # the head vLLM's scan can reach exactly, the others in row order (`order_head`)
            placed = np.zeros(n, dtype=bool)
            placed[rest] = True
            placed[lead] = True
            share = StepShare(np.concatenate((lead, rest, np.flatnonzero(~placed))))
        self._pending = None
        if front_run is not None:
            front = Item(prefilling[front_run].request_id, prefilling[front_run].remaining, False)
        elif front_wait is not None:
            front_id = queue.ids_of([front_wait])[0]
            front = Item(front_id, int(cols.work[front_wait]), True)
        else:
            front = None
        if budget is not None and front is not None:
            share = self._split(share, front, queue, cols, scores, rest, prefilling, budget, now)
        lanes = ["fast"] * (len(lead) + len(rest)) + [UNPLACED_LANE] * (n - len(lead) - len(rest))
        if front_wait is not None and share.front_id == front.request_id:  # type: ignore[union-attr]
            if share.waiting_order[0] == front_wait:
                lanes[0] = "fair"
            else:  # moved behind everyone (`_split`): the rotation moves the labels with it
                lanes = lanes[1:] + ["fair"]
        self.last_lanes = lanes
        self.last_share = share
        return share

    def _split(
        self,
        share: StepShare,
        front: Item,
        queue: QueueColumns,
        cols: _Columns,
        scores: np.ndarray,
        rest: np.ndarray,
        prefilling: Sequence[PrefillingRequest],
        budget: StepBudget,
        now: float,
    ) -> StepShare:
        """The contested step's plan; an uncontested step resets the ledgers.

        Only the first `free_slots` Fast-lane waiting requests can start this step (vLLM's scan
        stops at the slot limit), so only they become `Item`s; one more item after them carries
        the largest demand of the others (never granted: the slots are gone by then; it keeps
        the caps' search ranges as with the whole queue).
        """
        lead = share.waiting_order[:1] if front.waiting else []  # the front's row
        waiting = _items(queue, cols, rest, max(0, budget.free_slots), lead)
        running = [
            Item(p.request_id, p.remaining, False)
            for p in prefilling
            if p.request_id != front.request_id
        ]
        ahead = [Item(i, d, True) for i, d in zip(budget.ahead_ids, budget.ahead, strict=True)]
        p = max(0, budget.tokens)
        slots = budget.free_slots - (1 if front.waiting else 0)
        fast_demand = demand_served([*running, *ahead, *waiting], max(0, slots))
        floor = math.floor(p / (1.0 + self.fast_weight))
        base = StepShare(
            share.waiting_order,
            front.request_id,
            budget=p,
            floor=floor,
            front_demand=front.demand,
        )
        if fast_demand == 0 or front.demand + fast_demand <= p or p == 0:
            self.ledger.reset()
            return base
        target = min(front.demand, self.ledger.entitlement(floor, p))
        rest_budget = max(0, p - target - sum(budget.ahead))
        extra, held = self._by_score(
            front, target, cols, scores, rest, prefilling, rest_budget, now
        )
        target += extra
        running = [item for item in running if item.request_id not in held]
        plan = plan_step(front, running, ahead, waiting, p, budget.free_slots, target)
        owed_fair = min(front.demand, floor)
        self._pending = _Pending(front.request_id, owed_fair, min(fast_demand, p - target), p)
        order = share.waiting_order
        if front.waiting and not plan.front_first:
            order = np.concatenate((order[1:], order[:1]))
        return StepShare(
            order,
            front.request_id,
            cap=min(plan.cap, p),
            running_first=plan.running_first,
            hold=plan.hold | held,
            budget=p,
            floor=floor,
            target=target,
            front_demand=front.demand,
        )

    def _by_score(
        self,
        front: Item,
        target: int,
        cols: _Columns,
        scores: np.ndarray,
        rest: np.ndarray,
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
        run_scores = self._scores(_running_columns(prefilling), now).tolist() if prefilling else []
        top = _covering(rest, cols.work, tokens)
        # (score, arrival, id, demand, running?); a waiting request's id is never read (None)
        entries: list[tuple[float, float, str | None, int, bool]] = [
            (s, a, None, int(w), False)
            for s, a, w in zip(
                scores[top].tolist(),
                cols.arrival[top].tolist(),
                cols.work[top].tolist(),
                strict=True,
            )
        ]
        for j, p in enumerate(prefilling):
            demand = p.remaining - (target if p.request_id == front.request_id else 0)
            entries.append((run_scores[j], p.arrival, p.request_id, demand, True))
        if front.waiting:
            i = int(np.argmin(cols.arrival))  # the front is the oldest waiting request
            entries.append(
                (
                    float(scores[i]),
                    float(cols.arrival[i]),
                    front.request_id,
                    front.demand - target,
                    False,
                )
            )
        entries.sort(key=lambda q: (-q[0], q[1]))
        extra, held = 0, set()
        for _, _, request_id, demand, running in entries:
            given = min(max(0, demand), tokens)
            tokens -= given
            if request_id == front.request_id:
                extra = given
            elif running and given == 0:
                held.add(request_id)
        return extra, frozenset(held)

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


def _front(
    waiting: QueueColumns, prefilling: Sequence[PrefillingRequest]
) -> tuple[int | None, int | None]:
    """O: (index in `waiting`, None) or (None, index in `prefilling`); both None: no request."""
    best_wait = int(np.argmin(waiting.arrival)) if len(waiting) else None  # first of equals
    best_run = min(range(len(prefilling)), key=lambda j: prefilling[j].arrival, default=None)
    if best_run is not None and (
        best_wait is None or prefilling[best_run].arrival <= waiting.arrival[best_wait]
    ):
        return None, best_run
    return best_wait, None


def _running_columns(prefilling: Sequence[PrefillingRequest]) -> _Columns:
    """Running prefills as score columns: the tokens already computed play the cached part
    (the same values `_Columns.of` gives for their `QueuedRequest` views)."""
    k = len(prefilling)
    arrival = np.fromiter((p.arrival for p in prefilling), np.float64, k)
    prompt = np.fromiter((p.prompt_tokens for p in prefilling), np.float64, k)
    remaining = np.fromiter((p.remaining for p in prefilling), np.float64, k)
    return _Columns(arrival, prompt, prompt - remaining, np.maximum(remaining, 1.0))


def _covering(rest: np.ndarray, work: np.ndarray, tokens: int) -> np.ndarray:
    """The shortest prefix of `rest` whose work covers `tokens` (the tokens run out within it)."""
    covered = np.searchsorted(np.cumsum(work[rest]), max(0, tokens))
    return rest[: int(covered) + 1]


def _items(
    queue: QueueColumns, cols: _Columns, rest: np.ndarray, slots: int, lead: np.ndarray | list[int]
) -> list[Item]:
    """The first `slots` Fast-lane waiting requests as `Item`s, then one with the largest
    demand of the rest (if any): vLLM's scan can start no more than `slots` of them. Their ids
    are left empty: a plan names only running requests (`running_first`, `hold`).

    `rest` may be a prefix of the lane (at least `slots` long unless it is all of it); the
    largest demand is taken over every row but the first `slots` and the front (`lead`)."""
    top = rest[:slots]
    demands = cols.work[top].astype(np.int64).tolist()
    items = [Item("", d, True) for d in demands]
    excluded = np.concatenate((top, np.asarray(lead, dtype=np.intp)))  # disjoint: `rest` has
    if len(excluded) < len(queue):  # no front
        items.append(Item("", int(_max_outside(cols.work, excluded)), True))
    return items


def _max_outside(values: np.ndarray, excluded: np.ndarray) -> float:
    """max(values) over the rows not in `excluded` (distinct, fewer than all rows). The
    largest value usually lies outside the few excluded rows: then no n-sized mask is built."""
    largest = values.max()
    if not (values[excluded] == largest).any():
        return float(largest)
    others = np.ones(len(values), dtype=bool)
    others[excluded] = False
    return float(values[others].max())


#: The first prefix `_fast_prefix` tries (grown 4x while too short).
_MIN_PREFIX = 64


def _fast_prefix(
    cols: _Columns,
    neg: np.ndarray,
    front: int | None,
    budget: StepBudget | None,
    scan: int,
) -> np.ndarray:
    """The Fast lane's first entries, exactly (descending score, then older, then position):
    the whole lane, or a prefix long enough for everything the step's plan reads.

    The plan reads the first `free_slots` requests after the front (`_items`), the shortest
    prefix whose work covers the step's tokens (`_covering`, at most P) and the first `scan`
    positions of the order (vLLM's scan reaches no further). A prefix found by partial selection
    (`_lane_head`: every row tied with the last one kept, then sorted by the lane's keys) is grown
    until it holds all three; O(n) numpy per try and a sort of the prefix."""
    n = len(neg)
    if budget is None or scan >= n:
        return np.lexsort((cols.arrival, neg))
    need = max(scan, budget.free_slots) + 1  # + 1: the front may sit among them
    k = min(n, max(need, _MIN_PREFIX))
    while True:
        fast = _lane_head(neg, cols.arrival, k)
        if k >= n:
            return fast
        rest = fast[fast != front] if front is not None else fast
        if len(rest) >= need - 1 and float(cols.work[rest].sum()) >= max(0, budget.tokens):
            return fast
        k = min(n, 4 * k)
