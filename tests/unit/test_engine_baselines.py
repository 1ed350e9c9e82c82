"""Today's engine baselines (SGLang's merged HRRN and shortest-prefill-first, TensorRT-LLM's
shortest-uncached-first, Dynamo's WSPT): hand examples from each source, the documented
choices, and random-queue properties."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairway.errors import FairwayConfigError
from fairway.policies.base import Policy, QueuedRequest, get, names
from fairway.policies.hrrn import SORT_LIMIT, HRRNPolicy
from fairway.policies.queue import (
    PrefillingRequest,
    QueueColumns,
    Step,
    StepBudget,
    check_permutation,
)
from fairway.policies.spf import SPFPolicy, reserve_cap
from fairway.policies.suf import SUFPolicy
from fairway.policies.wspt import WSPTPolicy

ENGINE_BASELINES = ["hrrn", "spf", "suf", "wspt"]


def req(rid: str, arrival: float, prompt: int, cached: int = 0) -> QueuedRequest:
    return QueuedRequest(rid, float(arrival), prompt, cached)


def ids(queue: Sequence[QueuedRequest], order: Sequence[int]) -> list[str]:
    return [queue[i].request_id for i in order]


# --- registry, flags, parameters ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cls", "stateful", "plans", "every_step"),
    [
        ("hrrn", HRRNPolicy, True, False, True),
        ("spf", SPFPolicy, False, True, False),
        ("suf", SUFPolicy, True, False, True),
        ("wspt", WSPTPolicy, True, False, True),
    ],
)
def test_classes_and_flags(
    name: str, cls: type[Policy], stateful: bool, plans: bool, every_step: bool
) -> None:
    assert name in names()
    policy = get(name)
    assert type(policy) is cls and policy.name == name
    assert cls.needs_cache_hits
    assert (cls.stateful, cls.plans_steps, cls.orders_every_step) == (stateful, plans, every_step)


def test_defaults_as_the_engines_ship_them() -> None:
    assert get("hrrn").params() == {}  # SGLang's 128 is a constant, not an option
    assert get("spf").params() == {"page_tokens": 1}  # SGLang's --page-size default
    assert get("suf").params() == {"starvation_iterations": None}  # TensorRT-LLM: off
    assert get("wspt").params() == {}


@pytest.mark.parametrize(
    ("name", "params", "parameter"),
    [
        ("spf", {"page_tokens": 0}, "page_tokens"),
        ("spf", {"page_tokens": 16.0}, "page_tokens"),
        ("spf", {"page_tokens": True}, "page_tokens"),
        ("suf", {"starvation_iterations": 0}, "starvation_iterations"),
        ("suf", {"starvation_iterations": -2}, "starvation_iterations"),
        ("suf", {"starvation_iterations": 2.5}, "starvation_iterations"),
        ("suf", {"starvation_iterations": "3"}, "starvation_iterations"),
    ],
)
def test_bad_value_is_named(name: str, params: dict[str, object], parameter: str) -> None:
    with pytest.raises(FairwayConfigError, match=rf"policy '{name}': {parameter} must"):
        get(name, **params)


@pytest.mark.parametrize("name", ENGINE_BASELINES)
def test_unknown_parameter_is_named(name: str) -> None:
    with pytest.raises(FairwayConfigError, match="'bogus'"):
        get(name, bogus=1)


# --- HRRN (SGLang #32911) -----------------------------------------------------------------------


def test_hrrn_sglang_example() -> None:
    """SGLang's own test: waited 1000 tokens each, uncached 1, 3, 10 -> short, aged, long."""
    policy = HRRNPolicy()
    queue = [req("long", 0, 10), req("aged", 1, 3), req("short", 2, 1)]
    policy.order(queue, 0)  # all seen at T = 0
    policy.on_step_end([], prefill_tokens=1000)
    assert ids(queue, policy.order(queue, 1)) == ["short", "aged", "long"]


