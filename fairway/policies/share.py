"""The cross-step token share of `fairway`: the per-step plan (cap, placement, hold), ledgers.

Must not import vllm. Pure functions over a model of vLLM's scan: in one step vLLM serves its
running requests in list order, then the waiting queue in order; each request gets
min(its remaining tokens, the per-request cap, the budget left), and a waiting request also needs a
free request slot (the scan stops at the first one without). The plan chooses the cap and where
the Fair lane's front O stands in that sequence, so that O gets its entitlement and the Fast lane
the rest of the budget. `tests/unit/test_share.py` checks the plan against this model,
`tests/integration/test_share_property.py` checks the result against vLLM's real Scheduler.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, count, islice
from typing import NamedTuple

#: A cap no request reaches (vLLM's "no cap" is 0; the model uses a large number instead).
NO_CAP = 1 << 40


@dataclass(frozen=True, slots=True)
class Item:
    """One prefill candidate in the scan: its id, remaining tokens, and whether it waits."""

    request_id: str
    demand: int
    waiting: bool


def grants(seq: Sequence[Item], cap: int, budget: int, slots: int) -> list[int]:
    """Tokens vLLM's scan gives each item of `seq`, in order (a prefix; items left out get 0)."""
    out: list[int] = []
    left = budget
    for item in seq:
        if left <= 0:
            break
        if item.waiting:
            if slots <= 0:
                break
            slots -= 1
        given = min(item.demand, cap, left)
        out.append(given)
        left -= given
    return out


def _truncated(seq: Sequence[Item], slots: int) -> list[int]:
    """Demands of the prefix of `seq` the scan can reach: it stops at the first waiting item once
    `slots` waiting items are in (at the first one if `slots` <= 0). Where it stops depends on
    neither the cap nor the budget, so one cut serves every cap a search tries."""
    if slots < len(seq):  # else every waiting item gets a slot
        waits = [item.waiting for item in seq]
        seq = seq[: next(islice(compress(count(), waits), max(0, slots), None), len(seq))]
    return [item.demand for item in seq]


class _Served(NamedTuple):  # a tuple: built per search, where a frozen __init__ costs
    """The scan's tokens as a function of the cap: f(c) = sum of min(d, c) over the demands d
    the scan reaches (`_truncated`; demands are remaining tokens, never negative).

    For a budget B > 0, sum(grants(seq, cap, B, slots)) == min(B, f(cap)) (0 for B <= 0): each
    item gets min(d, cap, budget left) and the scan ends when the budget is gone. With those
    demands sorted, d_1 <= ... <= d_m, and P_k = d_1 + ... + d_k, f is piecewise linear and
    nondecreasing: f(c) = P_k + c * (m - k) for d_k <= c <= d_{k+1}. So the smallest cap that
    reaches a number of tokens, and the largest that stays within one, are a bisection over the
    m + 1 knees f(d_k) (d_0 = 0) plus one division, instead of a binary search over the cap that
    runs the O(m) scan at each try (the per-step cost of `plan_step`, issue 11). Sorting and
    bisect run in C; with m in the tens to hundreds, numpy's per-call overhead would dominate.
    """

    demands: list[int]  # sorted
    sums: list[int]  # sums[k] = P_k, k = 0..m

    @classmethod
    def of(cls, seq: Sequence[Item], slots: int) -> _Served:
        return cls.over(_truncated(seq, slots))

    @classmethod
    def over(cls, reachable: list[int]) -> _Served:
        """f over demands the scan reaches (any order)."""
        demands = sorted(reachable)
        return cls(demands, [0, *accumulate(demands)])

    @property
    def total(self) -> int:
        """f with no cap: every reachable demand in full."""
        return self.sums[-1]

    def at(self, cap: int) -> int:
        """f(cap), for cap >= 0."""
        k = bisect_right(self.demands, cap)
        return self.sums[k] + cap * (len(self.demands) - k)

    def _knee(self, k: int) -> int:
        """f(d_k), d_0 = 0."""
        return self.sums[k] + self.demands[k - 1] * (len(self.demands) - k) if k else 0

    def _base(self, k: int) -> int:
        return self.demands[k - 1] if k else 0

    def first_reaching(self, tokens: int) -> int:
        """The smallest cap c with f(c) >= tokens, for 0 < tokens <= `total`."""
        k = bisect_left(range(len(self.demands) + 1), tokens, key=self._knee)  # f(d_k) >= tokens
        slope = len(self.demands) - k + 1  # f on [d_{k-1}, d_k]
        return self._base(k - 1) - (self._knee(k - 1) - tokens) // slope

    def last_within(self, tokens: int) -> int:
        """The largest cap c with f(c) <= tokens, for 0 <= tokens < `total`."""
        k = bisect_right(range(len(self.demands) + 1), tokens, key=self._knee) - 1
        slope = len(self.demands) - k  # f on [d_k, d_{k+1}], f(d_{k+1}) > tokens
        return self._base(k) + (tokens - self._knee(k)) // slope


