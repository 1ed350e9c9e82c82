"""Baseline orderings: hand examples, the documented choices, and random-queue properties."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairway.errors import FairwayConfigError
from fairway.policies.base import Policy, QueuedRequest, get, names
from fairway.policies.fcfs import FCFSPolicy
from fairway.policies.hrrn import HRRNPolicy
from fairway.policies.lpm import KLPMPolicy, LPMPolicy
from fairway.policies.peek import PEEKPolicy
from fairway.policies.preble import PreblePolicy
from fairway.policies.ragcache import RAGCachePolicy
from fairway.policies.vllm_window import VLLMWindowPolicy
from fairway.profiling.table import from_points

BASELINES = [
    "fcfs", "hrrn", "klpm", "klpm-4", "klpm-8", "lpm", "peek", "preble", "ragcache", "spf", "suf",
    "vllm-window", "wspt",
]


def req(rid: str, arrival: float, prompt: int, cached: int = 0) -> QueuedRequest:
    return QueuedRequest(rid, float(arrival), prompt, cached)


def ids(queue: Sequence[QueuedRequest], order: Sequence[int]) -> list[str]:
    return [queue[i].request_id for i in order]


# --- registry, flags, parameters ----------------------------------------------------------------


def test_every_baseline_is_registered() -> None:
    assert set(BASELINES) <= set(names())


@pytest.mark.parametrize(
    ("name", "cls", "needs_hits", "stateful"),
    [
        ("fcfs", FCFSPolicy, False, False),
        ("lpm", LPMPolicy, True, True),
        ("klpm", KLPMPolicy, True, True),
        ("ragcache", RAGCachePolicy, True, False),
        ("preble", PreblePolicy, True, True),
        ("peek", PEEKPolicy, True, False),
        ("hrrn", HRRNPolicy, True, True),
        ("vllm-window", VLLMWindowPolicy, True, False),
    ],
)
def test_classes_and_flags(name: str, cls: type[Policy], needs_hits: bool, stateful: bool) -> None:
    policy = get(name)
    assert type(policy) is cls
    assert policy.name == name
    assert cls.needs_cache_hits is needs_hits
    assert cls.stateful is stateful


def test_klpm_presets() -> None:
    assert get("klpm").k == 2
    assert get("klpm-4").k == 4
    assert get("klpm-8").k == 8
    assert get("klpm-4").name == "klpm-4"
    assert get("klpm-4").params() == {"k": 4}
    assert get("klpm-4", k=3).k == 3
    assert KLPMPolicy(k=4).name == "klpm"


def test_params() -> None:
    assert get("fcfs").params() == {}
    assert get("lpm").params() == {"max_queue_for_sort": None}
    assert get("ragcache").params() == {"window_s": None}
    assert get("preble").params() == {"k": 10}
    assert get("hrrn").params() == {}
    assert get("vllm-window").params() == {"window": 64, "threshold": 0.5}
    assert get("peek").params()["profile"]["metadata"]["source"] == "estimate"


@pytest.mark.parametrize("name", BASELINES)
def test_unknown_parameter_is_named(name: str) -> None:
    with pytest.raises(FairwayConfigError, match="'bogus'"):
        get(name, bogus=1)


@pytest.mark.parametrize(
    ("name", "params", "parameter"),
    [
        ("klpm", {"k": 0}, "k"),
        ("klpm", {"k": -3}, "k"),
        ("klpm", {"k": 1.5}, "k"),
        ("klpm", {"k": True}, "k"),
        ("klpm-4", {"k": "4"}, "k"),
        ("preble", {"k": 0}, "k"),
        ("preble", {"k": 2.0}, "k"),
        ("lpm", {"max_queue_for_sort": 0}, "max_queue_for_sort"),
        ("lpm", {"max_queue_for_sort": 12.5}, "max_queue_for_sort"),
        ("ragcache", {"window_s": 0}, "window_s"),
        ("ragcache", {"window_s": -1.0}, "window_s"),
        ("ragcache", {"window_s": math.nan}, "window_s"),
        ("ragcache", {"window_s": math.inf}, "window_s"),
        ("ragcache", {"window_s": "10"}, "window_s"),
        ("peek", {"profile": "no-such-profile-table"}, "profile"),
        ("peek", {"profile": 3}, "profile"),
    ],
)
def test_bad_value_is_named(name: str, params: dict[str, object], parameter: str) -> None:
    with pytest.raises(FairwayConfigError, match=rf"\b{parameter}( must|=)") as info:
        get(name, **params)
    assert name in str(info.value)


def test_direct_construction_raises_value_error() -> None:
    with pytest.raises(ValueError, match="k must be an integer >= 1, got 0"):
        KLPMPolicy(k=0)
    with pytest.raises(ValueError, match="window_s"):
        RAGCachePolicy(window_s=-2)


# --- FCFS ---------------------------------------------------------------------------------------


def test_fcfs_hand_example() -> None:
    queue = [req("a", 2, 10), req("b", 0, 10, 10), req("c", 1, 10), req("d", 0, 10)]
    assert FCFSPolicy().order(queue, now=5) == [1, 3, 2, 0]


# --- LPM ----------------------------------------------------------------------------------------


def test_lpm_hand_example() -> None:
    queue = [
        req("a", 0, 1000),
        req("b", 1, 1000, 100),
        req("c", 2, 1000, 50),
        req("d", 3, 900, 100),
    ]
    assert LPMPolicy().order(queue, now=5) == [1, 3, 2, 0]


def test_lpm_ties_keep_the_previous_order_not_arrival() -> None:
    """SGLang's persistent list: equal hits keep the last order; new ones go after, by arrival."""
    policy = LPMPolicy()
    step1 = [req("a", 0, 1000), req("b", 1, 1000, 64)]
    assert ids(step1, policy.order(step1, now=2)) == ["b", "a"]
    # b's hit was evicted: a tie at 0. Arrival order would put a first; SGLang keeps b first.
    step2 = [req("a", 0, 1000), req("b", 1, 1000), req("d", 5, 10), req("c", 3, 10)]
    assert ids(step2, policy.order(step2, now=6)) == ["b", "a", "c", "d"]
    # a larger hit still moves a request forward
    step3 = [req("a", 0, 1000), req("b", 1, 1000), req("d", 5, 10, 8), req("c", 3, 10)]
    assert ids(step3, policy.order(step3, now=7)) == ["d", "b", "a", "c"]