def test_hrrn_ties_go_by_request_id_not_arrival() -> None:
    policy = HRRNPolicy()
    queue = [req("b", 0, 100), req("a", 5, 100), req("c", 1, 100)]
    assert ids(queue, policy.order(queue, 0)) == ["a", "b", "c"]  # all ratios 0
    policy.on_step_end([], 50)
    new = [*queue, req("0new", 9, 100)]
    # the three aged equally (0.5); the newcomer has ratio 0 whatever its id
    assert ids(new, policy.order(new, 1)) == ["a", "b", "c", "0new"]


def test_hrrn_sorts_at_128_waiting_and_keeps_the_order_at_129() -> None:
    def queue(n: int) -> list[QueuedRequest]:
        # in queue order: the longest first, so a sort reverses it
        return [req(f"r{i:03d}", i, 10_000 - 10 * i) for i in range(n)]

    for n, sorted_expected in ((SORT_LIMIT, True), (SORT_LIMIT + 1, False)):
        policy = HRRNPolicy()
        policy.order(queue(n), 0)
        policy.on_step_end([], 1_000)
        order = policy.order(queue(n), 1)
        if sorted_expected:
            assert order == list(range(n))[::-1]  # shortest (highest ratio) first
            assert policy.num_unsorted_steps == 0
        else:
            assert order == list(range(n))  # the queue's own order, not a sort by arrival
            assert policy.num_unsorted_steps == 2
    assert SORT_LIMIT == 128


def test_hrrn_fallback_keeps_the_queue_order_not_arrival_and_keeps_aging() -> None:
    policy = HRRNPolicy()
    crowd = [req(f"x{i:03d}", 100 + i, 50) for i in range(SORT_LIMIT)]
    late = req("late", 500, 10)
    early = req("early", 0, 10)
    queue = [*crowd, late, early]  # 130 waiting, "early" last in the queue
    assert policy.order(queue, 0) == list(range(len(queue)))
    assert set(policy.remembered) == {r.request_id for r in queue}  # seen while unsorted
    policy.on_step_end([], 1_000)
    short = [late, early]  # back under the limit: both waited 1,000 tokens, same c
    assert ids(short, policy.order(short, 1)) == ["early", "late"]  # by id


# --- SPF (SGLang #40024): order ------------------------------------------------------------------


def test_spf_order_by_uncached_work_then_arrival() -> None:
    """SGLang's test, without the in-batch deferral: a mostly cached long prompt before a short
    cold one; equal work by arrival; a preempted request's output counts as work."""
    queue = [
        req("short", 2, 32),
        req("old", 1, 32),
        req("resumed", 0, 1 + 64),  # prompt 1 + 64 output tokens
        req("cached", 3, 4112, 4096),
    ]
    assert ids(queue, SPFPolicy().order(queue, 0)) == ["cached", "old", "short", "resumed"]
    assert req("empty", 0, 0).remaining == 1  # `_shortest_prefill_work` floor


def test_spf_columns_equal_views_and_no_plan_without_a_running_prefill() -> None:
    queue = [req("a", 1, 300), req("b", 0, 300), req("c", 2, 20), req("d", 3, 900, 890)]
    policy = SPFPolicy()
    budget = StepBudget(tokens=2048, free_slots=8)
    ordering = policy.ordering(QueueColumns.of(queue), Step(0.0, budget=budget))
    assert check_permutation(ordering.order, 4).tolist() == policy.order(queue, 0)
    assert ordering.plan is None


# --- SPF: the reserve ----------------------------------------------------------------------------


def test_reserve_sglang_examples() -> None:
    """The numbers of SGLang's own tests (`shortest_prefill_chunk_limit`)."""
    assert reserve_cap([512, 1024], [16384], 4096, 256) == 2560
    assert reserve_cap([257], [16384], 4096, 256) == 3584  # 257 charged as two pages
    for waiting, budget in (([], 4096), ([8192], 4096), ([4096], 4096)):
        assert reserve_cap(waiting, [8192], budget, 256) is None  # nothing shorter that fits
    assert reserve_cap([512], [16000], 64, 64) is None  # budget under two pages
    assert reserve_cap([512], [], 4096, 64) is None  # no running prefill


