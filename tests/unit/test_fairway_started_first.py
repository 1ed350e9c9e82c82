"""`fairway`'s two rules for a started prefill, and its foresight of vLLM's KV stop.

Started first, finished first: the Fair lane serves the running prefills before any waiting
request, and in a contested step the Fast lane starts only what it finishes in the step, so
every partial start is the Fair lane's. A plan never holds a running prefill back for a waiting
request whose KV blocks do not fit (that step would schedule nothing, and the next the same).
"""

from __future__ import annotations

from fairway.policies import PrefillingRequest, QueuedRequest, StepBudget, get
from fairway.policies.fairway import grants
from fairway.policies.lanes import FAIR, FAST, merge
from fairway.policies.queue import QueueColumns, Step


def _plan(policy, queue, budget, running=(), now=10.0):
    return policy.ordering(QueueColumns.of(queue), Step(now, None, budget, tuple(running)))


def test_the_fast_lane_passes_over_a_hit_it_cannot_finish_in_the_step() -> None:
    """A big hit (4,000 uncached tokens, the best score) would be started by the Fast lane and
    left half done; it is passed over, the small hit goes first, the miss takes the rest."""
    miss = QueuedRequest("M", 0.0, 6_000, 0)
    small = QueuedRequest("H", 1.0, 4_500, 3_000)  # 1,500 to compute
    big = QueuedRequest("B", 1.0, 24_000, 20_000)  # 4,000 to compute, score 5
    policy = get("fairway", fast_weight=1.0)
    ordering = _plan(policy, [miss, small, big], StepBudget(2_048, 8))
    order = [("M", "H", "B")[i] for i in ordering.order]
    assert order[:2] == ["H", "M"]
    assert ordering.lanes[:2] == [FAST, FAIR]
    # the reference rule agrees
    ref = get("fairway", fast_weight=1.0).decide([miss, small, big], Step(10.0, None,
                                                                          StepBudget(2_048, 8)))
    assert list(ref.order) == list(ordering.order)


def test_without_a_step_budget_the_merge_passes_nothing() -> None:
    """`fit` needs the step's tokens: the paper's merge (`fairway-step`, `order()`) is unchanged."""
    work = {0: 4_000, 1: 1_500, 2: 6_000}
    keys, lanes, _ = merge([0, 1, 2], [2, 0, 1], work, 1.0)
    assert keys[0] == 0 and lanes[0] == FAST
    passed: set[int] = set()
    keys, _, _ = merge([0, 1, 2], [2, 0, 1], work, 1.0, None, None, 2_048, fit=True,
                       skipped=passed)
    assert passed == {0, 2} and keys[:2] == [1, 2]


def test_a_started_prefill_is_the_fair_front_before_an_older_waiting_request() -> None:
    """The Fair lane finishes what was started: a running prefill that arrived after the oldest
    waiting request is the Fair front, and it is not held."""
    old = QueuedRequest("O", 0.0, 8_000, 0)
    hits = [QueuedRequest(f"H{k}", 5.0 + k, 6_300, 6_000) for k in range(3)]
    running = [PrefillingRequest("R", 2.0, 5_000, 9_000)]
    ordering = _plan(get("fairway"), [old, *hits], StepBudget(2_048, 8), running)
    plan = ordering.plan
    assert plan is not None and plan.contested
    assert plan.front_id == "R"
    assert "R" not in plan.hold


def test_grants_foresee_the_kv_stop() -> None:
    """The first waiting request whose blocks do not fit gets nothing, nor any waiting request
    after it; a running prefill after it still gets its tokens."""
    work = {0: 1_000, 1: 100, -1: 3_000}
    done = {0: 0, 1: 0, -1: 160}
    # 1,000 tokens need 63 blocks of 16; 40 are free
    assert grants([0, 1, -1], work, 2_048, 4, done, free_blocks=40) == [0, 0, 2_048]
    # enough blocks: the step's tokens in merge order
    assert grants([0, 1, -1], work, 2_048, 4, done, free_blocks=1_000) == [1_000, 100, 948]
    # unknown blocks: no stop foreseen
    assert grants([0, 1, -1], work, 2_048, 4) == [1_000, 100, 948]


def test_the_step_goes_to_the_prefills_when_the_hits_blocks_are_not_free() -> None:
    """Eight hits placed first would take 1,800 tokens of the step (six fit; the Fair front R is
    held rather than capped below a hit's work); when the hits' KV blocks are not free, vLLM will
    not start them, and the plan gives R the whole step instead of leaving it unused."""
    old = QueuedRequest("O", 0.0, 9_000, 0)
    running = [PrefillingRequest("R", 5.0, 20_000, 24_000), PrefillingRequest("S", 6.0, 900, 1_000)]
    hits = [QueuedRequest(f"H{k}", 7.0 + k, 6_300, 6_000) for k in range(8)]
    roomy = _plan(get("fairway"), [old, *hits], StepBudget(2_048, 8, free_blocks=100_000), running)
    tight = _plan(get("fairway"), [old, *hits], StepBudget(2_048, 8, free_blocks=50), running)
    assert roomy.plan is not None and tight.plan is not None
    assert roomy.plan.front_id == tight.plan.front_id == "R"
    assert roomy.plan.hold == {"R", "S"}
    assert tight.plan.cap == 2_048
    assert tight.plan.hold == {"S"}  # started after R: it waits for R


def test_after_a_held_step_that_scheduled_nothing_the_next_plan_holds_none() -> None:
    """The safety net: a plan that held prefills, then a step with no prefill tokens at all (vLLM
    stopped at a waiting request the foresight missed): the next plan holds nothing."""
    old = QueuedRequest("O", 0.0, 9_000, 0)
    running = [PrefillingRequest("R", 5.0, 20_000, 24_000), PrefillingRequest("S", 6.0, 900, 1_000)]
    hits = [QueuedRequest(f"H{k}", 7.0 + k, 6_300, 6_000) for k in range(8)]
    policy = get("fairway")
    budget = StepBudget(2_048, 8)
    first = _plan(policy, [old, *hits], budget, running)
    assert first.plan is not None and first.plan.hold, "the case must hold a prefill"
    policy.on_step_end([], 0, prefill_by_request={})
    second = _plan(policy, [old, *hits], budget, running)
    assert second.plan is not None and not second.plan.hold
    policy.on_step_end([], 500, prefill_by_request={"R": 500})
    third = _plan(policy, [old, *hits], budget, running)
    assert third.plan is not None and third.plan.hold == first.plan.hold


def test_a_tier_load_takes_no_tokens_and_no_slot() -> None:
    """A waiting request admitted by a copy from the CPU offload tier computes nothing in the
    step that starts the copy: the tokens and the slot go on to the next placements, and the
    running prefill the budget ran out on is no longer cut for it."""
    work = {0: 1_500, 1: 400, -1: 3_000}
    done = {0: 4_000, 1: 0, -1: 160}
    assert grants([0, 1, -1], work, 2_048, 1) == [1_500, 0, 548]
    assert grants([0, 1, -1], work, 2_048, 1, loads={0}) == [0, 400, 1_648]
    # its blocks are still counted: 4,000 loaded tokens need 250 blocks of 16
    assert grants([0, 1, -1], work, 2_048, 2, done, free_blocks=200, loads={0}) == [0, 0, 2_048]