def test_lpm_new_arrivals_with_equal_arrival_keep_queue_position() -> None:
    queue = [req("x", 1, 10), req("y", 1, 10), req("z", 0, 10)]
    assert ids(queue, LPMPolicy().order(queue, now=1)) == ["z", "x", "y"]


def test_lpm_forgets_ids_that_left() -> None:
    policy = LPMPolicy()
    step1 = [req("a", 0, 1000), req("b", 1, 1000, 64)]
    policy.order(step1, now=2)
    step2 = [req("a", 0, 1000)]  # b admitted
    assert policy.order(step2, now=3) == [0]
    assert set(policy.remembered) == {"a"}
    # b preempted and back: a new sighting, appended after a although it is no younger
    step3 = [req("b", 1, 1000), req("a", 0, 1000)]
    assert ids(step3, policy.order(step3, now=4)) == ["a", "b"]


def test_lpm_queue_cap_keeps_previous_order() -> None:
    policy = LPMPolicy(max_queue_for_sort=2)
    step1 = [req("a", 0, 100), req("b", 1, 100, 50)]
    assert ids(step1, policy.order(step1, now=1)) == ["b", "a"]
    # 3 > 2 waiting: no sort at all (SGLang), even though c has the longest hit; c is appended
    step2 = [req("a", 0, 100, 90), req("b", 1, 100), req("c", 2, 100, 99)]
    assert ids(step2, policy.order(step2, now=2)) == ["b", "a", "c"]
    assert policy.num_unsorted_steps == 1
    step3 = [req("a", 0, 100, 90), req("c", 2, 100, 99)]
    assert ids(step3, policy.order(step3, now=3)) == ["c", "a"]
    assert policy.num_unsorted_steps == 1


def test_lpm_uncapped_by_default() -> None:
    queue = [req(f"r{i}", i, 1000, i) for i in range(300)]
    assert LPMPolicy().order(queue, now=300) == list(range(299, -1, -1))


# --- k-LPM --------------------------------------------------------------------------------------