def test_reserve_stops_at_the_first_request_not_shorter_or_not_fitting() -> None:
    assert reserve_cap([100, 5000, 100], [4000], 2048, 1) == 1948  # 5000 >= 4000: stop
    assert reserve_cap([1000, 1100, 10], [4000], 2048, 1) == 1048  # 1,100 would not fit: stop


def test_reserve_is_cut_back_to_what_one_cap_can_serve() -> None:
    # SGLang gives the continuation 256 and the waiting 3,840 tokens; vLLM caps both at one
    # threshold, so the reserve is dropped (the continuation takes the step)
    assert reserve_cap([3840], [16384], 4096, 256) is None
    # 300 and 900 reserved (1,200 more would not fit): the cap left, 848, is below 900, so the
    # reserve is cut to 300: cap 1,748
    assert reserve_cap([300, 900, 1200], [10_000], 2048, 1) == 1748


def test_reserve_shares_the_continuation_budget_among_running_prefills() -> None:
    # two running prefills of 5,000 and 600; 200 reserved: 1,848 left, 600 + T <= 1,848
    assert reserve_cap([200], [5000, 600], 2048, 1) == 1248
    # both long: T = 1,848 / 2 = 924
    assert reserve_cap([200], [5000, 6000], 2048, 1) == 924
    # shorter than the shortest running prefill only
    assert reserve_cap([700], [5000, 600], 2048, 1) is None


def test_spf_plan_caps_the_running_prefill() -> None:
    queue = [req("long", 0, 8000), req("short", 1, 300)]
    step = Step(
        1.0,
        budget=StepBudget(tokens=2048, free_slots=4),
        prefilling=[PrefillingRequest("running", 0.0, 10_000, 10_000)],
    )
    ordering = SPFPolicy().ordering(QueueColumns.of(queue), step)
    assert check_permutation(ordering.order, 2).tolist() == [1, 0]
    assert ordering.plan is not None
    assert ordering.plan.cap == 2048 - 300 and ordering.plan.budget == 2048
    assert not ordering.plan.hold and not ordering.plan.running_order


def test_spf_budget_excludes_the_requests_served_first() -> None:
    step = Step(
        1.0,
        budget=StepBudget(tokens=2048, free_slots=4, ahead=(500,), ahead_ids=("p",)),
        prefilling=[PrefillingRequest("running", 0.0, 10_000)],
    )
    ordering = SPFPolicy().ordering(QueueColumns.of([req("s", 0, 100)]), step)
    assert ordering.plan is not None and ordering.plan.cap == 2048 - 500 - 100


@settings(deadline=None, max_examples=300)
@given(
    work=st.lists(st.integers(1, 6000), max_size=8).map(sorted),
    running=st.lists(st.integers(1, 20_000), min_size=1, max_size=3),
    tokens=st.integers(0, 8192),
    page=st.sampled_from([1, 16, 64, 256]),
)
def test_reserve_cap_serves_the_reserved_requests_whole(
    work: list[int], running: list[int], tokens: int, page: int
) -> None:
    """Under the cap the running prefills leave room for the first waiting request, whole,
    which is shorter than each of them; the cap is a whole number of pages."""
    cap = reserve_cap(work, running, tokens, page)
    if cap is None:
        return
    assert cap >= 1 and cap % page == 0
    first = work[0]  # a reserve is a prefix of the order, so it holds the first request
    assert first < min(running) and first <= cap
    assert sum(min(r, cap) for r in running) + first <= tokens


# --- SUF (TensorRT-LLM) --------------------------------------------------------------------------


def test_suf_order_by_uncached_prompt_tokens() -> None:
    queue = [req("a", 0, 1000), req("b", 1, 200), req("c", 2, 10_000, 9_950), req("d", 0.5, 200)]
    assert ids(queue, SUFPolicy().order(queue, 0)) == ["c", "d", "b", "a"]


