"""`fairway`, the default policy: the paper's two lanes and work charges, carried across the steps
a long request needs.

Must not import vllm. Read `FairwayPolicy.decide` first: the rule for one step in plain Python
over the whole lanes (sorted, merged, charged, granted). `ordering` below it is what the engine
runs: the same decisions from the first entries of each lane only, over the queue's numpy
columns; tests/unit/test_fairway_reference.py (hypothesis) holds the two equal decision for
decision over carried steps. The rule's guarantee is in docs/design.md ("Across steps"); the
paper's per-step rule is `fairway-step` (`fairway.policies.fairway_step`); both share the
Fast-lane score and the merge of `fairway.policies.lanes`.
"""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_left
from collections.abc import Callable, Collection, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fairway.policies.base import register_policy
from fairway.policies.lanes import (
    FAIR,
    FAST,
    FastLanePolicy,
    HeadBound,
    fair_lane_head,
    fast_lane_head,
    merge,
)
from fairway.policies.queue import (
    HeadLanes,
    HeadOrder,
    Ordering,
    PrefillingRequest,
    QueueColumns,
    QueuedRequest,
    Step,
    StepPlan,
    TokenReach,
)
from fairway.policies.shares import (
    MAX_SHARE_CLASSES,
    class_prefixes,
    classes_differ,
    entry_keys,
    key_maps,
    lane_prefix,
    tenant_tags,
)


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

    def __post_init__(self) -> None:
        super().__post_init__()
        credit = self.tenant_credit_steps
        if isinstance(credit, bool) or not isinstance(credit, int | float) or not (
            0 <= credit < float("inf")
        ):
            raise ValueError(f"tenant_credit_steps must be a finite number >= 0, got {credit!r}")

    #: The lane ledgers, carried while steps stay contested.
    ledger: LaneLedgers = field(init=False, repr=False, default_factory=lambda: LaneLedgers())
    #: Lane each request placed in a contested step is charged to, booked after the step.
    _pending: dict[str, str] | None = field(init=False, repr=False, default=None)
    #: The last plan held prefills back (`_held`); after such a step that scheduled nothing, the
    #: next plan holds none (`_release`): a hold never leaves the engine without work twice.
    _held: bool = field(init=False, repr=False, default=False)
    #: The Fair front the last plan held back instead of capping it (None: it was not held).
    _front_held: str | None = field(init=False, repr=False, default=None)
    _release: bool = field(init=False, repr=False, default=False)
    #: Rows of this step's queue whose admission is a copy from the CPU offload tier (`grants`).
    _loads: Container[int] = field(init=False, repr=False, default=())
    #: Counters by share class ((priority level, tenant) -> code, `_share_classes`): uncached
    #: tokens scheduled over the tenant's weight, charged after contested classed steps.
    _served: np.ndarray = field(init=False, repr=False, default_factory=lambda: np.zeros(0))
    _class_weight: np.ndarray = field(init=False, repr=False, default_factory=lambda: np.zeros(0))
    _class_code: dict[tuple[int, int], int] = field(init=False, repr=False, default_factory=dict)
    #: Share classes present at the last classed step (None: the last step had one class).
    _present: frozenset[int] | None = field(init=False, repr=False, default=None)
    #: Request id -> share class of the last classed step's requests, to charge after it.
    _class_of_id: dict[str, int] = field(init=False, repr=False, default_factory=dict)
    #: The last classed step's requests asked for more prefill tokens than it had.
    _tenants_contend: bool = field(init=False, repr=False, default=False)
    #: The share class of every request of the last step, when it had one class.
    _single_class: int | None = field(init=False, repr=False, default=None)
    #: `tenant_credit_steps` in tokens, and the step's budget, at the last classed step.
    _credit: float = field(init=False, repr=False, default=0.0)
    _step_tokens: int = field(init=False, repr=False, default=0)
    #: The lane heads' bounds kept across steps (a filter only: the heads stay exact).
    _fair_bound: HeadBound = field(init=False, repr=False, default_factory=lambda: HeadBound())
    _fast_bound: HeadBound = field(init=False, repr=False, default_factory=lambda: HeadBound())

    # --- the rule ---------------------------------------------------------------------------------

    def decide(
        self, waiting: Sequence[QueuedRequest], step: Step, loading: Collection[int] = ()
    ) -> Ordering:
        """One step of the rule, in plain Python over the whole lanes: the reference `ordering`
        must equal. `loading`: positions of waiting requests vLLM admits by a copy from its CPU
        offload tier (they take no tokens and no slot in the step). Several tenants at the level
        served first share the step by their own lanes (`ordering`'s `_tenant_merge`)."""
        if len({r.tenant for r in self._top_level(waiting, step)}) > 1:
            return self.ordering(QueueColumns.of(waiting), step)
        # The requests: waiting position i is key i, running prefill j is key -(j + 1).
        req = dict(enumerate(waiting))
        req.update({-(j + 1): p.view() for j, p in enumerate(step.prefilling)})
        self._pending = None
        if not req:
            self.ledger.reset()
            self._front_held = None
            return Ordering([], [], StepPlan())
        work = {k: r.remaining for k, r in req.items()}

        def tie(k: int) -> tuple[bool, int]:  # running prefills first, then by position
            return (k >= 0, k if k >= 0 else -k - 1)

        # Lanes, the priority level first: Fast by score; Fair running first, then by arrival.
        fast = sorted(req, key=lambda k: (req[k].priority, -self.fast_score(req[k], step.now),
                                          req[k].arrival, tie(k)))
        fair = sorted(req, key=lambda k: (req[k].priority, k >= 0, req[k].arrival, tie(k)))
        front, w, budget = fair[0], self.fast_weight, step.budget
        tokens = 0 if budget is None else max(0, budget.tokens - sum(budget.ahead))
        slots = None if budget is None else max(0, budget.free_slots - len(budget.ahead))
        # Contest: two requests compete, the lanes' fronts differ (or levels do), too much work.
        levels = {r.priority for r in req.values()}
        contested = (budget is not None and tokens > 0 and len(req) >= 2
                     and (fast[0] != front or len(levels) > 1) and sum(work.values()) > tokens)
        if slots == 0 and not step.prefilling:
            contested = False  # nothing can start or continue: the ledgers stay as they are
        elif not contested:
            self.ledger.reset()
        elif not self.ledger.active or work[front] < tokens:
            self.ledger.start(w * work[fast[0]], float(work[front]))  # the paper's start
        ledger = [self.ledger.fast, self.ledger.fair] if contested else [
            w * work[fast[0]], float(work[front])]
        # Merge: the smaller ledger places its next request (ties to Fast) and adds its work,
        # x w for Fast. Contested, the Fast lane passes over what it cannot finish in the step.
        # Once the free slots are placed, the running prefills come before any other waiting one.
        keys: list[int] = []
        lanes: list[str] = []
        passed: set[int] = set()
        placed_work = 0.0
        while len(keys) < len(req):
            started = sum(k >= 0 for k in keys)
            only_running = slots is not None and started >= slots and any(
                k < 0 and k not in keys for k in req)
            pool = [k for k in req if k not in keys and (k < 0 or not only_running)]
            fast_next = next((k for k in fast if k in pool and k not in passed), None)
            if fast_next is not None and ledger[0] <= ledger[1]:
                if contested and placed_work < tokens and work[fast_next] > tokens - placed_work:
                    passed.add(fast_next)
                    continue
                key, lane = fast_next, FAST
                ledger[0] += w * work[key]
            else:
                key, lane = next(k for k in fair if k in pool), FAIR
                ledger[1] += work[key]
            keys.append(key)
            lanes.append(lane)
            placed_work += work[key]
        # Charges: the placing lane's, but a Fair front of w steps or more is the Fair lane's.
        ids = {k: r.request_id for k, r in req.items()}
        charged = {ids[k]: FAIR if k == front and work[front] >= w * tokens else lane
                   for k, lane in zip(keys, lanes, strict=True)}
        rows = [k for k in keys if k >= 0]
        row_lanes = [lane for k, lane in zip(keys, lanes, strict=True) if k >= 0]
        if not contested:  # vLLM's own step: the order only
            self._front_held = None
            return Ordering(rows, row_lanes, StepPlan(ids[front], budget=tokens, lanes=charged))
        assert budget is not None
        # Grants: the step's tokens in merge order; a running prefill given nothing is held, the
        # one the tokens run out on is capped at its grant, or held if that cap would chunk a
        # request placed before it (the Fair front is not held two steps in a row).
        done = {k: r.prompt_tokens - r.remaining for k, r in req.items()}
        given = grants(keys, work, tokens, slots or 0, done, budget.free_blocks,
                       budget.block_size, loading)
        hold = {ids[k] for k, g in zip(keys, given, strict=True) if k < 0 and g == 0}
        cap = tokens
        for i, (key, grant) in enumerate(zip(keys, given, strict=True)):
            if key < 0 and 0 < grant < work[key]:
                before = [work[k] for k, g in zip(keys[:i], given[:i], strict=True) if g > 0]
                if all(amount <= grant for amount in before):
                    cap = grant
                elif key == front and ids[key] == self._front_held:
                    cap = max(before)
                else:
                    hold.add(ids[key])
                break
        if self._release:  # the last step held prefills and scheduled nothing: hold none now
            hold.clear()
        self._front_held = ids[front] if ids[front] in hold else None
        self._held, self._release, self._pending = bool(hold), False, charged
        return Ordering(rows, row_lanes, StepPlan(
            ids[front], cap=cap, running_order=tuple(ids[k] for k in keys if k < 0),
            hold=frozenset(hold), budget=tokens, contested=True, lanes=charged,
        ))

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """`decide`'s order for a step whose budget is unknown (`Step(now)`): no such step is
        contested, so this is the paper's merge (`fairway-step`'s order); with the step's budget
        and its running prefills, `decide` is the whole rule."""
        return [int(i) for i in self.decide(queue, Step(now)).order]

    @staticmethod
    def _top_level(waiting: Sequence[QueuedRequest], step: Step) -> list[QueuedRequest]:
        """The requests of the priority level served first."""
        everyone = [*waiting, *(p.view() for p in step.prefilling)]
        top = min((r.priority for r in everyone), default=0)
        return [r for r in everyone if r.priority == top]

    # --- what the engine runs: the same decisions from the first entries of each lane -------------


    def ordering(self, queue: QueueColumns, step: Step) -> Ordering:
        """`decide()` over the scheduler's columns: only the rows either lane can place this step
        (the scan's head plus one per running prefill, more for the Fast lane when it passes over
        requests that do not fit the step) are found and read in Python. A queue of several
        tenants or priority levels takes `_classed_ordering`."""
        tier = queue.tier_tokens
        self._loads = frozenset(np.flatnonzero(tier > 0).tolist()) if tier is not None else ()
        if queue.mixed or classes_differ(queue, step.prefilling):
            return self._classed_ordering(queue, step)
        if len(step.tenant_weights) > 1 or queue.priority is not None:
            self._one_class(queue, step)  # its counter runs on, for the others' return
        else:
            self._present = None
        n, m = len(queue), len(step.prefilling)
        if n + m == 0:
            decided = self._decide([], [], {}, {}, 0.0, 0, step, queue.ids_of, fast_whole=True)
            assert decided is not None
            return decided
        running = step.prefilling  # their views' fields, read without building the views
        scores = self.scores(queue, step.now) if n else np.zeros(0)
        head = n if step.budget is None or step.head is None else min(n, step.head)
        exact = None  # order only what vLLM's scan can read by tokens, if that is fewer
        budget = step.budget
        exact_below = 0 if budget is None else min(head, budget.free_slots - len(budget.ahead))
        if step.tokens_reach is not None and not self._release and exact_below > EXACT_FIRST:
            exact = ExactHead(EXACT_FIRST, step.tokens_reach, queue.unprobed)
        full = min(n, max(head, 1) + m)  # rows either lane may place in head + m placements
        # both lanes' heads found once (O(n) each); a shorter attempt reads their first rows
        fair_head = fair_lane_head(queue.arrival, full, self._fair_bound)
        fast_head = (fast_lane_head(scores, queue.arrival, full, self._fast_bound) if n
                     else np.zeros(0, np.intp))
        reach = full if exact is None else min(full, exact.count + m)
        fair_rows = fair_head[:reach].tolist()
        run_scores = self.running_scores(running, step.now) if m else []
        # the Fair lane: running prefills (by arrival, then position), then the waiting rows
        fair_running = sorted(range(-1, -m - 1, -1), key=lambda k: (running[-k - 1].arrival, -k))
        fair = fair_running + fair_rows
        queue_work = float(queue.remaining.sum())
        run_work = {-(j + 1): max(r.remaining, 1) for j, r in enumerate(running)}
        run_done = {-(j + 1): r.prompt_tokens - w for j, (r, w) in enumerate(
            zip(running, run_work.values(), strict=True))}
        whole = False
        while True:
            if reach <= full:
                fast_rows = fast_head[:reach]
            else:
                fast_rows = fast_lane_head(scores, queue.arrival, reach)
            rows = np.concatenate([fast_rows, np.asarray(fair_rows, dtype=np.intp)])
            amounts = queue.remaining[rows].astype(np.int64)
            row_list = rows.tolist()
            # speed: `ordering` alone, 1,000 waiting of 8k-16k tokens, 3 running prefills, 8-row
            # scan: 0.49 -> 0.46 ms per call with the merge's loop below (maps and the running
            # prefills' places in the Fast lane by numpy, not per row; thread time, 15 x 100)
            work = dict(zip(row_list, amounts.tolist(), strict=True))
            done = dict(zip(row_list, (queue.prompt_tokens[rows] - amounts).tolist(),
                            strict=True))
            work.update(run_work)
            done.update(run_done)
            fast = _with_running(fast_rows, scores, queue.arrival, run_scores, running)
            turn_past: list[float] = []
            decided = self._decide(fast, fair, work, done, queue_work, n, step, queue.ids_of,
                                   fast_whole=whole or len(fast_rows) >= n, turn_past=turn_past,
                                   exact=exact)
            if decided is not None:
                return decided
            if exact is not None and exact.failed:  # the scan may read further
                # twice as many placements while fewer than the head, then the whole head
                # speed: 10,000 waiting, the prefilling node, where short hits let the scan read
                # past 8 placements in most steps: `benchmarks/token_reach.py --switch
                # exact-widen` (see docs/results.md)
                wider = EXACT_WIDEN * exact.count
                if exact.widen and exact.count < wider < exact_below:
                    exact = ExactHead(wider, exact.reach, exact.unprobed)
                    reach = min(full, wider + m)
                else:
                    exact, reach = None, full
                whole = False
                fair_rows = fair_head[:reach].tolist()
                fair = fair_running + fair_rows
                continue
            # The Fast lane passed over its whole known prefix. If its turn came at the end of
            # the prefix with a room no request beyond it fits, the whole lane passes over them
            # all there: the prefix decides as the whole lane (`merge`'s `turn_past`). Else widen.
            # speed: at 10,000 waiting and a 65-row prefix, a step whose room no waiting
            # request fits asked 9 times (the prefix doubled up to the whole queue), now twice
            room = turn_past[0] if turn_past else None
            if room is None or (room > -math.inf
                                and not _fits_beyond(queue.remaining, fast_rows, room)):
                whole = True
            else:
                reach = min(n, 2 * reach)

    # --- several tenants or priority levels: the same lanes, classed -----------------------------

    def _classed_ordering(self, queue: QueueColumns, step: Step) -> Ordering:
        """The lanes with vLLM's priority levels outermost and, when tenants compete, the
        tenants' shares inside each level (docs/design.md, "Priority levels and tenants").

        Both lanes are sorted as in `decide()` with the priority level as their first key (lower
        first): the merge places a level only once every request of the levels above it is
        placed, so vLLM's strict order between levels holds, running prefills included. With
        one tenant per level that is all (`_decide`'s merge, charges and grants, unchanged);
        with two or more tenants at the level served first, `_tenant_merge` orders the step."""
        n, m = len(queue), len(step.prefilling)
        running = [p.view() for p in step.prefilling]
        tenant = np.concatenate(
            [queue.tenants, np.fromiter((p.tenant for p in running), np.intp, m)]
        )
        level = np.concatenate(
            [queue.priorities, np.fromiter((p.priority for p in running), np.int64, m)]
        )
        share = self._share_classes(level, tenant, step)
        self._single_class, self._class_of_id = None, {}
        run_cols = QueueColumns.of(running)
        arrival = np.concatenate([queue.arrival, run_cols.arrival])
        scores = np.concatenate([
            self.scores(queue, step.now) if n else np.zeros(0),
            self.scores(run_cols, step.now) if m else np.zeros(0),
        ])
        work = np.concatenate([queue.remaining, run_cols.remaining])
        prompt = np.concatenate([queue.prompt_tokens, run_cols.prompt_tokens])
        waiting = np.arange(n + m) < n
        tie = np.concatenate([np.arange(m, n + m), np.arange(m)])  # running first, then position
        fast_lane = np.lexsort((tie, arrival, -scores, level))
        fair_lane = np.lexsort((tie, arrival, waiting, level))
        head = n if step.budget is None or step.head is None else min(n, step.head)
        reach = max(head, 1) + m
        queue_work = float(queue.remaining.sum())
        budget = step.budget
        tokens = 0 if budget is None else max(0, budget.tokens - sum(budget.ahead))
        top = level == level.min()
        if len(np.unique(tenant[top])) > 1:  # tenants compete in the level served first
            # the tenants contend when the step cannot serve all they ask for
            self._tenants_contend = budget is not None and float(work.sum()) > tokens
            merged, classes, work_of, done = self._tenant_merge(
                fast_lane, fair_lane, share, level, work, prompt, waiting, reach, tokens
            )
            decided = self._decide(
                merged[0], merged[0], work_of, done, queue_work, n, step, queue.ids_of,
                fast_whole=True, shared=True, merged=merged,
            )
            assert decided is not None and decided.plan is not None  # no merge of its own
            # plan.lanes lists the placed requests in placement order: the merged keys'
            self._class_of_id = dict(zip(decided.plan.lanes, classes, strict=True))
            return decided
        self._tenants_contend = False  # one tenant per level: no share to keep
        fair = lane_prefix(fair_lane, waiting, reach)  # as the plain path: never widened
        while True:
            fast = lane_prefix(fast_lane, waiting, reach)
            entries = np.union1d(fast, fair)
            work_of, done = key_maps(entries, n, work, prompt)
            decided = self._decide(
                entry_keys(fast, n).tolist(), entry_keys(fair, n).tolist(), work_of, done,
                queue_work, n, step, queue.ids_of, fast_whole=int(waiting[fast].sum()) >= n,
                shared=bool(len(level)) and level.min() != level.max(),  # levels: hold the lower
            )
            if decided is not None:
                return decided
            reach *= 2

    def _tenant_merge(
        self,
        fast_lane: np.ndarray,
        fair_lane: np.ndarray,
        share: np.ndarray,
        level: np.ndarray,
        work: np.ndarray,
        prompt: np.ndarray,
        waiting: np.ndarray,
        reach: int,
        tokens: int,
    ) -> tuple[tuple[list[int], list[str], list[str]], list[int], dict[int, int], dict[int, int]]:
        """Tenants outermost, lanes inside: each share class's own two lanes merged as the
        paper's step merges them (its Fast lane starting only what it finishes in the step),
        then the classes interleaved by tag along those sequences (`tenant_tags`), level by
        level. Returns the placements (keys, lanes, charges), the class of each, and the work
        and done tokens by key of the entries read.

        A class's lanes are read while its waiting work before an entry is below the step's
        tokens (and up to its `reach`-th waiting request), and every running prefill of it: an
        entry past that has at least a step of work placed before it, so it gets nothing this
        step, whatever the other classes' tags.
        # speed: `ordering` alone, 1,000 waiting over 8 tenants and 4 running prefills: 1.5 ms
        # -> 0.44-0.71 ms per step (whole per-class lanes and masks before; two runs each)
        """
        n = int(waiting.sum())
        limit = float(tokens) if tokens > 0 else float("inf")
        fast_entries, fast_groups = class_prefixes(fast_lane, share, waiting, work, limit, reach)
        fair_entries, fair_groups = class_prefixes(fair_lane, share, waiting, work, limit, reach)
        work_of, done = key_maps(np.union1d(fast_entries, fair_entries), n, work, prompt)
        fast_keys = entry_keys(fast_entries, n).tolist()
        fair_keys = entry_keys(fair_entries, n).tolist()
        sequences: list[list[int]] = []
        labels: list[list[str]] = []
        charges: list[list[str]] = []
        for code, (fast_start, fast_end) in fast_groups.items():
            fair_start, fair_end = fair_groups[code]
            got, lanes, charged = merge(
                fast_keys[fast_start:fast_end], fair_keys[fair_start:fair_end], work_of,
                self.fast_weight, None, None, tokens or None, fit=tokens > 0,
            )
            sequences.append(got)
            labels.append(lanes)
            charges.append(charged)
        flat = np.asarray([k for group in sequences for k in group], dtype=np.int64)
        entry = np.where(flat >= 0, flat, n - flat - 1)  # key -(j + 1): running prefill j
        tags = tenant_tags(np.arange(len(entry)), share[entry], work[entry], self._served,
                           self._class_weight)
        order = np.lexsort((np.arange(len(entry)), tags, level[entry])).tolist()
        flat_keys = flat.tolist()
        flat_lanes = [lane for group in labels for lane in group]
        flat_charged = [c for group in charges for c in group]
        classes = share[entry].tolist()
        merged = (
            [flat_keys[i] for i in order],
            [flat_lanes[i] for i in order],
            [flat_charged[i] for i in order],
        )
        return merged, [classes[i] for i in order], work_of, done

    def _one_class(self, queue: QueueColumns, step: Step) -> None:
        """A step whose requests are all of one share class: the plain rule orders it, and the
        class is charged all the step's tokens (so a tenant that returns finds the others'
        counters moved on by what they got meanwhile, and has its credit)."""
        prefilling = step.prefilling
        if len(queue):
            level = int(queue.priority[0]) if queue.priority is not None else 0
            tenant = int(queue.tenant[0]) if queue.tenant is not None else 0
        elif prefilling:
            level, tenant = prefilling[0].priority, prefilling[0].tenant
        else:
            return
        code = int(self._share_classes(
            np.array([level], dtype=np.int64), np.array([tenant], dtype=np.intp), step
        )[0])
        self._class_of_id = {}
        self._single_class = code
        budget = step.budget
        work = float(queue.remaining.sum()) + sum(p.remaining for p in prefilling)
        self._tenants_contend = budget is not None and work > max(
            0, budget.tokens - sum(budget.ahead)
        )

    def _share_classes(self, level: np.ndarray, tenant: np.ndarray, step: Step) -> np.ndarray:
        """The share class (a code for one (priority level, tenant) pair) of every entry, and
        VTC's lift of the classes present, level by level.

        Levels are strict, so tenants share within a level: a tenant's counter at one level is
        not charged for what it got at another. A class that was not present at the last classed
        step starts no lower than the lowest counter of its level's classes that were (it banks
        no credit while away); a level none of whose classes stays restarts at 0."""
        low = int(level.min()) if len(level) else 0
        width = int(tenant.max()) + 1 if len(tenant) else 1
        combined, inverse = np.unique((level - low) * width + tenant, return_inverse=True)
        pairs = np.stack([combined // width + low, combined % width])  # (level, tenant) each
        if len(self._class_code) > MAX_SHARE_CLASSES:  # levels are client-chosen integers
            self._class_code, self._present = {}, None
            self._served, self._class_weight = np.zeros(0), np.zeros(0)
        codes = []
        for lvl, ten in pairs.T.tolist():
            code = self._class_code.setdefault((lvl, ten), len(self._class_code))
            codes.append(code)
        size = len(self._class_code)
        if len(self._served) < size:  # a new class is one back after a long pause
            grow = size - len(self._served)
            self._served = np.concatenate([self._served, np.full(grow, -np.inf)])
            self._class_weight = np.concatenate([self._class_weight, np.ones(grow)])
        levels: dict[int, list[int]] = {}
        for (lvl, ten), code in zip(pairs.T.tolist(), codes, strict=True):
            self._class_weight[code] = step.weight_of(ten)
            levels.setdefault(lvl, []).append(code)
        before = self._present
        served = self._served
        budget = step.budget
        self._step_tokens = budget.tokens if budget is not None else 0
        self._credit = self.tenant_credit_steps * self._step_tokens
        credit = self._credit / self._class_weight
        for present in levels.values():
            staying = [c for c in present if before is not None and c in before]
            if not staying:  # the level starts again: no one more than its credit behind
                known = served[present][np.isfinite(served[present])]
                lead = float(known.max()) if len(known) else 0.0
                served[present] = np.maximum(served[present], lead - credit[present])
                continue
            floor = min(served[c] for c in staying)
            for code in present:
                if code not in staying:
                    served[code] = max(served[code], floor - credit[code])
        self._present = frozenset(codes)
        share: np.ndarray = np.asarray(codes, dtype=np.intp)[inverse.reshape(-1)]
        return share

    # --- the step's decision from known prefixes of the lanes -------------------------------------

    def _decide(
        self,
        fast: list[int],
        fair: list[int],
        work: dict[int, int],
        done: dict[int, int],
        queue_work: float,
        n: int,
        step: Step,
        ids_of: Callable[[list[int]], list[str]],
        fast_whole: bool,
        shared: bool = False,
        merged: tuple[list[int], list[str], list[str]] | None = None,
        turn_past: list[float] | None = None,
        exact: ExactHead | None = None,
    ) -> Ordering | None:
        """`decide` from known prefixes of the two lanes whose merge places every running
        prefill and the scan's head. None when the Fast lane passed over its whole known prefix
        and more of it exists (`fast_whole` False): the caller widens the prefix and asks again
        (nothing was changed). `shared`: several classes share the step, so it is contested
        whenever its requests ask for more than it has; `merged`: the placements (keys, lanes,
        charges) made by the caller (the tenants' interleave of their own lanes), in place of
        the two lanes' merge, whose ledgers then stay reset. `turn_past`: `merge`'s (where the
        Fast lane's turn came at the end of `fast`), for the caller's test of a None answer."""
        self._pending = None
        front_held = self._front_held  # consumed only by a decision (not by a None answer)
        m = len(step.prefilling)
        if n + m == 0:
            self.ledger.reset()
            self._front_held = None
            return Ordering([], [], StepPlan())
        contested, tokens, slots = self._contest(fast, fair, work, queue_work, n, step, shared,
                                                 merged is not None)
        if exact is not None and (self._release or slots is None or slots <= exact.count):
            # a released hold lets every running prefill get tokens; few slots bound the scan
            exact.failed = True  # before the tokens do: order the whole head
            exact.widen = False
            return None
        passed: set[int] = set()
        if merged is not None:
            keys, lanes, charged = merged
        else:
            start = (self.ledger.fast, self.ledger.fair) if contested else None
            limit = slots if exact is None else exact.count
            keys, lanes, charged = merge(fast, fair, work, self.fast_weight, start, limit,
                                         tokens, fit=contested, skipped=passed,
                                         turn_past=turn_past, rest=exact is None)
        if passed and not fast_whole and passed.union(keys).issuperset(fast):
            return None
        rows = [k for k in keys if k >= 0]
        row_lanes = [lane for k, lane in zip(keys, lanes, strict=True) if k >= 0]
        if exact is not None:  # the first exact.count waiting placements, and the running after
            if len(rows) < exact.count:
                exact.failed = True
                return None
            end = keys.index(rows[exact.count - 1]) + 1
            rows, row_lanes, charged = rows[: exact.count], row_lanes[: exact.count], charged[:end]
        order = HeadOrder(rows, n) if len(rows) < n else np.asarray(rows, dtype=np.intp)
        lanes_out = HeadLanes(row_lanes, n)
        ids = dict(zip(rows, ids_of(rows), strict=True))
        ids.update({-(j + 1): p.request_id for j, p in enumerate(step.prefilling)})
        front_id = ids[fair[0]] if fair[0] in ids else ids_of([fair[0]])[0]
        placed = {ids[k]: lane for k, lane in zip(keys[: len(charged)], charged, strict=True)}
        if exact is not None and not contested and not exact.holds(
            rows, work, len(placed) == len(rows) + m, exact.reach.threshold or math.inf
        ):  # vLLM serves every running prefill: each must have its lane from the exact part
            exact.failed = True
            return None
        if not contested or slots is None:
            self._front_held = None
            return Ordering(order, lanes_out, StepPlan(front_id, budget=tokens, lanes=placed))
        cap, hold, given = self._cap_and_hold(keys, work, done, tokens, slots, step, fair[0], ids,
                                              front_held)
        if exact is not None and not exact.holds(rows, work, sum(given[: len(charged)]) >= tokens,
                                                 cap):
            exact.failed = True
            return None
        self._front_held = front_id if front_id in hold else None
        self._held, self._release, self._pending = bool(hold), False, placed
        plan = StepPlan(
            front_id,
            cap=cap,
            running_order=tuple(ids[k] for k in keys if k < 0),
            hold=frozenset(hold),
            budget=tokens,
            contested=True,
            lanes=placed,
        )
        return Ordering(order, lanes_out, plan)

    def _contest(
        self,
        fast: list[int],
        fair: list[int],
        work: dict[int, int],
        queue_work: float,
        n: int,
        step: Step,
        shared: bool,
        merged: bool,
    ) -> tuple[bool, int, int | None]:
        """Whether the step is contested, its prefill tokens and free slots; the ledgers started,
        kept or reset as `decide` does."""
        prefilling, budget = step.prefilling, step.budget
        tokens = 0 if budget is None else max(0, budget.tokens - sum(budget.ahead))
        contested = (
            budget is not None
            and tokens > 0
            and n + len(prefilling) >= 2
            and (fast[0] != fair[0] or shared)
            and queue_work + sum(p.remaining for p in prefilling) > tokens
        )
        slots = None if budget is None else max(0, budget.free_slots - len(budget.ahead))
        if slots == 0 and not prefilling:  # nothing can start or continue: the ledgers stay
            contested = False
        elif not contested or merged:
            self.ledger.reset()
        elif not self.ledger.active or work[fair[0]] < tokens:
            self.ledger.start(self.fast_weight * work[fast[0]], float(work[fair[0]]))
        return contested, tokens, slots

    def _cap_and_hold(
        self,
        keys: list[int],
        work: dict[int, int],
        done: dict[int, int],
        tokens: int,
        slots: int,
        step: Step,
        front: int,
        ids: dict[int, str],
        front_held: str | None,
    ) -> tuple[int, set[str], list[int]]:
        """The step's cap, the running prefills held back, and the grants in merge order they
        come from."""
        budget = step.budget
        assert budget is not None  # contested
        given = grants(keys, work, tokens, slots, done, budget.free_blocks, budget.block_size,
                       self._loads)
        got = dict(zip(keys, given, strict=True))
        hold = {p.request_id for j, p in enumerate(step.prefilling) if got.get(-(j + 1), 0) == 0}
        cap = tokens
        for i, (key, grant) in enumerate(zip(keys, given, strict=True)):
            if key < 0 and 0 < grant < work[key]:  # the running prefill the budget runs out on
                before = [work[k] for k, b in zip(keys[:i], given[:i], strict=True) if b > 0]
                if all(amount <= grant for amount in before):
                    cap = grant
                elif key == front and ids[key] == front_held:
                    cap = max(before)  # not held two steps in a row: at least what came before
                else:  # the cap would chunk a request placed before it: hold it instead
                    hold.add(ids[key])
                break
        if self._release:
            hold.clear()
        return cap, hold, given

    # --- after the step --------------------------------------------------------------------------

    def idle_step(self) -> None:
        """No prefill can run this step: nothing is scheduled, so nothing is booked; the ledgers
        stay (a step without prefill tokens neither ends nor moves a contest)."""
        self._pending = None
        self._single_class, self._class_of_id, self._tenants_contend = None, {}, False

    def on_step_end(
        self,
        admitted_ids: Sequence[str],
        prefill_tokens: int,
        prefill_by_request: Mapping[str, int] | None = None,
    ) -> None:
        """Charge each lane the prefill tokens vLLM scheduled for its placements."""
        placed, self._pending = self._pending, None
        self._release, self._held = self._held and prefill_tokens == 0, False
        self._charge_tenants(prefill_by_request)
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

    def _charge_tenants(self, prefill_by_request: Mapping[str, int] | None) -> None:
        """The share classes' counters after a classed step whose requests asked for more than
        its budget: each class is charged the prefill tokens vLLM scheduled for it over its
        tenant's weight, and none is left more than its credit behind its level's leader. A
        step that served every request all it asked for charges nothing."""
        class_of, self._class_of_id = self._class_of_id, {}
        single, self._single_class = self._single_class, None
        contested, self._tenants_contend = self._tenants_contend, False
        present = self._present
        if (not class_of and single is None) or present is None:
            return
        if not contested or prefill_by_request is None:
            return  # every request got all it asked for: nobody fell behind
        served, weight = self._served, self._class_weight
        if single is not None:
            served[single] += sum(prefill_by_request.values()) / weight[single]
        for request_id, tokens in prefill_by_request.items():
            charged = class_of.get(request_id)
            if charged is not None:
                served[charged] += tokens / weight[charged]
        by_level: dict[int, list[int]] = {}
        for (lvl, _), code in self._class_code.items():
            if code in present:
                by_level.setdefault(lvl, []).append(code)
        # no tenant falls further behind than its credit and one step: with less than a step
        # of lag kept, a tenant that got nothing in a step (its tie lost to a long running
        # prefill) would be even again at the next one, and lose it again
        for codes in by_level.values():
            lead = served[codes].max()
            keep = (self._credit + self._step_tokens) / weight[codes]
            served[codes] = np.maximum(served[codes], lead - keep)

    def tenant_counters(self) -> dict[int, float]:
        """Tenant code -> counter (uncached tokens over weight, relative to the lowest) of the
        tenants present at the top priority level of the last classed step, for tests, the
        decision trace and `fairway inspect`; empty after a one-class step."""
        if self._present is None:
            return {}
        present = [(key, code) for key, code in self._class_code.items() if code in self._present]
        top = min(lvl for (lvl, _), _ in present)
        counters = {ten: float(self._served[code]) for (lvl, ten), code in sorted(present)
                    if lvl == top}
        low = min(counters.values())
        return {ten: value - low for ten, value in counters.items()}

    def ledgers(self) -> dict[str, float]:
        return dataclasses.asdict(self.ledger)


@dataclass(slots=True)
class ExactHead:
    """Order only the first `count` waiting placements of a step exactly, when vLLM's scan
    surely stops among them (`TokenReach`) and nothing past them can get tokens: a contested
    step's grants run out among them (the running prefills placed later are held), an
    uncontested step places every running prefill among them (vLLM serves them in its own
    order, so any may get tokens, charged to the lane that placed it).

    A step that admits a few long prompts reads only a few positions, fewer than its free slots
    (`Step.head`): the lanes' prefixes, the merge and the ids are then those of `count` waiting
    requests instead of one per free slot. `failed` is set when the check does not hold (or the
    last plan's hold is released, so that every running prefill may get tokens): the caller
    then tries twice the count while that is below the free slots and the scan's head (the scan
    read past the first placements, short hits say), else orders the whole head; the step
    decides as if the failed attempts were never made.
    # speed: benchmarks/token_reach.py, 1,000 waiting, the prefilling node (64 slots): Fairway's
    # own step 0.735 -> 0.599 ms (median, switched step by step on one node); admit and busy
    # 0.446 -> 0.431 and 0.428 -> 0.403 ms
    """

    count: int
    reach: TokenReach
    unprobed: np.ndarray | None
    failed: bool = False
    #: After a failure: whether twice the count may hold (False: only the whole head).
    widen: bool = True

    def holds(self, rows: list[int], work: Mapping[int, int], settled: bool, cap: float) -> bool:
        """Whether vLLM's scan, capped at `cap` per request, stops among `rows` (the exact
        waiting placements, in order) and what lies past them is `settled`: the plan's grants
        ran out within them (contested), or every running prefill was placed among them."""
        if not settled:
            return False
        unknown = [False] * len(rows) if self.unprobed is None else self.unprobed[rows].tolist()
        return self.reach.reached([work[k] for k in rows], unknown, float(cap)) is not None


#: Waiting placements a step orders exactly first when the token reach applies (`ExactHead`).
EXACT_FIRST = 8
#: After a first attempt that the scan may read past, the next orders this many times as many
#: placements (while fewer than the head); 1: the whole head at once.
EXACT_WIDEN = 2


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


def grants(
    keys: Sequence[int],
    work: Mapping[int, int],
    tokens: int,
    slots: int,
    done: Mapping[int, int] | None = None,
    free_blocks: int | None = None,
    block_size: int = 16,
    loads: Container[int] = (),
) -> list[int]:
    """Prefill tokens each placement gets when the step's `tokens` are given out in merge order:
    min(its work, what is left), a waiting request (key >= 0) only while `slots` last.

    A waiting request in `loads` (a hit in the CPU offload tier) gets nothing and takes no slot:
    vLLM starts its copy and computes nothing for it in this step (it waits outside the running
    set for the copy), so the tokens go on to the next placements; its blocks are counted.

    With `free_blocks` (and `done`: the tokens each request already holds, cached or computed)
    the KV stop is foreseen as vLLM makes it: the first waiting request whose blocks do not fit
    (all of them counted, the cached ones too, since evictable cached blocks are in the free
    count) gets nothing, nor does any waiting request after it; running prefills keep getting
    tokens (their new blocks only). So a plan never holds a running prefill back for a waiting
    request that cannot start: that step would have nothing to schedule, and the next the same."""
    out: list[int] = []
    left = tokens
    blocks = free_blocks
    stopped = False
    for key in keys:
        if key >= 0 and key in loads and not stopped:
            out.append(0)
            if blocks is not None and done is not None:
                need = -(-done[key] // block_size)
                if need > blocks:
                    stopped = True
                else:
                    blocks -= need
            continue
        if left <= 0 or (key >= 0 and (slots <= 0 or stopped)):
            out.append(0)
            continue
        given = min(work[key], left)
        if blocks is not None and done is not None:
            held = done[key]
            need = -(-(held + given) // block_size) - (-(-held // block_size) if key < 0 else 0)
            if key >= 0 and need > blocks:
                stopped = True
                out.append(0)
                continue
            blocks -= min(need, blocks)
        if key >= 0:
            slots -= 1
        out.append(given)
        left -= given
    return out


def _fits_beyond(remaining: np.ndarray, known: np.ndarray, room: float) -> bool:
    """Whether a waiting row outside `known` has work within `room`."""
    fits = remaining <= room
    fits[known] = False
    return bool(fits.any())


def _with_running(
    fast_rows: np.ndarray,
    scores: np.ndarray,
    arrival: np.ndarray,
    run_scores: list[float],
    running: Sequence[PrefillingRequest],
) -> list[int]:
    """The Fast lane over waiting `fast_rows` (already in the lane's order: score descending,
    then older) and the running prefills (keys -(j + 1), by the same keys, before a waiting row
    with an equal key, then by j)."""
    rows: list[int] = fast_rows.tolist()
    if not running:
        return rows
    score_of, arrival_of = scores.item, arrival.item

    def lane_key(i: int) -> tuple[float, float]:
        row = rows[i]
        return -score_of(row), arrival_of(row)

    keyed = sorted(((-s, r.arrival, j) for j, (s, r) in enumerate(zip(run_scores, running,
                                                                       strict=True))))
    out: list[int] = []
    start = 0
    everyone = range(len(rows))
    for key_score, key_arrival, j in keyed:
        # the waiting rows whose key is below the running prefill's come before it: a binary
        # search of the lane's keys, read for the rows it visits only
        # speed: 19 lane rows, 3 running prefills: 10.4 -> 5.9 us per call (a numpy count over
        # the rows per prefill before; benchmarks/call_costs.py)
        ahead = bisect_left(everyone, (key_score, key_arrival), lo=start, key=lane_key)
        if ahead > start:
            out.extend(rows[start:ahead])
            start = ahead
        out.append(-(j + 1))
    out.extend(rows[start:])
    return out