KLPM_QUEUE = [
    req("A", 0, 1000),
    req("B", 1, 1000, 100),
    req("C", 2, 1000, 50),
    req("D", 3, 1000),
    req("E", 4, 1000, 100),
]


def test_klpm_hand_examples() -> None:
    assert ids(KLPM_QUEUE, KLPMPolicy(k=2).order(KLPM_QUEUE, 5)) == ["A", "B", "C", "E", "D"]
    assert ids(KLPM_QUEUE, KLPMPolicy(k=3).order(KLPM_QUEUE, 5)) == ["A", "B", "E", "C", "D"]
    assert ids(KLPM_QUEUE, KLPMPolicy(k=1).order(KLPM_QUEUE, 5)) == ["A", "B", "C", "D", "E"]
    assert ids(KLPM_QUEUE, KLPMPolicy(k=100).order(KLPM_QUEUE, 5)) == ["A", "B", "E", "C", "D"]


def test_klpm_counter_offsets_the_cycle() -> None:
    policy = KLPMPolicy(k=2)
    policy.on_step_end(["x"], prefill_tokens=2048)
    assert policy.admitted == 1
    assert ids(KLPM_QUEUE, policy.order(KLPM_QUEUE, 5)) == ["B", "A", "E", "C", "D"]
    policy.on_step_end([], prefill_tokens=2048)  # nothing admitted: no advance
    assert policy.admitted == 1
    policy.on_step_end(["y", "z"], prefill_tokens=0)
    assert policy.admitted == 3
    assert ids(KLPM_QUEUE, policy.order(KLPM_QUEUE, 5)) == ["B", "A", "E", "C", "D"]


def test_klpm_order_alone_does_not_advance() -> None:
    policy = KLPMPolicy(k=2)
    for _ in range(3):
        assert ids(KLPM_QUEUE, policy.order(KLPM_QUEUE, 5)) == ["A", "B", "C", "E", "D"]


def _admit_one_per_step(make: Callable[[], Policy], fresh_each_step: bool) -> list[str]:
    queue = [
        req("O1", 0, 4000),
        req("O2", 1, 4000),
        req("O3", 2, 4000),
        req("H1", 3, 4000, 3000),
        req("H2", 4, 4000, 2000),
        req("H3", 5, 4000, 1000),
    ]
    policy = make()
    admitted: list[str] = []
    while queue:
        if fresh_each_step:
            policy = make()
        first = queue[policy.order(queue, now=10)[0]]
        admitted.append(first.request_id)
        policy.on_step_end([first.request_id], prefill_tokens=2048)
        queue.remove(first)
    return admitted


def test_klpm_counter_persists_across_steps() -> None:
    """One admission per step with k = 2 alternates oldest / longest hit."""
    alternating = _admit_one_per_step(lambda: KLPMPolicy(k=2), fresh_each_step=False)
    assert alternating == ["O1", "H1", "O2", "H2", "O3", "H3"]
    # a per-step counter would degenerate into FCFS: this is what persistence prevents
    per_step = _admit_one_per_step(lambda: KLPMPolicy(k=2), fresh_each_step=True)
    assert per_step == ["O1", "O2", "O3", "H1", "H2", "H3"]
    k3 = _admit_one_per_step(lambda: KLPMPolicy(k=3), fresh_each_step=False)
    assert k3 == ["O1", "H1", "H2", "O2", "H3", "O3"]


def test_klpm_hit_is_absolute_tokens() -> None:
    # b has the larger hit in tokens, a the larger cached fraction
    queue = [req("o", 0, 10), req("a", 1, 100, 99), req("b", 2, 10000, 1000)]
    assert ids(queue, KLPMPolicy(k=2).order(queue, 3)) == ["o", "b", "a"]


# --- RAGCache -----------------------------------------------------------------------------------


def test_ragcache_hand_example() -> None:
    queue = [
        req("a", 0, 1000, 500),  # 500 / 500 = 1
        req("b", 1, 100, 90),  # 90 / 10 = 9
        req("c", 2, 10000, 5000),  # 1, later than a
        req("d", 3, 100),  # 0
        req("e", 4, 100, 100),  # 100 / max(0, 1) = 100
    ]
    assert ids(queue, RAGCachePolicy().order(queue, now=5)) == ["e", "b", "a", "c", "d"]