def demand_served(seq: Sequence[Item], slots: int) -> int:
    """Tokens the scan would give with no cap and no budget limit (slot limits only): the
    reachable demands in full (`grants` with cap and budget NO_CAP, hence the min)."""
    return min(NO_CAP, sum(_truncated(seq, slots)))


def water_level(seq: Sequence[Item], budget: int, slots: int, lo: int) -> int:
    """The smallest cap >= lo with which the scan fills the budget (the largest demand if none).

    Closed form (`_Served`): the scan gives min(budget, f(cap)) tokens, so the level is the
    smallest c with f(c) >= budget, raised to lo.
    """
    return _level(
        _truncated(seq, slots), budget, lo, lambda: max([item.demand for item in seq], default=lo)
    )


def _level(reachable: list[int], budget: int, lo: int, largest: Callable[[], int]) -> int:
    """`water_level` over the demands the scan reaches, in scan order; `largest()` is the largest
    demand of the whole sequence, reached or not (the level when nothing fills the budget; it is
    asked only then, so a caller may compute it lazily)."""
    if budget <= 0:  # nothing to fill: any cap does
        return lo
    left = budget  # cap lo often fills it within a few items (O running): stop
    for demand in reachable:
        left -= demand if demand < lo else lo
        if left <= 0:
            return lo
    served = _Served.over(reachable)
    if served.total < budget:
        return max(lo, largest())
    return max(lo, served.first_reaching(budget))


def cap_limit(before: Sequence[Item], room: int, slots: int) -> int:
    """The largest cap with which the items `before` take at most `room` tokens (0: none).

    Closed form (`_Served`): with no budget limit they take f(cap), so the cap is the largest c
    with f(c) <= room; NO_CAP if all they can take fits, 0 if a cap of 1 already takes too much.
    """
    return _limit(_truncated(before, slots), room)


def _limit(reachable: list[int], room: int) -> int:
    """`cap_limit` over the demands the scan reaches."""
    served = _Served.over(reachable)
    if min(NO_CAP, served.total) <= room:
        return NO_CAP
    if served.at(1) > room:
        return 0
    return served.last_within(room)


@dataclass(frozen=True, slots=True)
class Plan:
    """One step's split: the cap, O's place, the running prefills held back, and the outcome the
    model predicts (`front_tokens` for O, `fast_tokens` for everyone else)."""

    cap: int
    front_first: bool = True
    running_first: tuple[str, ...] = ()
    hold: frozenset[str] = frozenset()
    front_tokens: int = 0
    fast_tokens: int = 0

    def key(self, target: int) -> tuple[bool, int, int, int]:
        """Best plan: O gets its target; then most Fast tokens; then most tokens; larger cap
        (fewer, larger chunks: the best-scored requests finish first)."""
        return _rank(self.front_tokens, self.total, self.cap, target)

    @property
    def total(self) -> int:
        return self.front_tokens + self.fast_tokens


def _rank(front_tokens: int, total: int, cap: int, target: int) -> tuple[bool, int, int, int]:
    """`Plan.key` from a plan's outcome (the planner ranks outcomes before building a `Plan`)."""
    ok = front_tokens >= target
    return (ok, total - front_tokens if ok else front_tokens, total, cap)


class _Choice(NamedTuple):
    """The planner's result: a `Plan` with the running prefills named by how many (`first`
    before O, the newest `hold` held back) instead of by id."""

    cap: int
    front_first: bool
    first: int
    hold: int
    front_tokens: int
    fast_tokens: int