def test_suf_starved_after_exactly_n_iterations() -> None:
    n = 3
    policy = SUFPolicy(starvation_iterations=n)
    long = req("long", 0, 8000)
    for k in range(10):
        shorts = [req(f"s{k}-{j}", 1 + k, 100) for j in range(2)]  # a new pair every step
        queue = [long, *shorts]
        order = ids(queue, policy.order(queue, k))
        if k < n:
            assert order[-1] == "long", k  # passed over k times so far
            policy.on_step_end([order[0]], 100)  # one short one starts
        else:
            assert order[0] == "long", k
            break
    assert k == n  # first at the (n + 1)-th order: after exactly n iterations passed over


def test_suf_starved_requests_go_by_arrival_and_the_guard_is_off_by_default() -> None:
    queue = [req("x", 5, 9000), req("y", 2, 7000), req("z", 3, 10)]
    guarded, plain = SUFPolicy(starvation_iterations=1), SUFPolicy()
    for policy in (guarded, plain):
        policy.order(queue, 0)
        policy.on_step_end([], 0)  # nobody started: all passed over once
    assert ids(queue, guarded.order(queue, 1)) == ["y", "z", "x"]  # all starved: by arrival
    for _ in range(100):
        plain.on_step_end([], 0)
    assert ids(queue, plain.order(queue, 2)) == ["z", "y", "x"]


def test_suf_forgets_ids_that_left_and_restarts_a_returning_request() -> None:
    policy = SUFPolicy(starvation_iterations=2)
    queue = [req("a", 0, 5000), req("b", 1, 10)]
    policy.order(queue, 0)
    policy.on_step_end(["b"], 10)
    policy.on_step_end([], 0)
    assert dict(policy.remembered) == {"a": 2, "b": 1}  # b left: forgotten at the next call
    assert ids(queue[:1], policy.order(queue[:1], 1)) == ["a"]
    assert dict(policy.remembered) == {"a": 2}
    assert ids(queue, policy.order(queue, 2)) == ["a", "b"]  # a starved; b back from zero
    assert policy.remembered["b"] == 0


# --- WSPT (Dynamo) -------------------------------------------------------------------------------


def test_wspt_order_by_cost_then_arrival() -> None:
    queue = [req("a", 2, 500), req("b", 1, 500), req("c", 0, 4000, 3900), req("d", 3, 50)]
    assert ids(queue, WSPTPolicy().order(queue, 0)) == ["d", "c", "b", "a"]


def test_wspt_cost_is_fixed_when_first_seen() -> None:
    policy = WSPTPolicy()
    queue = [req("hit", 0, 1000, 900), req("cold", 1, 300)]
    assert ids(queue, policy.order(queue, 0)) == ["hit", "cold"]  # 100 vs 300
    evicted = [req("hit", 0, 1000, 0), req("cold", 1, 300, 200)]  # the hits changed since
    assert ids(evicted, policy.order(evicted, 1)) == ["hit", "cold"]  # the keys did not
    assert dict(policy.remembered) == {"hit": 100, "cold": 300}


def test_wspt_does_not_freeze_a_hit_not_looked_up_yet() -> None:
    policy = WSPTPolicy()
    first = QueueColumns.of([req("a", 0, 1000), req("b", 1, 600)])
    first.unprobed = np.array([True, False])
    assert check_permutation(policy.ordering(first, Step(0.0)).order, 2).tolist() == [1, 0]
    assert dict(policy.remembered) == {"b": 600}
    probed = QueueColumns.of([req("a", 0, 1000, 800), req("b", 1, 600)])
    assert check_permutation(policy.ordering(probed, Step(1.0)).order, 2).tolist() == [0, 1]
    assert dict(policy.remembered) == {"a": 200, "b": 600}


# --- properties over random queues --------------------------------------------------------------

REQUESTS = st.integers(0, 20_000).flatmap(
    lambda prompt: st.builds(
        QueuedRequest,
        request_id=st.just("r"),
        arrival=st.one_of(st.integers(0, 20).map(float), st.floats(0, 1e4)),
        prompt_tokens=st.just(prompt),
        cached_tokens=st.one_of(st.just(0), st.integers(0, prompt)),
    )
)