def test_ragcache_window_is_strictly_longer_wait_in_seconds() -> None:
    queue = [
        req("c", 95, 1000, 900),
        req("b", 89, 1000),  # waited 11 s
        req("d", 90, 1000),  # waited exactly 10 s: not urgent
        req("a", 85, 1000),  # waited 15 s
    ]
    assert ids(queue, RAGCachePolicy(window_s=10).order(queue, 100)) == ["a", "b", "c", "d"]
    assert ids(queue, RAGCachePolicy().order(queue, 100)) == ["c", "a", "b", "d"]
    # five seconds earlier on the clock: nobody has waited more than 10 s yet
    assert ids(queue, RAGCachePolicy(window_s=10).order(queue, 95)) == ["c", "a", "b", "d"]


# --- Preble -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cached", "prompt", "group"),
    [
        (0, 100, 0),
        (1, 100, 0),
        (10, 100, 0),
        (11, 100, 1),
        (30, 100, 2),  # a band edge: (0.2, 0.3] -> 2
        (3, 10, 2),
        (7, 10, 6),
        (90, 100, 8),
        (91, 100, 9),
        (100, 100, 9),
        (0, 0, 0),
    ],
)
def test_preble_groups(cached: int, prompt: int, group: int) -> None:
    assert PreblePolicy.group_of(req("r", 0, prompt, cached)) == group


def test_preble_rotation() -> None:
    queue = [req("c0", 2, 100), req("a9", 0, 100, 95), req("b5", 1, 100, 55)]
    policy = PreblePolicy()
    assert policy.pointer == 9
    assert ids(queue, policy.order(queue, 3)) == ["a9", "b5", "c0"]
    assert policy.pointer == 8
    assert ids(queue, policy.order(queue, 3)) == ["b5", "c0", "a9"]
    assert policy.pointer == 4
    assert ids(queue, policy.order(queue, 3)) == ["c0", "a9", "b5"]
    assert policy.pointer == 9
    assert ids(queue, policy.order(queue, 3)) == ["a9", "b5", "c0"]
    assert policy.order([], 3) == []
    assert policy.pointer == 8  # an empty queue does not move the pointer


def test_preble_quota_then_rotation_then_overflow() -> None:
    queue = [
        req("g0-1", 0, 100),
        req("g0-2", 1, 100),
        req("g0-3", 2, 100, 5),
        req("g9", 3, 100, 95),
        req("g3", 4, 100, 35),
    ]
    policy = PreblePolicy(k=1)
    assert ids(queue, policy.order(queue, 5)) == ["g9", "g3", "g0-1", "g0-2", "g0-3"]
    assert ids(queue, policy.order(queue, 5)) == ["g3", "g0-1", "g0-2", "g0-3", "g9"]
    # group 0 with k = 1: quota 1, then groups 9..1, then group 0's overflow
    assert ids(queue, policy.order(queue, 5)) == ["g0-1", "g9", "g3", "g0-2", "g0-3"]
    policy = PreblePolicy(k=2)
    policy.pointer = 0
    assert ids(queue, policy.order(queue, 5)) == ["g0-1", "g0-2", "g9", "g3", "g0-3"]
    policy = PreblePolicy(k=3)
    policy.pointer = 0
    assert ids(queue, policy.order(queue, 5)) == ["g0-1", "g0-2", "g0-3", "g9", "g3"]


def test_preble_buckets_once_and_forgets() -> None:
    policy = PreblePolicy()
    step1 = [req("x", 0, 100), req("y", 1, 100, 95)]
    assert ids(step1, policy.order(step1, 1)) == ["y", "x"]  # pointer -> 8
    # x's hit is now full, but x stays in group 0; w is new in group 0 too
    step2 = [req("w", 2, 100, 5), req("x", 0, 100, 100)]
    assert ids(step2, policy.order(step2, 2)) == ["x", "w"]
    assert dict(policy.remembered) == {"w": 0, "x": 0}  # y left: forgotten
    # x admitted, then back (preempted): bucketed again with its hit now
    step3 = [req("w", 2, 100, 5)]
    policy.order(step3, 3)
    step4 = [req("w", 2, 100, 5), req("x", 0, 100, 100)]
    policy.order(step4, 4)
    assert dict(policy.remembered) == {"w": 0, "x": 9}