def plan_step(
    front: Item,
    running: Sequence[Item],
    ahead: Sequence[Item],
    waiting: Sequence[Item],
    budget: int,
    slots: int,
    target: int,
) -> Plan:
    """The split of one contested step.

    Args:
        front: O, the Fair lane's front (`waiting` True: it is in the waiting queue).
        running: the Fast lane's prefilling running requests, in the running list's order.
        ahead: waiting requests the engine serves before the policy's order (preempted, at the
            head), in that order.
        waiting: the Fast lane's waiting requests, in Fast-score order.
        budget: P, the step's prefill tokens. slots: free request slots for waiting requests.
        target: a = min(O's remaining tokens, its entitlement): what O must get.

    Returns:
        The plan that gives O at least `target` tokens (if any arrangement does) and, among
        those, the most tokens to the Fast lane, then the most tokens in all.

    The items of `running` must not wait and those of `ahead` and `waiting` must (their place
    in the scan is fixed by their role). The plan is made over their demands (`_plan`).
    """
    if any(item.waiting for item in running) or not all(i.waiting for i in (*ahead, *waiting)):
        raise ValueError("plan_step: running items must not wait, ahead and waiting items must")
    ids = [item.request_id for item in running]
    choice = _plan(
        front.demand,
        front.waiting,
        [item.demand for item in running],
        [item.demand for item in ahead],
        [item.demand for item in waiting],
        budget,
        slots,
        target,
    )
    return Plan(
        choice.cap,
        choice.front_first,
        tuple(ids[: choice.first]),
        frozenset(ids[len(ids) - choice.hold :]),
        choice.front_tokens,
        choice.fast_tokens,
    )


def _plan(
    front: int,
    front_waiting: bool,
    running: list[int],
    ahead: list[int],
    waiting: list[int],
    budget: int,
    slots: int,
    target: int,
    unreached: Callable[[], int] = lambda: 0,
) -> _Choice:
    """`plan_step` over demands: O's, the running prefills', the ahead and waiting requests'.

    `unreached()`: the largest demand of waiting requests after `waiting` that the scan never
    reaches (its slots are gone first); it only bounds the water level when nothing fills the
    budget, as their `Item`s would, so it is asked only then (`fairway` passes the largest of
    the thousands of requests past the step's head).

    Arrangements tried. O running: some prefix of the running Fast prefills before O, the rest
    (and every waiting request) after it. O waiting: every running prefill comes first (vLLM's
    rule); O first or last in the waiting order; if the running prefills alone would take more
    than budget - target, the newest of them are held back for the step (as few as possible).
    Caps tried per arrangement: the water level (the smallest cap >= target that fills the budget)
    and the largest cap with which the requests before O leave O its target. The scan serves
    every running request, then waiting ones while slots last, so the demands it reaches are the
    running ones (O among them when it runs) and then the first `slots` waiting ones.
    """
    lo = max(1, target)
    room = budget - target
    free = max(0, slots)
    tries: list[tuple[list[int], int, int, bool, int, int]] = []  # see `_best`

    def largest(*parts: list[int]) -> Callable[[], int]:
        return lambda: max(front, unreached(), *(max(part, default=front) for part in parts))

    if not front_waiting:
        after = ahead + waiting
        reached = after[:free]
        level = _level([front, *running, *reached], budget, lo, largest(running, after))
        taken, k_max = 0, 0
        for k, demand in enumerate(running, 1):
            taken += demand if demand < level else level
            if taken > room:
                break
            k_max = k
        for k in (0, k_max) if k_max else (0,):
            reachable = [*running[:k], front, *running[k:], *reached]
            tries.append((reachable, k, level, True, k, 0))
            if k:
                top = _limit(running[:k], room)
                if top >= level and min(top, NO_CAP) != level:
                    tries.append((reachable, k, min(top, NO_CAP), True, k, 0))
    else:
        hold = _hold(front, running, ahead, waiting, budget, free, lo, room, largest)
        kept = running[: len(running) - hold]
        for front_first in (True, False):
            before = ahead if front_first else ahead + waiting
            queued = [*before, front, *waiting] if front_first else [*before, front]
            reachable = kept + queued[:free]
            at = len(kept) + len(before)
            level = _level(reachable, budget, lo, largest(kept, ahead, waiting))
            tries.append((reachable, at, level, front_first, 0, hold))
            top = _limit(kept + before[:free], room)
            if top >= lo and top != level:
                tries.append((reachable, at, top, front_first, 0, hold))
    return _best(tries, budget, target)


