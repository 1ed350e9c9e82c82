"""The paper's Fairway rule, one step at a time: a Fast lane and a Fair lane merged by work charges.

Must not import vllm. Registered as `fairway-step`, and the ablations `fairway-abswait` (wait in
absolute seconds) and `fairway-nofair` (Fast lane only), which stay on this per-step rule. The
cross-step version (`fairway`, `fairway.policies.fairway`) shares the Fast-lane score and the
merge (`fairway.policies.lanes`).

Read `FairwayStepPolicy.order` first: the rule in plain Python. `ordering` below it is what the
engine runs, the same rule over numpy columns and, when vLLM's scan reaches only the head of the
queue, for that head only; tests/unit/test_fairway_step_reference.py and tests/unit/test_queue.py
(hypothesis) keep the two equal position for position and lane for lane.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fairway.policies.base import arrival_order, register_policy
from fairway.policies.lanes import FAST, FastLanePolicy, fast_lane_order, first_rows, merge
from fairway.policies.queue import (
    UNPLACED_LANE,
    Ordering,
    QueueColumns,
    QueuedRequest,
    Step,
    head_order,
)

WaitMode = Literal["relative", "absolute"]


@register_policy("fairway-step")
@register_policy("fairway-abswait", wait_mode="absolute")
@register_policy("fairway-nofair", fair_lane=False)
@dataclass(eq=False)
class FairwayStepPolicy(FastLanePolicy):
    """The paper's rule: two lanes over the waiting queue, merged by work charges, every step anew.

    Fast lane: `FastLanePolicy`'s score, highest first. `fairway-abswait` uses wait /
    patience_floor_s instead of wait / SLO (absolute seconds, same scale at the floor).

    Fair lane: arrival order, oldest first.

    Merge (work charges, `lanes.merge`): each lane has a ledger that starts at the work
    (`remaining`, uncached tokens) of its front request, Fast-lane work counted `fast_weight`
    times. The lane with the smaller ledger places its next request not yet placed and adds that
    request's (weighted) work; ties go to Fast. A request placed by one lane is skipped by the
    other. Consequence: the work placed ahead of the oldest request M is at most
    M.remaining / fast_weight plus one request's overshoot. The bound holds per step (ledgers
    reset every step): M starts in this step only if that is less than the step's token budget.
    A miss of fast_weight x budget tokens or more gets nothing while hits keep filling the steps,
    until its wait/SLO term lifts it in the Fast lane (benchmarks/e3_flood.py measures this); and
    once M has started, vLLM serves it first with the whole budget. `fairway` (the charges
    carried across steps) fixes both.

    Worked example: five hits of 300 uncached tokens and an older 6,000-token miss M. Fast ledger
    1,200 (4 x 300) vs Fair ledger 6,000: H1..H4 bring Fast to 6,000, the tie goes to Fast (H5,
    7,200), then Fair places M. 1,500 tokens (= M/4) go ahead of M; with a 2,048-token step
    budget M gets the other 548 tokens of the step.

    Caller's contract: `Policy`'s; the policy keeps no state across steps.
    """

    #: "relative" (wait / SLO) or "absolute" (wait / patience_floor_s): the E4 ablation.
    wait_mode: WaitMode = "relative"
    #: False: Fast lane only (the `fairway-nofair` ablation).
    fair_lane: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.wait_mode not in ("relative", "absolute"):
            raise ValueError(f"wait_mode must be 'relative' or 'absolute', got {self.wait_mode!r}")
        if not isinstance(self.fair_lane, bool):
            raise ValueError(f"fair_lane must be true or false, got {self.fair_lane!r}")

    # --- the rule ---------------------------------------------------------------------------------

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        return self.order_with_lanes(queue, now)[0]

    def order_with_lanes(
        self, queue: Sequence[QueuedRequest], now: float
    ) -> tuple[list[int], list[str]]:
        """The order and the lane that placed each position."""
        fast = fast_lane_order(self.fast_scores(queue, now), queue)
        if not self.fair_lane:
            return fast, [FAST] * len(fast)
        work = [r.remaining for r in queue]
        placed, lanes, _ = merge(fast, arrival_order(queue), work, self.fast_weight)
        return placed, lanes

    def wait_units(self, prompt_tokens: np.ndarray) -> np.ndarray | float:
        if self.wait_mode == "relative":
            return super().wait_units(prompt_tokens)
        return self.patience_floor_s

    # --- what the engine runs: the rule over columns, for the scan's head -------------------------

    def ordering(self, queue: QueueColumns, step: Step) -> Ordering:
        """`order()` over the columns; when the scan reaches only `step.head` positions, those
        exactly, then the other rows in row order (labelled `UNPLACED_LANE`), in O(n) numpy
        and O(head) Python: the merge reads each lane only at its first entry not yet placed,
        so `head` placements need only each lane's first `head` entries."""
        n = len(queue)
        head = n if step.head is None else max(0, min(step.head, n))
        scores = self.scores(queue, step.now)
        if head == n:  # the whole order
            fast = np.lexsort((queue.arrival, -scores)).tolist()
            if not self.fair_lane:
                return Ordering(fast, [FAST] * n)
            fair = np.argsort(queue.arrival, kind="stable").tolist()
            placed, lanes, _ = merge(fast, fair, queue.remaining.tolist(), self.fast_weight)
            return Ordering(placed, lanes)
        fast_rows = first_rows((queue.arrival, -scores), head)
        if not self.fair_lane:
            first, lanes = fast_rows.tolist(), [FAST] * head
        else:
            fair_rows = first_rows((queue.arrival,), head)
            placed, lanes, _ = merge(
                fast_rows.tolist(), fair_rows.tolist(), queue.remaining, self.fast_weight
            )
            first, lanes = placed[:head], lanes[:head]
        return Ordering(head_order(first, n), lanes + [UNPLACED_LANE] * (n - len(lanes)))
