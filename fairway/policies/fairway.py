"""Fairway: the seed's two lanes and work charges, the charges carried across the steps of a
long Fair front.

Must not import vllm. Registered as `fairway`. The seed's per-step rule, ledgers reset every
step and running prefills left to vLLM, is `fairway-step` (`fairway.policies.fairway_step`); both
use the same Fast-lane score (`FastScore`) and the same merge.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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
from fairway.policies.columns import QueueColumns, head_order
from fairway.policies.fairway_step import FastScore, _Columns, _lane_head, _top

FAST, FAIR = "fast", "fair"


@dataclass(slots=True)
class LaneLedgers:
    """The two lanes' work charges, kept while steps stay contested.

    `fast` and `fair` are the ledgers the merge compares: the seed's start (w x the Fast front's
    work, the Fair front's work) plus, after each contested step, w x the prefill tokens vLLM
    scheduled for the requests the Fast lane placed and 1 x those of the Fair lane's. The token
    counts and `start_gap` (fast - fair at the start) make the guarantee checkable:
    w x fast_tokens - fair_tokens == (fast - fair) - start_gap.
    """

    fast: float = 0.0
    fair: float = 0.0
    fast_tokens: int = 0
    fair_tokens: int = 0
    #: Contested steps booked since the contest began (0: no contest).
    steps: int = 0
    start_gap: float = 0.0
    active: bool = False

    @property
    def gap(self) -> float:
        """D = fast - fair: the Fast lane goes first while D <= 0."""
        return self.fast - self.fair

    def start(self, fast: float, fair: float) -> None:
        self.fast, self.fair, self.start_gap, self.active = fast, fair, fast - fair, True
        self.fast_tokens = self.fair_tokens = self.steps = 0

    def charge(self, fast_tokens: int, fair_tokens: int, weight: float) -> None:
        self.fast += weight * fast_tokens
        self.fair += fair_tokens
        self.fast_tokens += fast_tokens
        self.fair_tokens += fair_tokens
        self.steps += 1

    def reset(self) -> None:
        self.fast = self.fair = self.start_gap = 0.0
        self.fast_tokens = self.fair_tokens = self.steps = 0
        self.active = False


def merge(
    fast: Sequence[int],
    fair: Sequence[int],
    work: Mapping[int, int] | Sequence[float] | np.ndarray,
    weight: float,
    ledgers: tuple[float, float] | None,
    slots: int | None = None,
    step_tokens: int | None = None,
) -> tuple[list[int], list[str], list[str]]:
    """The seed's merge of two lanes over the same requests.

    `fast` and `fair` list the same requests (keys; waiting rows >= 0, running prefills < 0) in
    each lane's order; `ledgers` are the (fast, fair) ledgers to start from, or None for the
    seed's start (w x the Fast front's work, the Fair front's work). The lane with the smaller
    ledger places its first request not yet placed and adds its work (x weight for Fast); ties
    go to Fast. Each lane is read only at its first entry not yet placed, so the merge of two
    lane prefixes equals the whole lanes' until one prefix is used up, where it stops.

    `slots`: the step can start at most this many waiting requests. Once they are placed, only
    the running prefills are placed (a waiting request without a slot gets nothing, so it must
    not move the ledgers ahead of them), then the other waiting requests as before.
    Returns the placed keys, the lane that placed each, and the lane each is charged to: the
    placing lane, except that a Fair front (`fair[0]`, the oldest request) of at least
    w x `step_tokens` work, one the seed's per-step rule would starve, is charged to the Fair
    lane whichever lane places it. That changes no placement of the merge itself (its ledgers are
    the seed's), only what the step's tokens are booked as: without it the Fast lane would pay
    w x a whole chunk of the long front whenever its score put the front next (a running
    prefill's computed tokens raise its score), and the hits behind it would wait up to w steps
    while the Fair lane caught up.
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

    def run(fast_keys: Sequence[int], fair_keys: Sequence[int], waiting_limit: int | None) -> None:
        fast_pos = fair_pos = 0
        waiting = sum(1 for k in keys if k >= 0)
        while waiting_limit is None or waiting < waiting_limit:
            while fast_pos < len(fast_keys) and fast_keys[fast_pos] in placed:
                fast_pos += 1
            while fair_pos < len(fair_keys) and fair_keys[fair_pos] in placed:
                fair_pos += 1
            if fast_pos == len(fast_keys) or fair_pos == len(fair_keys):
                return
            if ledger[0] <= ledger[1]:
                key = fast_keys[fast_pos]
                ledger[0] += weight * float(work[key])
                lanes.append(FAST)
                charged.append(FAIR if key == front and long_front else FAST)
            else:
                key = fair_keys[fair_pos]
                ledger[1] += float(work[key])
                lanes.append(FAIR)
                charged.append(FAIR)
            placed.add(key)
            keys.append(key)
            waiting += key >= 0

    if slots is None:
        run(fast, fair, None)
    else:
        run(fast, fair, max(0, slots))
        run([k for k in fast if k < 0], [k for k in fair if k < 0], None)
        run(fast, fair, None)
    return keys, lanes, charged


def grants(
    keys: Sequence[int], work: Mapping[int, int], tokens: int, slots: int
) -> list[int]:
    """Prefill tokens each placement gets when the step's `tokens` are given out in merge order:
    min(its work, what is left), a waiting request (key >= 0) only while `slots` last."""
    out: list[int] = []
    left = tokens
    for key in keys:
        if left <= 0 or (key >= 0 and slots <= 0):
            out.append(0)
            continue
        if key >= 0:
            slots -= 1
        given = min(work[key], left)
        out.append(given)
        left -= given
    return out


@register_policy("fairway")
@dataclass(eq=False)
class FairwayPolicy(FastScore):
    """The seed's two lanes and work charges over waiting and prefilling requests, carried
    across the steps a long Fair front needs.

    Lanes. Both lanes hold every request whose prefill is not finished: the waiting ones and the
    running ones in chunked prefill. Fast: `FastScore`'s order (s = h / max(c, 1) + wait / SLO; a
    running prefill's computed tokens play the cached part), running before waiting on a tie.
    Fair: arrival order, running before waiting on a tie. Each request is in both lanes and is
    served by whichever places it first.

    Merge (`merge`, the seed's): the lane with the smaller ledger places its next request not yet
    placed and adds its work (uncached tokens; x w = fast_weight for Fast); ties go to Fast.
    Once the step's free request slots are placed, only running prefills are placed (a waiting
    request without a slot gets nothing this step), then the rest of the queue. Each placed
    request is charged to the lane that placed it, except a Fair front (the oldest request) that
    the per-step rule would starve (work >= w P), which is always the Fair lane's.

    Contest. A step is contested when at least two requests compete, the two lanes' fronts
    differ, and their work exceeds P (the step's token budget minus the running decodes').
    Otherwise it is vLLM's own step (order by the seed's merge, nothing capped or held) and the
    ledgers restart. Ledgers start as the seed's (w x the Fast front's work, the Fair front's
    work); after each contested step each lane is charged the prefill tokens vLLM actually
    scheduled for the requests it placed (x w for Fast), and the next step's merge starts from
    the charged ledgers. They restart (the seed's start again) at every contested step whose
    Fair front needs less than one step (work < P): the seed's per-step rule already starts such
    a front in the step (at most its work / w goes ahead of it), so carrying is needed only for
    a front that needs several steps, which the per-step rule starves from w x P tokens on.

    Applying the step (`StepShare`, applied by the scheduler): the waiting queue in merge order;
    the prefilling running requests in merge order; the step's tokens given out in merge order
    (`grants`) decide the rest (vLLM serves running requests first, whatever the order): a
    running prefill that gets nothing is held back for the step, and the one the budget runs
    out on keeps its grant and no more (vLLM's per-request cap, `long_prefill_token_threshold`,
    set for the step to that grant). If a request placed before it would need more than that
    grant, the running prefill is held back instead (it loses less than that request's work,
    and its lane is charged only what it got). A cap on every running prefill at its lane's
    share of each step was measured and not kept (one E2 run of that variant): it changed
    nothing for hits behind a long miss once the Fair front is charged to its own lane, and it
    raised E2's p99s (up to 1.75 x `fairway-step`'s), making several long prefills share steps
    and all finish later.

    Guarantee (contested steps; w = fast_weight, P the step's prefill budget, D = fast - fair):
        * the lagging lane goes first: D <= 0, Fast's front is placed first; else Fair's;
        * while the ledgers carry, D stays within one chunk of the other lane: D <= 0 before a
          step gives D' <= max(D, w P) after it, D > 0 gives D' >= min(D, -P) (with exact
          admission: no KV-block stop, no preemption). The charges are the scheduled tokens, so
          over any run of carried steps w x (Fast tokens) - (Fair tokens) = D - D_0 stays within
          [-P, w P] of -D_0 (D_0 = the seed's start gap): the Fair lane gets w / (1 + w) of the
          tokens and the Fast lane 1 / (1 + w) while both have demand, each taking what the
          other does not use;
        * the Fair front O gets prefill tokens within ceil(max(0, -D) / (w P)) + 1 contested
          steps of becoming the front (each step the Fast lane goes first raises D by w x its
          tokens, and Fast takes the whole step only while its ledger stays below Fair's): for a
          new contest ceil(W_O / (w P)) + 1 steps, W_O its work; once the start gap is worked
          off, within 2 steps, whatever O's size;
        * on the first contested step after an uncontested one, with no running prefill, the
          waiting order equals `fairway-step`'s (the worked example holds for both).

    Caller's contract: call `step_share()` before every step (also when only prefills run) and
    `on_step_end(..., prefill_by_request=)` after it; `order()` alone gives the seed's order.
    """

    needs_cache_hits: ClassVar[bool] = True
    stateful: ClassVar[bool] = True
    shares_steps: ClassVar[bool] = True
    #: `step_share` also takes `QueueColumns` (the scheduler then skips building views).
    step_share_columns: ClassVar[bool] = True

    ledger: LaneLedgers = field(init=False, repr=False, default_factory=LaneLedgers)
    last_lanes: list[str] = field(init=False, repr=False, default_factory=list)
    #: The last step's decision (None before the first step).
    last_share: StepShare | None = field(init=False, repr=False, default=None)
    #: Lane of each request placed in a contested step, booked after the step.
    _pending: dict[str, str] | None = field(init=False, repr=False, default=None)
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
        """The step's order and split. `waiting` may be `QueueColumns` (the scheduler's path):
        only the rows either lane can place this step are read in Python."""
        queue = waiting if isinstance(waiting, QueueColumns) else QueueColumns.of(waiting)
        n, m = len(queue), len(prefilling)
        self._pending = None
        if n + m == 0:
            self.ledger.reset()
            self.last_lanes = []
            self.last_share = share = StepShare([])
            return share
        cols = _Columns.of_columns(queue)
        scores = self._scores(cols, now) if n else np.zeros(0)
        head = n if budget is None or budget.scan is None else min(n, budget.scan)
        reach = min(n, max(head, 1) + m)  # rows either lane may place in head + m placements
        fast_rows = _lane_head(scores, cols.arrival, reach) if n else np.zeros(0, np.intp)
        fair_rows = _oldest(cols.arrival, reach)
        work: dict[int, int] = {}
        for row, amount in zip(
            fast_rows.tolist() + fair_rows.tolist(),
            cols.work[fast_rows].tolist() + cols.work[fair_rows].tolist(),
            strict=True,
        ):
            work[row] = int(amount)
        for j, p in enumerate(prefilling):
            work[-(j + 1)] = max(1, p.remaining)
        fast = _with_running(
            fast_rows.tolist(),
            [(-s, p.arrival) for s, p in zip(self._prefill_scores(prefilling, now), prefilling,
                                              strict=True)],
            lambda row: (-scores.item(row), cols.arrival.item(row)),
        )
        fair = _with_running(
            fair_rows.tolist(),
            [(p.arrival,) for p in prefilling],
            lambda row: (cols.arrival.item(row),),
        )
        tokens = 0 if budget is None else max(0, budget.tokens - sum(budget.ahead))
        contested = (
            budget is not None
            and tokens > 0
            and n + m >= 2
            and fast[0] != fair[0]
            and float(cols.work.sum()) + sum(p.remaining for p in prefilling) > tokens
        )
        slots = None if budget is None else max(0, budget.free_slots - len(budget.ahead))
        if slots == 0 and m == 0:  # nothing can start or continue: the ledgers stay (idle_step)
            contested = False
        elif not contested:
            self.ledger.reset()
        elif not self.ledger.active or work[fair[0]] < tokens:
            # the seed's start; a Fair front that fits in one step is served by the seed's
            # per-step rule (at most its work / w goes ahead of it), so the carry restarts
            self.ledger.start(self.fast_weight * work[fast[0]], float(work[fair[0]]))
        start = (self.ledger.fast, self.ledger.fair) if contested else None
        # Placements until a lane's known prefix is used up: each is the whole queue's merge's;
        # every running prefill and at least `head` waiting rows are placed.
        keys, lanes, charged = merge(fast, fair, work, self.fast_weight, start, slots, tokens)
        share = self._share(
            queue, prefilling, slots, keys, lanes, charged, work, tokens, contested, fair
        )
        self.last_share = share
        return share

    def _share(
        self,
        queue: QueueColumns,
        prefilling: Sequence[PrefillingRequest],
        slots: int | None,
        keys: list[int],
        lanes: list[str],
        charged: list[str],
        work: dict[int, int],
        tokens: int,
        contested: bool,
        fair: list[int],
    ) -> StepShare:
        """The `StepShare` of a merge: the waiting order, and for a contested step the running
        order, the prefills held back, the cap and the lane each placed request is charged to
        (`last_lanes` keeps the lane that placed each waiting row)."""
        n = len(queue)
        rows = [k for k in keys if k >= 0]
        row_lanes = [lane for k, lane in zip(keys, lanes, strict=True) if k >= 0]
        self.last_lanes = row_lanes + [UNPLACED_LANE] * (n - len(rows))
        order = head_order(rows, n) if len(rows) < n else np.asarray(rows, dtype=np.intp)
        ids = dict(zip(rows, queue.ids_of(rows), strict=True))
        for j, p in enumerate(prefilling):
            ids[-(j + 1)] = p.request_id
        front = fair[0] if fair else None
        front_id = ids.get(front) if front is None or front in ids else queue.ids_of([front])[0]
        placed = {ids[k]: lane for k, lane in zip(keys, charged, strict=True)}
        if not contested or slots is None:
            return StepShare(order, front_id, budget=tokens, lanes=placed)
        given = grants(keys, work, tokens, slots)
        got = dict(zip(keys, given, strict=True))
        hold = {p.request_id for j, p in enumerate(prefilling) if got.get(-(j + 1), 0) == 0}
        cap = tokens
        for i, (key, g) in enumerate(zip(keys, given, strict=True)):
            if key < 0 and 0 < g < work[key]:  # the running prefill the budget runs out on
                before = [work[k] for k, b in zip(keys[:i], given[:i], strict=True) if b > 0]
                if all(amount <= g for amount in before):
                    cap = g
                else:  # the cap would chunk a request placed before it: hold it instead
                    hold.add(ids[key])
                break
        self._pending = placed
        return StepShare(
            order,
            front_id,
            cap=cap,
            running_order=tuple(ids[k] for k in keys if k < 0),
            hold=frozenset(hold),
            budget=tokens,
            contested=True,
            lanes=placed,
        )

    def _prefill_scores(self, prefilling: Sequence[PrefillingRequest], now: float) -> list[float]:
        """The running prefills' Fast scores, the tokens already computed playing the cached
        part: `_scores` of their columns in scalar math (a handful of requests)."""
        if not prefilling:
            return []
        if self.profile is None:
            units = [self.patience_floor_s] * len(prefilling)
        else:
            units = self._units_of([p.prompt_tokens for p in prefilling])
        scores = []
        for p, unit in zip(prefilling, units, strict=True):
            remaining, wait = max(p.remaining, 1), max(0.0, now - p.arrival)
            scores.append((p.prompt_tokens - p.remaining) / remaining + wait / unit)
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
        """No prefill can run this step: nothing is scheduled, so nothing is booked; the ledgers
        stay (a step without prefill tokens neither ends nor moves a contest)."""
        self._pending = None
        self.last_share = None

    def on_step_end(
        self,
        admitted_ids: Sequence[str],
        prefill_tokens: int,
        prefill_by_request: Mapping[str, int] | None = None,
    ) -> None:
        """Charge each lane the prefill tokens vLLM scheduled for its placements."""
        placed, self._pending = self._pending, None
        if placed is None or prefill_by_request is None or not self.ledger.active:
            return
        fast = fair = 0
        for request_id, tokens in prefill_by_request.items():
            lane = placed.get(request_id)
            if lane == FAST:
                fast += tokens
            elif lane == FAIR:
                fair += tokens
        self.ledger.charge(fast, fair, self.fast_weight)



#: `FairwayPolicy._units` is cleared when it holds more prompt lengths than this.
_MAX_UNITS = 4096


def _oldest(arrival: np.ndarray, head: int) -> np.ndarray:
    """The first `head` rows in arrival order (ties: row order), by a partial selection."""
    if head <= 0:
        return np.zeros(0, np.intp)
    rows = _top(arrival, head)
    return rows[np.argsort(arrival[rows], kind="stable")][:head]


def _with_running(
    rows: list[int],
    running_keys: list[tuple[float, ...]],
    key_of: Callable[[int], tuple[float, ...]],
) -> list[int]:
    """A lane over waiting `rows` (already in the lane's order) and the running prefills (keys
    -(j + 1), sorted by `running_keys`, before a waiting row with an equal key)."""
    if not running_keys:
        return rows
    running = sorted(range(len(running_keys)), key=lambda j: (running_keys[j], j))
    out: list[int] = []
    i = 0
    for j in running:
        while i < len(rows) and key_of(rows[i]) < running_keys[j]:
            out.append(rows[i])
            i += 1
        out.append(-(j + 1))
    out.extend(rows[i:])
    return out
