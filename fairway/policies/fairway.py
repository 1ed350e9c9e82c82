"""`fairway`, the default policy: the paper's two lanes and work charges, carried across the steps
a long request needs.

Must not import vllm. Read `FairwayPolicy._rule` first: one step of the rule in plain Python over
the two lanes (merged, charged, granted). The engine (`ordering`) gives it the first entries of
each lane (`StepLanes.first`: a partial selection of the queue's columns, widened when the Fast
lane passes over all it was given); the reference (`decide`) gives it the whole lanes sorted in
plain Python (`StepLanes.whole`), and tests/unit/test_fairway_reference.py (hypothesis) holds the
two equal decision for decision over carried steps. Priority levels and tenants are
`fairway.policies.shares`. The rule's guarantee is in docs/design.md ("Across steps"); the paper's
per-step rule is `fairway-step` (`fairway.policies.fairway_step`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fairway.policies.base import register_policy
from fairway.policies.lanes import FAIR, FAST, FastLanePolicy, merge
from fairway.policies.queue import (
    UNPLACED_LANE,
    Ordering,
    QueueColumns,
    QueuedRequest,
    Step,
    StepPlan,
    head_order,
)
from fairway.policies.shares import (
    TenantShares,
    classes_differ,
    entry_keys,
    key_maps,
    lane_prefix,
)
from fairway.policies.split import cap_and_hold, grants
from fairway.policies.step_lanes import StepLanes


@register_policy("fairway")
@dataclass(eq=False)
class FairwayPolicy(FastLanePolicy):
    """The paper's Fast and Fair lanes over the waiting and the chunk-prefilling requests, merged
    by work charges that are carried from step to step while the steps stay contested, and each
    step's prefill tokens split in merge order (a `StepPlan`: the running prefills' order, one
    cap, the prefills held back). Under contention the Fair lane gets w / (1 + w) of the prefill
    tokens and the Fast lane 1 / (1 + w) (w = `fast_weight`), a started prefill is finished
    before the Fair lane starts another, and the oldest request gets tokens within a bounded
    number of steps: docs/design.md ("Across steps") states the rule and its guarantee, and
    "Priority levels and tenants" the classed form. Caller's contract: `Policy`'s, calling
    `ordering()` also in steps where only prefills run, with `prefill_by_request` after each.
    """

    needs_cache_hits: ClassVar[bool] = True
    stateful: ClassVar[bool] = True
    plans_steps: ClassVar[bool] = True

    #: Tenants (with the `tenants` option): the credit, in step budgets (>= 0): a tenant that
    #: used less than its share, or returns after a pause, is served first for up to this much
    #: work (its requests then see the step as when alone), and a backlogged tenant loses at most
    #: that much (plus two steps) against its share. 0: shares within a chunk over any 10
    #: contested steps; 12: the light tenant of E6's `tenants` at 1.11 x its p99 alone against
    #: 3.56 x with 0 (docs/design.md, "Priority levels and tenants").
    tenant_credit_steps: float = 12.0

    #: The lane ledgers, carried while steps stay contested.
    ledger: LaneLedgers = field(init=False, repr=False, default_factory=lambda: LaneLedgers())
    #: The priority levels' and tenants' counters.
    shares: TenantShares = field(init=False, repr=False, default_factory=TenantShares)
    #: Lane each request placed in a contested step is charged to, booked after the step.
    _lane_to_book: dict[str, str] | None = field(init=False, repr=False, default=None)
    #: The last plan held prefills back; after such a step that scheduled nothing, the next plan
    #: holds none (`_hold_none`): a hold never leaves the engine without work twice.
    _held: bool = field(init=False, repr=False, default=False)
    _hold_none: bool = field(init=False, repr=False, default=False)
    #: The Fair front the last plan held back instead of capping it (None: it was not held).
    _front_held: str | None = field(init=False, repr=False, default=None)
    #: Waiting rows whose admission is a copy from the CPU offload tier (`grants`).
    _tier_loads: Container[int] = field(init=False, repr=False, default=())

    def __post_init__(self) -> None:
        super().__post_init__()
        credit = self.tenant_credit_steps
        if isinstance(credit, bool) or not isinstance(credit, int | float) or not (
            0 <= credit < float("inf")
        ):
            raise ValueError(f"tenant_credit_steps must be a finite number >= 0, got {credit!r}")
        self.shares.credit_steps = credit

    # --- the two ways in: the engine's lane heads, the reference's whole lanes --------------------

    def ordering(self, queue: QueueColumns, step: Step) -> Ordering:
        """The rule over the first entries of each lane: one per position vLLM's scan can
        reach, plus one per running prefill; the Fast lane's widened while it passes over all
        of them (requests that do not fit the step) and more of it exists."""
        tier = queue.tier_tokens
        loads = np.flatnonzero(tier > 0).tolist() if tier is not None else ()
        return self._order(queue, step, None, loads)

    def decide(
        self, waiting: Sequence[QueuedRequest], step: Step, loading: Collection[int] = ()
    ) -> Ordering:
        """The rule over the whole lanes (the reference `ordering` must agree with). `loading`:
        positions of waiting requests vLLM admits by a copy from its CPU offload tier (they
        take no tokens and no slot in the step)."""
        return self._order(QueueColumns.of(waiting), step, waiting, loading)

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """`decide`'s order for a step whose budget is unknown (`Step(now)`): no such step is
        contested, so this is the paper's merge (`fairway-step`'s order)."""
        return [int(i) for i in self.decide(queue, Step(now)).order]

    def _order(self, queue: QueueColumns, step: Step, whole: Sequence[QueuedRequest] | None,
               loads: Collection[int]) -> Ordering:
        self._tier_loads = frozenset(loads)
        if queue.mixed or classes_differ(queue, step.prefilling):
            return self._classed(queue, step, whole is not None)
        if len(step.tenant_weights) > 1 or queue.priority is not None:
            self.shares.one_class(queue, step)  # its counter runs on, for the others' return
        else:
            self.shares.present = None
        if whole is not None:
            decided = self._rule(StepLanes.whole(self, whole, step), step)
            assert decided is not None  # the whole Fast lane: never more to read
            return decided
        n, m = len(queue), len(step.prefilling)
        scores = self.scores(queue, step.now)
        head = n if step.budget is None or step.head is None else min(n, step.head)
        fair_count = fast_count = min(n, max(head, 1) + m)
        while True:
            lanes = StepLanes.first(self, queue, step, scores, fast_count, fair_count)
            decided = self._rule(lanes, step)
            if decided is not None:
                return decided
            fast_count = min(n, 2 * fast_count)

    def _classed(self, queue: QueueColumns, step: Step, whole: bool) -> Ordering:
        """The lanes with vLLM's priority levels outermost and, when tenants compete, the
        tenants' shares inside each level (docs/design.md, "Priority levels and tenants").

        Both lanes are sorted with the priority level as their first key (lower first): the
        merge places a level only once every request of the levels above it is placed, so
        vLLM's strict order between levels holds, running prefills included. With one tenant per
        level that is all; with two or more tenants at the level served first, the tenants'
        interleave (`TenantShares.interleave`) places the step."""
        n, m = len(queue), len(step.prefilling)
        run = QueueColumns.of([p.view() for p in step.prefilling])
        tenant = np.concatenate([queue.tenants, run.tenants])
        level = np.concatenate([queue.priorities, run.priorities])
        share = self.shares.classify(level, tenant, step)
        self.shares.single_class, self.shares.class_of_id = None, {}
        arrival = np.concatenate([queue.arrival, run.arrival])
        scores = np.concatenate([self.scores(queue, step.now), self.scores(run, step.now)])
        work = np.concatenate([queue.remaining, run.remaining])
        prompt = np.concatenate([queue.prompt_tokens, run.prompt_tokens])
        waiting = np.arange(n + m) < n
        tie = np.concatenate([np.arange(m, n + m), np.arange(m)])  # running first, then position
        fast_lane = np.lexsort((tie, arrival, -scores, level))
        fair_lane = np.lexsort((tie, arrival, waiting, level))
        head = n if step.budget is None or step.head is None or whole else min(n, step.head)
        depth = max(head, 1) + m
        queue_work = float(queue.remaining.sum())
        budget = step.budget
        tokens = 0 if budget is None else max(0, budget.tokens - sum(budget.ahead))
        if len(np.unique(tenant[level == level.min()])) > 1:  # tenants share the top level
            self.shares.contend = budget is not None and float(work.sum()) > tokens
            placements, classes, work_of, done = self.shares.interleave(
                fast_lane, fair_lane, share, level, work, prompt, waiting, depth, tokens,
                self.fast_weight, whole,
            )
            lanes = StepLanes(placements[0], placements[0], work_of, done, queue_work, n,
                              queue.ids_of, True)
            decided = self._rule(lanes, step, shared=True, placements=placements)
            assert decided is not None and decided.plan is not None  # no merge of its own
            # plan.lanes lists the placed requests in placement order: the placements' keys'
            self.shares.class_of_id = dict(zip(decided.plan.lanes, classes, strict=True))
            return decided
        self.shares.contend = False  # one tenant per level: no share to keep
        fair = lane_prefix(fair_lane, waiting, depth)
        while True:
            fast = lane_prefix(fast_lane, waiting, depth)
            work_of, done = key_maps(np.union1d(fast, fair), n, work, prompt)
            lanes = StepLanes(entry_keys(fast, n).tolist(), entry_keys(fair, n).tolist(), work_of,
                              done, queue_work, n, queue.ids_of, int(waiting[fast].sum()) >= n)
            decided = self._rule(lanes, step, shared=level.min() != level.max())
            if decided is not None:
                return decided
            depth *= 2

    # --- the rule ---------------------------------------------------------------------------------

    def _rule(
        self,
        lanes: StepLanes,
        step: Step,
        shared: bool = False,
        placements: tuple[list[int], list[str], list[str]] | None = None,
    ) -> Ordering | None:
        """One step: the contest, the merge, the charges and the grants. None when the Fast lane
        passed over all of `lanes.fast` and more of it exists: the caller widens it and asks
        again (nothing was changed). `shared`: several classes share the step, so it is
        contested whenever its requests ask for more than it has; `placements`: the (keys,
        lanes, charges) the tenants' interleave made, in place of the two lanes' merge."""
        self._lane_to_book = None
        front_held = self._front_held  # consumed only by a decision (not by a None answer)
        n, running = lanes.waiting, step.prefilling
        if n + len(running) == 0:
            self.ledger.reset()
            self._front_held = None
            return Ordering([], [], StepPlan())
        contested, tokens, slots = self._contest(lanes, step, shared, placements is not None)
        passed: set[int] = set()
        if placements is not None:
            keys, placed_by, charged = placements
        else:  # the smaller ledger places next (ties to Fast); Fast passes over what won't fit
            start = (self.ledger.fast, self.ledger.fair) if contested else None
            keys, placed_by, charged = merge(lanes.fast, lanes.fair, lanes.work, self.fast_weight,
                                             start, slots, tokens, fit=contested, skipped=passed)
        if passed and not lanes.whole_fast and passed.union(keys).issuperset(lanes.fast):
            return None
        rows = [k for k in keys if k >= 0]
        row_lanes = [lane for k, lane in zip(keys, placed_by, strict=True) if k >= 0]
        order = head_order(rows, n)
        lanes_out = row_lanes + [UNPLACED_LANE] * (n - len(rows))
        ids = dict(zip(rows, lanes.ids_of(rows), strict=True))
        ids.update({-(j + 1): p.request_id for j, p in enumerate(running)})
        front = lanes.fair[0]
        front_id = ids[front] if front in ids else lanes.ids_of([front])[0]
        lane_of = {ids[k]: lane for k, lane in zip(keys, charged, strict=True)}
        if not contested or slots is None:  # vLLM's own step: the order only
            self._front_held = None
            return Ordering(order, lanes_out, StepPlan(front_id, budget=tokens, lanes=lane_of))
        budget = step.budget
        assert budget is not None  # contested
        given = grants(keys, lanes.work, tokens, slots, lanes.done, budget.free_blocks,
                       budget.block_size, self._tier_loads)
        cap, hold = cap_and_hold(keys, given, lanes.work, [p.request_id for p in running], ids,
                                 front, front_held, tokens)
        if self._hold_none:  # the last step held prefills and scheduled nothing
            hold.clear()
        self._front_held = front_id if front_id in hold else None
        self._held, self._hold_none, self._lane_to_book = bool(hold), False, lane_of
        return Ordering(order, lanes_out, StepPlan(
            front_id, cap=cap, running_order=tuple(ids[k] for k in keys if k < 0),
            hold=frozenset(hold), budget=tokens, contested=True, lanes=lane_of,
        ))

    def _contest(
        self, lanes: StepLanes, step: Step, shared: bool, interleaved: bool
    ) -> tuple[bool, int, int | None]:
        """Whether the step is contested (two requests compete, the lanes' fronts differ or
        classes share the step, and they ask for more than it has), its prefill tokens and free
        slots; the ledgers started (the paper's start), kept or reset."""
        prefilling, budget = step.prefilling, step.budget
        fast, fair, work = lanes.fast, lanes.fair, lanes.work
        tokens = 0 if budget is None else max(0, budget.tokens - sum(budget.ahead))
        contested = (
            budget is not None
            and tokens > 0
            and lanes.waiting + len(prefilling) >= 2
            and (fast[0] != fair[0] or shared)
            and lanes.queue_work + sum(p.remaining for p in prefilling) > tokens
        )
        slots = None if budget is None else max(0, budget.free_slots - len(budget.ahead))
        if slots == 0 and not prefilling:  # nothing can start or continue: the ledgers stay
            contested = False
        elif not contested or interleaved:
            self.ledger.reset()
        elif not self.ledger.active or work[fair[0]] < tokens:
            self.ledger.start(self.fast_weight * work[fast[0]], float(work[fair[0]]))
        return contested, tokens, slots

    # --- after the step --------------------------------------------------------------------------

    def step_without_prefill(self) -> None:
        """No prefill can run this step: nothing is scheduled, so nothing is booked; the ledgers
        stay (a step without prefill tokens neither ends nor moves a contest)."""
        self._lane_to_book = None
        self.shares.forget_step()

    def on_step_end(
        self,
        admitted_ids: Sequence[str],
        prefill_tokens: int,
        prefill_by_request: Mapping[str, int] | None = None,
    ) -> None:
        """Charge each lane the prefill tokens vLLM scheduled for its placements."""
        lane_of, self._lane_to_book = self._lane_to_book, None
        self._hold_none, self._held = self._held and prefill_tokens == 0, False
        self.shares.charge(prefill_by_request)
        if lane_of is None or prefill_by_request is None or not self.ledger.active:
            return
        fast = fair = 0
        for request_id, tokens in prefill_by_request.items():
            lane = lane_of.get(request_id)
            if lane == FAST:
                fast += tokens
            elif lane == FAIR:
                fair += tokens
        self.ledger.charge(fast, fair, self.fast_weight)

    def tenant_counters(self) -> dict[int, float]:
        """Tenant code -> counter of the top level's tenants at the last classed step
        (`TenantShares.counters`)."""
        return self.shares.counters()

    def ledgers(self) -> dict[str, float]:
        return dataclasses.asdict(self.ledger)


@dataclass(slots=True)
class LaneLedgers:
    """The two lanes' work charges, kept while steps stay contested.

    `fast` and `fair` are the ledgers the merge compares: the paper's start (w x the Fast front's
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