@st.composite
def step_sequences(draw: st.DrawFn) -> list[tuple[list[QueuedRequest], int, int, list[int]]]:
    """Steps of (new arrivals, admissions from the head, prefill tokens, hit changes)."""
    steps = []
    for s in range(draw(st.integers(1, 8))):
        size = draw(st.sampled_from([0, 3, 12, 140]))  # 140: HRRN's fallback
        new = draw(st.lists(REQUESTS, max_size=size))
        new = [dataclasses.replace(r, request_id=f"s{s}-{i}") for i, r in enumerate(new)]
        steps.append(
            (new, draw(st.integers(0, 4)), draw(st.integers(0, 4096)),
             draw(st.lists(st.integers(0, 20_000), max_size=4)))
        )
    return steps


def run_steps(
    policy: Policy,
    steps: list[tuple[list[QueuedRequest], int, int, list[int]]],
    check: Callable[[list[QueuedRequest], list[int]], None],
) -> None:
    """Drive `policy` like a scheduler; the next step's queue comes in the order applied."""
    queue: list[QueuedRequest] = []
    for new, num_admitted, prefill_tokens, hit_changes in steps:
        queue.extend(new)
        for j, value in enumerate(hit_changes):
            if queue:
                idx = (j * 7919) % len(queue)
                r = queue[idx]
                queue[idx] = dataclasses.replace(r, cached_tokens=value % (r.prompt_tokens + 1))
        cols = QueueColumns.of(queue)
        order = check_permutation(policy.ordering(cols, Step(float(len(queue)))).order, len(queue))
        check(queue, order.tolist())
        policy.on_step_end([queue[i].request_id for i in order[:num_admitted]], prefill_tokens)
        queue = [queue[i] for i in order[num_admitted:]]


@pytest.mark.parametrize("name", ENGINE_BASELINES)
@settings(deadline=None, max_examples=30)
@given(steps=step_sequences())
def test_every_request_is_kept_exactly_once(name: str, steps: list) -> None:
    def check(queue: list[QueuedRequest], order: list[int]) -> None:
        assert sorted(order) == list(range(len(queue)))
        assert len({queue[i].request_id for i in order}) == len(queue)

    run_steps(get(name), steps, check)


@pytest.mark.parametrize("name", ["hrrn", "suf", "wspt"])
@settings(deadline=None, max_examples=30)
@given(steps=step_sequences())
def test_memory_is_bounded_by_the_queue(name: str, steps: list) -> None:
    policy = get(name)
    last: list[set[str]] = [set()]

    def check(queue: list[QueuedRequest], order: list[int]) -> None:
        last[0] = {r.request_id for r in queue}
        assert set(policy.remembered) <= last[0]

    run_steps(policy, steps, check)


@settings(deadline=None, max_examples=60)
@given(steps=step_sequences(), n=st.integers(1, 4))
def test_suf_order_is_starved_by_arrival_then_by_work(steps: list, n: int) -> None:
    policy = SUFPolicy(starvation_iterations=n)

    def check(queue: list[QueuedRequest], order: list[int]) -> None:
        waited = policy.remembered
        starved = [i for i in order if waited[queue[i].request_id] >= n]
        assert order[: len(starved)] == starved
        assert [queue[i].arrival for i in starved] == sorted(queue[i].arrival for i in starved)
        rest = [(queue[i].remaining, queue[i].arrival) for i in order[len(starved):]]
        assert rest == sorted(rest)

    run_steps(policy, steps, check)


@settings(deadline=None, max_examples=60)
@given(steps=step_sequences())
def test_spf_is_non_decreasing_in_work(steps: list) -> None:
    def check(queue: list[QueuedRequest], order: list[int]) -> None:
        keys = [(queue[i].remaining, queue[i].arrival) for i in order]
        assert keys == sorted(keys)

    run_steps(SPFPolicy(), steps, check)