# --- PEEK-proxy ---------------------------------------------------------------------------------

CONVEX = from_points([(1000, 1.0), (2000, 2.0), (4000, 6.0), (8000, 20.0)], source="test")


def test_peek_ranks_by_saved_time_not_tokens() -> None:
    queue = [
        req("c", 0, 2000, 1500),  # T(2000) - T(500) = 2 - 1 = 1
        req("b", 1, 4000, 3000),  # 6 - T(1000) = 5
        req("d", 2, 8000, 2000),  # 20 - T(6000) = 20 - 13 = 7
        req("a", 3, 8000, 4000),  # 20 - 6 = 14
        req("z", 4, 8000),  # 0
    ]
    assert ids(queue, PEEKPolicy(profile=CONVEX).order(queue, 5)) == ["a", "d", "b", "c", "z"]
    assert ids(queue, LPMPolicy().order(queue, 5)) == ["a", "b", "d", "c", "z"]


def test_peek_ties_by_arrival_and_profile_sources() -> None:
    queue = [req("late", 5, 3000, 1000), req("early", 1, 3000, 1000), req("cold", 0, 3000)]
    assert ids(queue, PEEKPolicy(profile=CONVEX).order(queue, 6)) == ["early", "late", "cold"]
    by_name = get("peek", profile="a6000-llama3.1-8b-estimate")
    assert by_name.profile.points == get("peek").profile.points
    assert ids(queue, by_name.order(queue, 6)) == ["early", "late", "cold"]


