"""Fairway: the paper's two lanes and work charges, the charges carried across the steps of a
long Fair front.

Must not import vllm. Registered as `fairway`. The paper's per-step rule, ledgers reset every
step and running prefills left to vLLM, is `fairway-step` (`fairway.policies.fairway_step`); both
use the same Fast-lane score and the same merge (`fairway.policies.lanes`).

Read `FairwayPolicy.plan` first: the step's rule in plain Python over the whole lanes (its
`order` is the paper's, `fairway-step`'s). `ordering` below it is what the engine runs: the same
plan from the first entries of each lane only, found by partial selections over the queue's
numpy columns; tests/unit/test_queue.py (hypothesis) keeps the two equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fairway.policies.base import register_policy
from fairway.policies.lanes import (
    FAIR,
    FAST,
    FastLanePolicy,
    fair_lane_head,
    fast_lane_head,
    merge,
)
from fairway.policies.queue import (
    UNPLACED_LANE,
    Ordering,
    PrefillingRequest,
    QueueColumns,
    QueuedRequest,
    Step,
    StepPlan,
    head_order,
)


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


@register_policy("fairway")
@dataclass(eq=False)
class FairwayPolicy(FastLanePolicy):
    """The paper's two lanes and work charges over waiting and prefilling requests, carried
    across the steps a long Fair front needs.

    Lanes. Both lanes hold every request whose prefill is not finished: the waiting ones and the
    running ones in chunked prefill. Fast: `FastLanePolicy`'s order (s = h / max(c, 1) +
    wait / SLO; a running prefill's computed tokens play the cached part), running before
    waiting on a tie.
    Fair: the running prefills by arrival, then the waiting requests by arrival (started first,
    finished first). Each request is in both lanes and is served by whichever places it first.
    In a contested step the Fast lane starts only what it finishes in the step (`merge`'s
    `fit`): a request it could only start is left to the Fair lane, so every partial start is
    the Fair lane's last placement, and the Fair front from the next step on. (Without these
    two rules the Fast lane started long requests at the end of steps and later steps held them
    back half done, several at a time: the tail of E2's long prompts, and in a small KV cache a
    queue that could not start at all.)

    Merge (`merge`, the paper's): the lane with the smaller ledger places its next request not yet
    placed and adds its work (uncached tokens; x w = fast_weight for Fast); ties go to Fast.
    Once the step's free request slots are placed, only running prefills are placed (a waiting
    request without a slot gets nothing this step), then the rest of the queue. Each placed
    request is charged to the lane that placed it, except a Fair front (the oldest request) that
    the per-step rule would starve (work >= w P), which is always the Fair lane's.

    Contest. A step is contested when at least two requests compete, the two lanes' fronts
    differ, and their work exceeds P (the step's token budget minus the running decodes').
    Otherwise it is vLLM's own step (order by the paper's merge, nothing capped or held) and the
    ledgers restart. Ledgers start as the paper's (w x the Fast front's work, the Fair front's
    work); after each contested step each lane is charged the prefill tokens vLLM actually
    scheduled for the requests it placed (x w for Fast), and the next step's merge starts from
    the charged ledgers. They restart (the paper's start again) at every contested step whose
    Fair front needs less than one step (work < P): the paper's per-step rule already starts such
    a front in the step (at most its work / w goes ahead of it), so carrying is needed only for
    a front that needs several steps, which the per-step rule starves from w x P tokens on.

    Applying the step (`Ordering.plan`, a `StepPlan` the scheduler applies): the waiting queue in
    merge order; the prefilling running requests in merge order; the step's tokens given out in
    merge order (`grants`) decide the rest (vLLM serves running requests first, whatever the order):
    a running prefill that gets nothing is held back for the step, and the one the budget runs out
    on keeps its grant and no more (vLLM's per-request cap, `long_prefill_token_threshold`, set for
    the step to that grant). If a request placed before it would need more than that grant, the
    running prefill is held back instead (it loses less than that request's work, and its lane is
    charged only what it got); the Fair front is not held so two steps in a row: the second time
    its cap is the largest work placed before it, so it gets at least that much (the requests
    after it in vLLM's service order get less; one of them may be left half done). A cap on
    every running prefill at its lane's share of each step was measured and not kept (one E2 run
    of that variant): it changed nothing for hits behind a long
    miss once the Fair front is charged to its own lane, and it raised E2's p99s (up to 1.75 x
    `fairway-step`'s), making several long prefills share steps and all finish later.

    The grants foresee vLLM's KV stop (`grants`), so no running prefill is held for a waiting
    request that cannot start, and after a step that held prefills and scheduled nothing the
    next plan holds none.

    Guarantee (contested steps; w = fast_weight, P the step's prefill budget, D = fast - fair):
        * the lagging lane goes first: D <= 0, the Fast lane places first (its first request
          that fits the step; if none does, the Fair lane); else the Fair lane;
        * started first, finished first: the Fair front is the oldest running prefill while one
          is partly done, else the oldest waiting request; after a contested step at most one
          prefill is partly done that was not before it, the Fair lane's last placement (unless
          vLLM's one cap could not split the step as planned: a held prefill, or the Fair
          front's cap raised after it was held);
        * while the ledgers carry, D stays within one chunk of the other lane: D <= 0 before a
          step gives D' <= max(D, w P) after it, D > 0 gives D' >= min(D, -P) (with exact
          admission: no KV-block stop, no preemption). The charges are the scheduled tokens, so
          over any run of carried steps w x (Fast tokens) - (Fair tokens) = D - D_0 stays within
          [-P, w P] of -D_0 (D_0 = the paper's start gap): the Fair lane gets w / (1 + w) of the
          tokens and the Fast lane 1 / (1 + w) while both have demand, each taking what the
          other does not use;
        * the Fair front O gets prefill tokens within ceil(max(0, -D) / (w P)) + 1 contested
          steps of becoming the front (each step the Fast lane goes first raises D by w x its
          tokens, and Fast takes the whole step only while its ledger stays below Fair's): for
          a new contest ceil(W_O / (w P)) + 1 steps, W_O its work; once the start gap is worked
          off, within 2 steps, whatever O's size; plus one step for each time O is held rather
          than capped below a request placed before it, never two steps in a row;
        * on the first contested step after an uncontested one, with no running prefill, the
          waiting order equals `fairway-step`'s merge with the Fast lane passing over what it
          cannot finish in the step (the worked example holds for both).

    Caller's contract: call `ordering()` before every step (also when only prefills run) and
    `on_step_end(..., prefill_by_request=)` after it; `order()` alone gives the paper's order.
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
    ledger: LaneLedgers = field(init=False, repr=False, default_factory=LaneLedgers)
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

    # --- the rule ---------------------------------------------------------------------------------

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """The paper's order (`fairway-step`'s): what `plan` gives without a step budget."""
        return [int(i) for i in np.asarray(self.plan(queue, Step(now)).order)]

    def plan(self, waiting: Sequence[QueuedRequest], step: Step) -> Ordering:
        """The step's order and plan, from the whole lanes sorted in plain Python.

        Fast lane: score descending, then older, a running prefill before a waiting request on
        a tie; Fair lane: the running prefills (started first, finished first), then the waiting
        requests, each by arrival. Running prefills have keys -(j + 1), waiting requests their
        positions; each request is in both lanes."""
        running = [p.view() for p in step.prefilling]
        entries = [(r, i) for i, r in enumerate(waiting)] + [
            (r, -(j + 1)) for j, r in enumerate(running)
        ]
        score = {key: self.fast_score(r, step.now) for r, key in entries}

        def tie(key: int) -> tuple[int, int]:  # running first, then by position
            return (0, -key - 1) if key < 0 else (1, key)

        fast = [k for _, k in sorted(entries, key=lambda e: (-score[e[1]], e[0].arrival,
                                                              tie(e[1])))]
        fair = [k for _, k in sorted(entries, key=lambda e: (e[1] >= 0, e[0].arrival,
                                                              tie(e[1])))]
        work = {key: r.remaining for r, key in entries}
        done = {key: r.prompt_tokens - r.remaining for r, key in entries}
        queue_work = float(sum(r.remaining for r in waiting))
        decided = self._decide(
            fast, fair, work, done, queue_work, len(waiting), step,
            lambda rows: [waiting[i].request_id for i in rows], fast_whole=True,
        )
        assert decided is not None  # the whole Fast lane is never used up by passes alone
        return decided

    # --- what the engine runs: the same plan from the first entries of each lane ------------------

    def ordering(self, queue: QueueColumns, step: Step) -> Ordering:
        """`plan()` over the scheduler's columns: only the rows either lane can place this step
        (the scan's head plus one per running prefill, more for the Fast lane when it passes over
        requests that do not fit the step) are found and read in Python. A queue of several
        tenants or priority levels takes `_classed_ordering`."""
        tier = queue.tier_tokens
        self._loads = frozenset(np.flatnonzero(tier > 0).tolist()) if tier is not None else ()
        if queue.mixed or _classes_differ(queue, step.prefilling):
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
        running = [p.view() for p in step.prefilling]
        scores = self.scores(queue, step.now) if n else np.zeros(0)
        head = n if step.budget is None or step.head is None else min(n, step.head)
        reach = min(n, max(head, 1) + m)  # rows either lane may place in head + m placements
        fair_rows = fair_lane_head(queue.arrival, reach).tolist()
        run_scores = self.scores(QueueColumns.of(running), step.now).tolist() if m else []
        # the Fair lane: running prefills (by arrival, then position), then the waiting rows
        fair = sorted(range(-1, -m - 1, -1), key=lambda k: (running[-k - 1].arrival, -k))
        fair += fair_rows
        queue_work = float(queue.remaining.sum())
        while True:
            fast_rows = fast_lane_head(scores, queue.arrival, reach) if n else np.zeros(0, np.intp)
            rows = np.concatenate([fast_rows, np.asarray(fair_rows, dtype=np.intp)])
            work: dict[int, int] = {}
            done: dict[int, int] = {}
            for row, amount, length in zip(
                rows.tolist(), queue.remaining[rows].tolist(), queue.prompt_tokens[rows].tolist(),
                strict=True,
            ):
                work[row] = int(amount)
                done[row] = int(length) - int(amount)
            for j, r in enumerate(running):
                work[-(j + 1)] = r.remaining
                done[-(j + 1)] = r.prompt_tokens - r.remaining
            fast = _with_running(
                fast_rows.tolist(),
                [(-s, r.arrival) for s, r in zip(run_scores, running, strict=True)],
                lambda row: (-scores.item(row), queue.arrival.item(row)),
            )
            decided = self._decide(fast, fair, work, done, queue_work, n, step, queue.ids_of,
                                   fast_whole=len(fast_rows) >= n)
            if decided is not None:
                return decided
            reach = min(n, 2 * reach)  # the Fast lane passed over its whole known prefix

    # --- several tenants or priority levels: the same lanes, classed -----------------------------

    def _classed_ordering(self, queue: QueueColumns, step: Step) -> Ordering:
        """The lanes with vLLM's priority levels outermost and, when tenants compete, the
        tenants' shares inside each level (docs/design.md, "Priority levels and tenants").

        Both lanes are sorted as in `plan()` with the priority level as their first key (lower
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
        fair = _lane_prefix(fair_lane, waiting, reach)  # as the plain path: never widened
        while True:
            fast = _lane_prefix(fast_lane, waiting, reach)
            entries = np.union1d(fast, fair)
            work_of, done = _key_maps(entries, n, work, prompt)
            decided = self._decide(
                _keys(fast, n).tolist(), _keys(fair, n).tolist(), work_of, done, queue_work, n,
                step, queue.ids_of, fast_whole=int(waiting[fast].sum()) >= n,
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
        fast_entries, fast_groups = _class_prefixes(fast_lane, share, waiting, work, limit, reach)
        fair_entries, fair_groups = _class_prefixes(fair_lane, share, waiting, work, limit, reach)
        work_of, done = _key_maps(np.union1d(fast_entries, fair_entries), n, work, prompt)
        fast_keys = _keys(fast_entries, n).tolist()
        fair_keys = _keys(fair_entries, n).tolist()
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

    # --- the step's decision, from the lanes ------------------------------------------------------

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
    ) -> Ordering | None:
        """Contest, ledgers, merge and plan from the two lanes (known prefixes of them whose
        merge places every running prefill and the scan's head). None when the Fast lane passed
        over its whole known prefix and more of it exists (`fast_whole` False): the caller widens
        the prefix and asks again (nothing was changed). `shared`: tenants share the step, so
        it is contested whenever its requests ask for more than it has (the grants then hold a
        running prefill of a tenant ahead of its share); `merged`: the placements (keys, lanes,
        charges) made by the caller (the tenants' interleave of their own lanes), in place of
        the two lanes' merge, whose ledgers then stay reset."""
        self._pending = None
        front_held = self._front_held  # consumed only by a decision (not by a None answer)
        prefilling, budget = step.prefilling, step.budget
        m = len(prefilling)
        if n + m == 0:
            self.ledger.reset()
            self._front_held = None
            return Ordering([], [], StepPlan())
        tokens = 0 if budget is None else max(0, budget.tokens - sum(budget.ahead))
        contested = (
            budget is not None
            and tokens > 0
            and n + m >= 2
            and (fast[0] != fair[0] or shared)
            and queue_work + sum(p.remaining for p in prefilling) > tokens
        )
        slots = None if budget is None else max(0, budget.free_slots - len(budget.ahead))
        if slots == 0 and m == 0:  # nothing can start or continue: the ledgers stay (idle_step)
            contested = False
        elif not contested or merged is not None:
            self.ledger.reset()
        elif not self.ledger.active or work[fair[0]] < tokens:
            # the paper's start; a Fair front that fits in one step is served by the paper's
            # per-step rule (at most its work / w goes ahead of it), so the carry restarts
            self.ledger.start(self.fast_weight * work[fast[0]], float(work[fair[0]]))
        start = (self.ledger.fast, self.ledger.fair) if contested else None
        # Placements until a lane's known prefix is used up: each is the whole queue's merge's;
        # every running prefill and at least the scan's head of waiting rows are placed.
        passed: set[int] = set()
        if merged is not None:
            keys, lanes, charged = merged
        else:
            keys, lanes, charged = merge(fast, fair, work, self.fast_weight, start, slots,
                                         tokens, fit=contested, skipped=passed)
        if passed and not fast_whole and passed.union(keys).issuperset(fast):
            return None
        rows = [k for k in keys if k >= 0]
        row_lanes = [lane for k, lane in zip(keys, lanes, strict=True) if k >= 0]
        order = head_order(rows, n) if len(rows) < n else np.asarray(rows, dtype=np.intp)
        lanes_out = row_lanes + [UNPLACED_LANE] * (n - len(rows))
        ids = dict(zip(rows, ids_of(rows), strict=True))
        for j, p in enumerate(prefilling):
            ids[-(j + 1)] = p.request_id
        front = fair[0]
        front_id = ids[front] if front in ids else ids_of([front])[0]
        placed = {ids[k]: lane for k, lane in zip(keys, charged, strict=True)}
        if not contested or slots is None:
            self._front_held = None
            return Ordering(order, lanes_out, StepPlan(front_id, budget=tokens, lanes=placed))
        assert budget is not None  # contested
        given = grants(keys, work, tokens, slots, done, budget.free_blocks, budget.block_size,
                       self._loads)
        got = dict(zip(keys, given, strict=True))
        hold = {p.request_id for j, p in enumerate(prefilling) if got.get(-(j + 1), 0) == 0}
        cap = tokens
        for i, (key, grant) in enumerate(zip(keys, given, strict=True)):
            if key < 0 and 0 < grant < work[key]:  # the running prefill the budget runs out on
                before = [work[k] for k, b in zip(keys[:i], given[:i], strict=True) if b > 0]
                if all(amount <= grant for amount in before):
                    cap = grant
                elif key == front and ids[key] == front_held:
                    cap = max(before)  # the Fair front is not held two steps in a row: it gets
                    # at least as much as any request placed before it
                else:  # the cap would chunk a request placed before it: hold it instead
                    hold.add(ids[key])
                break
        if self._release:
            hold.clear()
        self._front_held = front_id if front_id in hold else None
        self._held, self._release = bool(hold), False
        self._pending = placed
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


#: Share classes remembered at most (levels are integers a client picks); past it all restart.
MAX_SHARE_CLASSES = 4096


def _classes_differ(queue: QueueColumns, prefilling: Sequence[PrefillingRequest]) -> bool:
    """Whether the running prefills bring a tenant or level the (one-class) queue lacks."""
    if not prefilling:
        return False
    tenant = int(queue.tenants[0]) if len(queue) else prefilling[0].tenant
    level = int(queue.priorities[0]) if len(queue) else prefilling[0].priority
    return any(p.tenant != tenant or p.priority != level for p in prefilling)


def tenant_tags(
    entries: np.ndarray,
    tenant: np.ndarray,
    work: np.ndarray,
    served: np.ndarray,
    weights: np.ndarray,
) -> np.ndarray:
    """The tenant tag of each entry of a lane (`entries`, in the lane's order): its tenant's
    counter plus the work of that tenant's entries before it in the lane, over its weight. The
    merge by tag (smallest first) is the work charges one level up: the tenant that has been
    served least, for its weight, places next."""
    t = tenant[entries]
    w = work[entries]
    by_tenant = np.argsort(t, kind="stable")
    cum = np.cumsum(w[by_tenant])
    starts = np.searchsorted(t[by_tenant], t[by_tenant], side="left")
    before_sorted = cum - w[by_tenant] - (cum[starts] - w[by_tenant][starts])
    before = np.empty_like(before_sorted)
    before[by_tenant] = before_sorted
    tags: np.ndarray = served[t] + before / weights[t]
    return tags


def _lane_prefix(lane: np.ndarray, waiting: np.ndarray, reach: int) -> np.ndarray:
    """The lane's entries up to its `reach`-th waiting request, and every running prefill."""
    is_waiting = waiting[lane]
    rank = np.cumsum(is_waiting)
    prefix: np.ndarray = lane[~is_waiting | (rank <= reach)]
    return prefix


def _keys(entries: np.ndarray, n: int) -> np.ndarray:
    """The merge's keys of entries (rows 0..n-1 waiting, n + j running prefill j): a waiting
    row is its row, running prefill j is -(j + 1)."""
    keys: np.ndarray = np.where(entries < n, entries, n - entries - 1)
    return keys


def _key_maps(
    entries: np.ndarray, n: int, work: np.ndarray, prompt: np.ndarray
) -> tuple[dict[int, int], dict[int, int]]:
    """Work and tokens already held (cached or computed), by key, of these entries only."""
    keys = _keys(entries, n).tolist()
    amounts = work[entries].astype(np.int64)
    return (
        dict(zip(keys, amounts.tolist(), strict=True)),
        dict(zip(keys, (prompt[entries] - amounts).tolist(), strict=True)),
    )


def _class_prefixes(
    lane: np.ndarray, share: np.ndarray, waiting: np.ndarray, work: np.ndarray, limit: float,
    reach: int,
) -> tuple[np.ndarray, dict[int, tuple[int, int]]]:
    """Each share class's part of a lane, in the lane's order, while the class's waiting work
    before an entry is below `limit` (the entry reaching it included) and up to its `reach`-th
    waiting entry, with every running prefill: the entries grouped by class, and each class's
    [start, end) in them (one stable sort and grouped cumulative sums for all classes)."""
    classes = share[lane]
    order = np.argsort(classes, kind="stable")
    grouped, group = lane[order], classes[order]
    is_waiting = waiting[grouped]
    waiting_work = np.where(is_waiting, work[grouped], 0.0)
    starts = np.searchsorted(group, group, side="left")
    cum = np.cumsum(waiting_work)
    before = cum - waiting_work - (cum[starts] - waiting_work[starts])
    count = np.cumsum(is_waiting)
    rank = count - (count[starts] - is_waiting[starts])
    keep = ~is_waiting | ((before < limit) & (rank <= reach))
    kept, kept_group = grouped[keep], group[keep]
    codes, first = np.unique(kept_group, return_index=True)
    ends = [*first[1:].tolist(), len(kept)]
    spans = dict(zip(codes.tolist(), zip(first.tolist(), ends, strict=True), strict=True))
    return kept, spans