def _best(
    tries: list[tuple[list[int], int, int, bool, int, int]], budget: int, target: int
) -> _Choice:
    """The best of the plans tried, each (the demands the scan reaches in order, O's index
    among them, the cap, front_first, first, hold), by `Plan.key`; the first of equals, as
    max() picks (plans of one arrangement differ in their cap, so only the arrangements' order
    matters)."""
    best_key: tuple[bool, int, int, int] | None = None
    best = tries[0]
    outcome = (0, 0)
    for tried in tries:
        reachable, at, cap = tried[0], tried[1], tried[2]
        left, mine = budget, 0  # `grants`, summed (conditionals: min() calls cost more here)
        for i, demand in enumerate(reachable):
            if left <= 0:
                break
            given = demand if demand < cap else cap
            if given > left:
                given = left
            if i == at:
                mine = given
            left -= given
        key = _rank(mine, budget - left, cap, target)
        if best_key is None or key > best_key:
            best_key, best, outcome = key, tried, (mine, budget - left - mine)
    return _Choice(best[2], best[3], best[4], best[5], *outcome)


def _hold(
    front: int,
    running: list[int],
    ahead: list[int],
    waiting: list[int],
    budget: int,
    free: int,
    lo: int,
    room: int,
    largest: Callable[..., Callable[[], int]],
) -> int:
    """How many of the newest running prefills to hold back so that, with O first in the waiting
    order and the cap at the water level, the requests ahead of O leave it its target."""
    queued = [*ahead, front, *waiting][:free]

    def fits(hold: int) -> bool:
        kept = running[: len(running) - hold]
        level = _level(kept + queued, budget, lo, largest(kept, ahead, waiting))
        return min(NO_CAP, _Served.over(kept + ahead[:free]).at(level)) <= room

    if fits(0):
        return 0
    bad, good = 0, len(running)
    while good - bad > 1:
        mid = (bad + good) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


@dataclass(slots=True)
class ShareLedger:
    """The two lanes' work-charge ledgers, persistent across steps.

    A contest is a run of consecutive steps in which both lanes have demand and the demand exceeds
    the step; a step outside a contest resets the ledgers (no banking of idle share). Within a
    contest, each lane's deficit is its cumulative shortfall against what it was owed:
    owed_fair = min(d_O, F) and owed_fast = min(Fast demand, P - owed_fair) per step, with
    F = floor(P / (1 + w)); tokens counted are those vLLM scheduled (`SchedulerOutput`). A
    deficit never goes below 0 (a lane that got more than owed banks nothing) nor above P.
    """

    fair_deficit: int = 0
    fast_deficit: int = 0
    #: Prefill tokens scheduled per lane since the contest began.
    fair_tokens: int = 0
    fast_tokens: int = 0
    contest_steps: int = 0

    def entitlement(self, floor: int, budget: int) -> int:
        """O's entitlement this step: F plus its deficit net of Fast's, never below F, at most P.

        O's floor F is never lowered: Fast's deficit is repaid only out of O's own deficit.
        """
        return max(floor, min(budget, floor + self.fair_deficit - self.fast_deficit))

    def record(
        self, owed_fair: int, got_fair: int, owed_fast: int, got_fast: int, budget: int
    ) -> None:
        """Book one contested step's owed and scheduled tokens."""
        self.fair_deficit = min(budget, max(0, self.fair_deficit + owed_fair - got_fair))
        self.fast_deficit = min(budget, max(0, self.fast_deficit + owed_fast - got_fast))
        self.fair_tokens += got_fair
        self.fast_tokens += got_fast
        self.contest_steps += 1

    def reset(self) -> None:
        """A lane had no demand (or everything fitted): forget the contest."""
        self.fair_deficit = self.fast_deficit = 0
        self.fair_tokens = self.fast_tokens = self.contest_steps = 0