def test_peek_profile_from_path(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    CONVEX.save(path)
    assert get("peek", profile=str(path)).profile.points == CONVEX.points


# --- HRRN ---------------------------------------------------------------------------------------


def test_hrrn_ages_by_prefill_tokens() -> None:
    policy = HRRNPolicy()
    a = req("a", 0, 100)  # remaining 100
    policy.order([a], now=0)  # a seen at T = 0
    policy.on_step_end([], prefill_tokens=1000)
    b = req("b", 1, 10)  # remaining 10, seen at T = 1000
    queue = [b, a]
    assert ids(queue, policy.order(queue, now=1)) == ["a", "b"]  # 10 vs 0
    policy.on_step_end([], prefill_tokens=50)
    assert ids(queue, policy.order(queue, now=2)) == ["a", "b"]  # 10.5 vs 5
    policy.on_step_end([], prefill_tokens=100)
    assert ids(queue, policy.order(queue, now=3)) == ["b", "a"]  # 11.5 vs 15
    assert policy.prefill_tokens_total == 1150


def test_hrrn_ignores_wall_clock_and_order_calls() -> None:
    policy = HRRNPolicy()
    queue = [req("long", 0, 10000), req("short", 1, 10)]
    for now in (1, 100, 1e6):
        assert ids(queue, policy.order(queue, now)) == ["long", "short"]  # all priorities 0
    policy.on_step_end(["other"], prefill_tokens=20)
    assert ids(queue, policy.order(queue, 0)) == ["short", "long"]  # 2 vs 0.002


def test_hrrn_uses_uncached_work_and_forgets() -> None:
    policy = HRRNPolicy()
    queue = [req("cold", 0, 1000), req("warm", 1, 1000, 990)]
    policy.order(queue, 0)
    policy.on_step_end([], 100)
    assert ids(queue, policy.order(queue, 1)) == ["warm", "cold"]  # 100 / 10 vs 100 / 1000
    policy.order(queue[:1], 2)  # warm admitted: forgotten
    assert set(policy.remembered) == {"cold"}
    policy.order(queue, 3)  # warm back (preempted): ages from zero again
    assert ids(queue, policy.order(queue, 3)) == ["cold", "warm"]


def test_hrrn_rejects_negative_tokens() -> None:
    with pytest.raises(ValueError, match="prefill_tokens"):
        HRRNPolicy().on_step_end([], -1)


# --- properties over random queues --------------------------------------------------------------

ARRIVALS = st.one_of(
    st.integers(0, 20).map(float),  # many ties
    st.floats(0, 1e4, allow_nan=False, allow_infinity=False),
)


REQUESTS = st.integers(0, 20000).flatmap(
    lambda prompt: st.builds(
        QueuedRequest,
        request_id=st.just("r"),
        arrival=ARRIVALS,
        prompt_tokens=st.just(prompt),
        cached_tokens=st.one_of(st.just(0), st.just(prompt), st.integers(0, prompt)),
    )
)


def queues(max_size: int = 40, prefix: str = "r") -> st.SearchStrategy[list[QueuedRequest]]:
    """Random waiting queues with unique ids `{prefix}{position}`."""
    return st.lists(REQUESTS, max_size=max_size).map(
        lambda rs: [dataclasses.replace(r, request_id=f"{prefix}{i}") for i, r in enumerate(rs)]
    )


@st.composite
def step_sequences(draw: st.DrawFn) -> list[tuple[list[QueuedRequest], int, int, list[int]]]:
    """Steps of (new arrivals, admissions from the head, prefill tokens, hit changes)."""
    steps = []
    for s in range(draw(st.integers(1, 6))):
        new = draw(queues(max_size=12, prefix=f"s{s}-"))
        steps.append(
            (
                new,
                draw(st.integers(0, 4)),
                draw(st.integers(0, 4096)),
                draw(st.lists(st.integers(0, 20000), max_size=4)),
            )
        )
    return steps


def run_steps(
    policy: Policy,
    steps: list[tuple[list[QueuedRequest], int, int, list[int]]],
    check: Callable[[list[QueuedRequest], list[int]], None],
) -> None:
    """Drive `policy` like a scheduler: new arrivals, hit changes, admissions from the head."""
    queue: list[QueuedRequest] = []
    for new, num_admitted, prefill_tokens, hit_changes in steps:
        queue.extend(new)
        for j, value in enumerate(hit_changes):  # eviction or a sibling warming the cache
            if queue:
                idx = (j * 7919) % len(queue)
                r = queue[idx]
                queue[idx] = dataclasses.replace(r, cached_tokens=value % (r.prompt_tokens + 1))
        now = max((r.arrival for r in queue), default=0.0) + 1.0
        order = policy.order(queue, now)
        check(queue, order)
        policy.on_step_end([queue[i].request_id for i in order[:num_admitted]], prefill_tokens)
        # the scheduler applies the order, so the next step's queue comes in it
        queue = [queue[i] for i in order[num_admitted:]]


def fcfs_reference(queue: Sequence[QueuedRequest]) -> list[int]:
    return sorted(range(len(queue)), key=lambda i: (queue[i].arrival, i))


def klpm_reference(queue: Sequence[QueuedRequest], k: int, admitted: int) -> list[int]:
    """Algorithm 1 literally: O(n^2) picks."""
    remaining = list(range(len(queue)))
    result = []
    for j in range(admitted, admitted + len(queue)):
        if j % k == 0:
            pick = min(remaining, key=lambda i: (queue[i].arrival, i))
        else:
            pick = min(remaining, key=lambda i: (-queue[i].cached_tokens, queue[i].arrival, i))
        remaining.remove(pick)
        result.append(pick)
    return result


@pytest.mark.parametrize("name", BASELINES)
@settings(deadline=None, max_examples=40)
@given(steps=step_sequences())
def test_every_baseline_returns_a_permutation(name: str, steps: list) -> None:
    def check(queue: list[QueuedRequest], order: list[int]) -> None:
        assert sorted(order) == list(range(len(queue)))

    run_steps(get(name), steps, check)


@pytest.mark.parametrize("name", BASELINES)
@given(one=REQUESTS, now=st.floats(0, 1e5))
def test_trivial_queues(name: str, one: QueuedRequest, now: float) -> None:
    policy = get(name)
    assert policy.order([], now) == []
    assert policy.order([one], now) == [0]
    policy.on_step_end([], 0)
    assert policy.order([], now) == []


@settings(deadline=None)
@given(queue=queues())
def test_fcfs_is_arrival_order(queue: list[QueuedRequest]) -> None:
    assert FCFSPolicy().order(queue, 0) == fcfs_reference(queue)


@settings(deadline=None, max_examples=50)
@given(steps=step_sequences())
def test_lpm_is_non_increasing_in_hits(steps: list) -> None:
    def check(queue: list[QueuedRequest], order: list[int]) -> None:
        hits = [queue[i].cached_tokens for i in order]
        assert hits == sorted(hits, reverse=True)

    run_steps(LPMPolicy(), steps, check)


@settings(deadline=None, max_examples=50)
@given(steps=step_sequences())
def test_klpm_k1_is_fcfs_across_steps(steps: list) -> None:
    def check(queue: list[QueuedRequest], order: list[int]) -> None:
        assert order == fcfs_reference(queue)

    run_steps(KLPMPolicy(k=1), steps, check)


@settings(deadline=None, max_examples=50)
@given(steps=step_sequences(), k=st.integers(1, 5))
def test_klpm_matches_algorithm_1(steps: list, k: int) -> None:
    policy = KLPMPolicy(k=k)

    def check(queue: list[QueuedRequest], order: list[int]) -> None:
        assert order == klpm_reference(queue, k, policy.admitted)

    run_steps(policy, steps, check)


@settings(deadline=None)
@given(queue=queues(), window_s=st.one_of(st.none(), st.floats(0.5, 100)), now=st.floats(0, 2e4))
def test_ragcache_order(queue: list[QueuedRequest], window_s: float | None, now: float) -> None:
    order = RAGCachePolicy(window_s=window_s).order(queue, now)
    urgent = [i for i in order if window_s is not None and now - queue[i].arrival > window_s]
    assert order[: len(urgent)] == urgent
    assert [queue[i].arrival for i in urgent] == sorted(queue[i].arrival for i in urgent)
    rest = [(queue[i].cached_tokens / queue[i].remaining, -queue[i].arrival) for i in order]
    rest = rest[len(urgent) :]
    assert rest == sorted(rest, reverse=True)


@settings(deadline=None)
@given(queue=queues())
def test_peek_is_non_increasing_in_saved_time(queue: list[QueuedRequest]) -> None:
    saved = [
        CONVEX.prefill_s(queue[i].prompt_tokens) - CONVEX.prefill_s(queue[i].remaining)
        for i in PEEKPolicy(profile=CONVEX).order(queue, 0)
    ]
    assert saved == sorted(saved, reverse=True)


@settings(deadline=None, max_examples=50)
@given(steps=step_sequences())
def test_hrrn_is_non_increasing_in_response_ratio(steps: list) -> None:
    policy = HRRNPolicy()
    seen: dict[str, int] = {}

    def check(queue: list[QueuedRequest], order: list[int]) -> None:
        total = policy.prefill_tokens_total
        for r in queue:
            seen.setdefault(r.request_id, total)
        for gone in set(seen) - {r.request_id for r in queue}:
            del seen[gone]
        ratios = [(total - seen[queue[i].request_id]) / queue[i].remaining for i in order]
        assert ratios == sorted(ratios, reverse=True)

    run_steps(policy, steps, check)


@settings(deadline=None, max_examples=50)
@given(steps=step_sequences(), k=st.integers(1, 3))
def test_preble_serves_one_group_per_step(steps: list, k: int) -> None:
    policy = PreblePolicy(k=k)
    groups: dict[str, int] = {}
    pointer = [9]

    def check(queue: list[QueuedRequest], order: list[int]) -> None:
        for r in queue:
            groups.setdefault(r.request_id, PreblePolicy.group_of(r))
        for gone in set(groups) - {r.request_id for r in queue}:
            del groups[gone]
        if not queue:
            return
        present = {groups[r.request_id] for r in queue}
        chosen = next(g for g in ((pointer[0] - s) % 10 for s in range(10)) if g in present)
        pointer[0] = (chosen - 1) % 10
        assert policy.pointer == pointer[0]
        members = [i for i in fcfs_reference(queue) if groups[queue[i].request_id] == chosen]
        quota = min(len(members), (chosen + 1) * k)
        assert order[:quota] == members[:quota]
        visit = [(chosen - s) % 10 for s in range(1, 10)] + [chosen]
        rank = [visit.index(groups[queue[i].request_id]) for i in order[quota:]]
        assert rank == sorted(rank)

    run_steps(policy, steps, check)
