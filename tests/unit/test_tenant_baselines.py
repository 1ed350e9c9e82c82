"""Tenant-fair baselines, VTC (`vtc`) and DLPM (`dlpm`): hand examples, state, properties."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairway.errors import FairwayConfigError
from fairway.policies import QueueColumns, QueuedRequest, Step, get, names
from fairway.policies.dlpm import DLPMPolicy
from fairway.policies.vtc import VTCPolicy


def req(rid: str, arrival: float, prompt: int, cached: int = 0, tenant: int = 0) -> QueuedRequest:
    return QueuedRequest(rid, float(arrival), prompt, cached, tenant)


def ids(queue: Sequence[QueuedRequest], order: Sequence[int]) -> list[str]:
    return [queue[i].request_id for i in order]


def columns_order(policy, queue: Sequence[QueuedRequest], weights=()) -> list[int]:
    ordering = policy.ordering(QueueColumns.of(queue), Step(0.0, tenant_weights=tuple(weights)))
    return np.asarray(ordering.order).tolist()


# --- registry and parameters ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cls", "needs_hits"), [("vtc", VTCPolicy, False), ("dlpm", DLPMPolicy, True)]
)
def test_registered_with_flags(name, cls, needs_hits) -> None:
    assert name in names()
    policy = get(name)
    assert type(policy) is cls and policy.name == name
    assert cls.needs_cache_hits is needs_hits
    assert cls.stateful is True


def test_parameters() -> None:
    assert get("vtc").params() == {}
    assert get("dlpm").params() == {"quantum": 2048}
    assert get("dlpm", quantum=64).quantum == 64


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "2048", None])
def test_dlpm_rejects_a_bad_quantum(bad) -> None:
    with pytest.raises(FairwayConfigError, match="quantum must be an integer > 0"):
        get("dlpm", quantum=bad)
    with pytest.raises(ValueError, match="quantum"):
        DLPMPolicy(quantum=bad)


@pytest.mark.parametrize("name", ["vtc", "dlpm"])
@pytest.mark.parametrize("weights", [(1.0, 0.0), (-1.0,), (float("nan"),)])
def test_bad_tenant_weights_raise(name, weights) -> None:
    with pytest.raises(ValueError, match="tenant_weights"):
        columns_order(get(name), [req("a", 0, 10)], weights)


# --- VTC --------------------------------------------------------------------------------------


def test_vtc_one_tenant_is_fcfs() -> None:
    queue = [req("r0", 3, 100), req("r1", 1, 5000), req("r2", 2, 0), req("r3", 1, 10)]
    policy = get("vtc")
    assert policy.order(queue, 5.0) == [1, 3, 2, 0]
    policy.on_step_end(["r1"], 5000)
    assert policy.order(queue[:1] + queue[2:], 6.0) == [2, 1, 0]
    assert columns_order(get("vtc"), queue, (3.0,)) == [1, 3, 2, 0]


# Tenant 0 weighs 1, tenant 1 weighs 2: tenant 1's requests rise its ledger by half as much.
VTC_QUEUE = [
    req("a0", 0, 100, 90, tenant=0),
    req("a1", 1, 100, 90, tenant=0),
    req("a2", 2, 100, 90, tenant=0),
    req("b0", 3, 100, tenant=1),
    req("b1", 4, 100, tenant=1),
    req("b2", 5, 100, tenant=1),
]


@pytest.mark.parametrize("path", ["order", "ordering"])
def test_vtc_two_tenants_by_hand_over_two_steps(path) -> None:
    policy = get("vtc")
    weights = (1.0, 2.0)

    def order(queue):
        if path == "order":
            policy.tenant_weights = weights
            return ids(queue, policy.order(queue, 0.0))
        return ids(queue, columns_order(policy, queue, weights))

    # Tags: a0 0, a1 100, a2 200; b0 0, b1 50, b2 100; ties by arrival (a0 before b0, a1 before b2).
    assert order(VTC_QUEUE) == ["a0", "b0", "b1", "a1", "b2", "a2"]
    policy.on_step_end(["a0", "b0"], 200)
    assert dict(policy.counters) == {0: 100.0, 1: 50.0}  # full prompts, cached or not
    # Normalised to {0: 50, 1: 0}: tags a1 50, a2 150; b1 0, b2 50.
    step2 = [r for r in VTC_QUEUE if r.request_id not in ("a0", "b0")]
    assert order(step2) == ["b1", "a1", "b2", "a2"]
    assert dict(policy.counters) == {0: 50.0, 1: 0.0}
    policy.on_step_end(["b1", "a1", "not-in-the-queue"], 200)
    assert dict(policy.counters) == {0: 150.0, 1: 50.0}
    policy.on_step_end(["a1"], 0)  # reported twice: charged once
    assert dict(policy.counters) == {0: 150.0, 1: 50.0}


def test_vtc_lifts_a_returning_tenant_to_the_least_waiting_counter() -> None:
    policy = get("vtc")
    alone = [req(f"a{k}", k, 1000, tenant=0) for k in range(4)]
    assert ids(alone, policy.order(alone, 0.0)) == ["a0", "a1", "a2", "a3"]
    policy.on_step_end(["a0", "a1"], 2000)
    assert dict(policy.counters) == {0: 2000.0}
    both = alone[2:] + [req("b0", 10, 1000, tenant=1), req("b1", 11, 1000, tenant=1)]
    # Tenant 1 was not waiting: lifted to tenant 0's 2000, so it does not take 2 requests' worth
    # of service first (unlifted, the order would be b0, b1, a2, a3).
    assert ids(both, policy.order(both, 1.0)) == ["a2", "b0", "a3", "b1"]
    assert dict(policy.counters) == {0: 0.0, 1: 0.0}


def test_vtc_lift_keeps_a_higher_own_counter_and_forgets_idle_ones_below_the_floor() -> None:
    policy = get("vtc")
    step1 = [req("a0", 0, 100, tenant=0), req("b0", 1, 5000, tenant=1)]
    assert policy.order(step1, 0.0) == [0, 1]
    policy.on_step_end(["a0", "b0"], 5100)
    assert dict(policy.counters) == {0: 100.0, 1: 5000.0}
    step2 = [req("a1", 2, 100, tenant=0)]  # tenant 1 idle, 4900 above tenant 0
    assert policy.order(step2, 1.0) == [0]
    assert dict(policy.counters) == {0: 0.0, 1: 4900.0}
    policy.on_step_end(["a1"], 100)
    step3 = [req("b1", 4, 10, tenant=1), req("a2", 5, 10, tenant=0)]
    # Tenant 1 returns: max(4900, floor 100) = 4900 -> after normalisation 4800 > 0, so the
    # younger a2 goes first.
    assert ids(step3, policy.order(step3, 2.0)) == ["a2", "b1"]
    assert dict(policy.counters) == {0: 0.0, 1: 4800.0}
    policy.on_step_end(["a2", "b1"], 20)
    # Tenant 1 idle below the floor next time: forgotten (it would be lifted to the floor).
    step4 = [req("a3", 6, 10, tenant=0)]
    policy.order(step4, 3.0)
    assert dict(policy.counters) == {0: 0.0, 1: 4800.0}  # 4810 - 10: still above
    policy.on_step_end(["a3"], 10)
    policy.order([req("a4", 7, 5000, tenant=0)], 4.0)
    policy.on_step_end(["a4"], 5000)
    policy.order([req("a5", 8, 1, tenant=0)], 5.0)
    assert dict(policy.counters) == {0: 0.0}


def test_vtc_charges_an_admission_deep_in_the_order_through_the_columns() -> None:
    policy = get("vtc")
    queue = [req(f"a{k}", k, 10, tenant=0) for k in range(40)] + [req("b", 100, 7, tenant=1)]
    order = ids(queue, columns_order(policy, queue, (1.0, 0.5)))
    assert order[-1] == "a39" and order.index("b") < 10
    policy.on_step_end(["a39"], 10)  # not among the first rows: resolved from all of them
    assert dict(policy.counters) == {0: 10.0, 1: 0.0}
    assert policy.remembered["b"] == (1, 7)
    assert len(policy.remembered) == len(queue)


# --- DLPM -------------------------------------------------------------------------------------


def lpm_key_order(queue: Sequence[QueuedRequest]) -> list[int]:
    return sorted(range(len(queue)), key=lambda i: (-queue[i].cached_tokens, queue[i].arrival, i))


def test_dlpm_one_tenant_is_lpm() -> None:
    queue = [
        req("r0", 0, 300),
        req("r1", 1, 200, 150),
        req("r2", 2, 100, 60),
        req("r3", 0.5, 400, 150),
        req("r4", 1, 10, 0),
    ]
    policy = get("dlpm", quantum=1)
    assert policy.order(queue, 1.0) == lpm_key_order(queue) == [3, 1, 2, 0, 4]
    assert get("lpm").order(queue, 1.0) == lpm_key_order(queue)  # a fresh LPM agrees


# quantum 100. Costs (`remaining`): a 60, b 80, c 70; p 30, q 120. LPM inside tenant 0: a, b, c
# (hits 90, 50, 0); inside tenant 1: p, q (hits 200, 0).
DLPM_QUEUE = [
    req("a", 0, 150, 90, tenant=0),
    req("b", 1, 130, 50, tenant=0),
    req("c", 2, 70, 0, tenant=0),
    req("p", 3, 230, 200, tenant=1),
    req("q", 4, 120, 0, tenant=1),
]


@pytest.mark.parametrize("path", ["order", "ordering"])
def test_dlpm_two_tenants_by_hand_over_two_steps(path) -> None:
    policy = get("dlpm", quantum=100)

    def order(queue):
        if path == "order":
            return ids(queue, policy.order(queue, 0.0))
        return ids(queue, columns_order(policy, queue))

    # visit 0, tenant 0: d = 100 -> a (40) -> b (-40); visit 1, tenant 1: 100 -> p (70) -> q (-50);
    # visit 2, tenant 0: -40 + 100 = 60 -> c.
    assert order(DLPM_QUEUE) == ["a", "b", "p", "q", "c"]
    assert dict(policy.deficits) == {}  # placement only: nothing booked yet
    policy.on_step_end(["a", "b", "p"], 0)
    # Visits 0 and 1 took place: tenant 0: 100 - 60 - 80; tenant 1: 100 - 30. Tenant 1's visit
    # was cut short by the step's end (70 > 0, q left): the pointer stays on it, visit open.
    assert dict(policy.deficits) == {0: -40.0, 1: 70.0}
    assert (policy.pointer, policy.visit_open) == (1, True)
    step2 = [DLPM_QUEUE[2], DLPM_QUEUE[4], req("r", 5, 50, 40, tenant=0), req("u", 6, 30, 0, 1)]
    # Tenant 1 resumes with 70 (no new quantum): q (-50); tenant 0: -40 + 100 = 60 -> r (hit 40,
    # cost 10: 50) -> c (-20); tenant 1: -50 + 100 -> u. (A new quantum at the resumed visit
    # would give q, u, r, c.)
    assert order(step2) == ["q", "r", "c", "u"]
    policy.on_step_end(["q"], 0)
    # Only q: tenant 1 resumed (no quantum), 70 - 120; tenant 0 was not visited. Tenant 1's visit
    # is over (d <= 0): the pointer moves past it (and will wrap round to 0).
    assert dict(policy.deficits) == {0: -40.0, 1: -50.0}
    assert (policy.pointer, policy.visit_open) == (2, False)
    step3 = [step2[0], step2[2], step2[3], req("s", 7, 10, 0, tenant=1)]
    # Tenant 0: 60 -> r (50) -> c (-20); tenant 1: -50 + 100 = 50 -> u (20) -> s (10).
    assert order(step3) == ["r", "c", "u", "s"]
    policy.on_step_end([], 0)  # nothing admitted: nothing changes
    assert dict(policy.deficits) == {0: -40.0, 1: -50.0}
    assert (policy.pointer, policy.visit_open) == (2, False)


def test_dlpm_weights_scale_the_quantum_and_absent_tenants_are_reset() -> None:
    policy = get("dlpm", quantum=100)
    queue = [req(f"a{k}", k, 50, tenant=0) for k in range(4)]
    queue += [req(f"b{k}", 10 + k, 50, tenant=1) for k in range(4)]
    policy.tenant_weights = (1.0, 2.0)
    # Tenant 0 places 2 per visit (100 / 50), tenant 1 places 4 (200 / 50).
    assert ids(queue, policy.order(queue, 0.0)) == ["a0", "a1", "b0", "b1", "b2", "b3", "a2", "a3"]
    policy.on_step_end(["a0", "a1", "b0"], 0)
    assert dict(policy.deficits) == {0: 0.0, 1: 150.0}
    assert (policy.pointer, policy.visit_open) == (1, True)
    rest = [r for r in queue if r.tenant == 0 and r.request_id not in ("a0", "a1")]
    policy.order(rest, 1.0)  # tenant 1 no longer waits: its deficit is reset
    assert dict(policy.deficits) == {0: 0.0}


def test_dlpm_skips_idle_rounds_for_requests_of_many_quanta() -> None:
    policy = get("dlpm", quantum=1)
    queue = [req("big", 0, 100_000, tenant=0), req("small", 1, 3, tenant=1)]
    # d = 1 > 0 places big at once, whatever it costs; the debt carries over.
    assert ids(queue, policy.order(queue, 0.0)) == ["big", "small"]
    queue = [
        req("x0", 0, 10_001, tenant=0),
        req("x1", 1, 5, tenant=0),
        req("y0", 2, 20_001, tenant=1),
        req("y1", 3, 5, tenant=1),
    ]
    # Visits 0, 1: x0 (d0 = -10000), y0 (d1 = -20000); tenant 0 reaches d > 0 at its 10002nd
    # visit (x1), tenant 1 at its 20002nd (y1): ~30000 visits, nearly all skipped arithmetically.
    assert ids(queue, policy.order(queue, 0.0)) == ["x0", "y0", "x1", "y1"]
    policy.on_step_end(["x0", "y0", "x1"], 0)
    # Up to x1's visit tenant 1 had 10001 quanta: 10001 - 20001. Tenant 0 has nothing left: reset.
    assert dict(policy.deficits) == {1: -10_000.0}
    assert (policy.pointer, policy.visit_open) == (1, False)


# --- properties -------------------------------------------------------------------------------

tenant_queues = st.lists(
    st.tuples(
        st.sampled_from([0.0, 1.0, 1.5, 2.0, 7.25]),  # few arrivals: many ties
        st.integers(0, 3000),
        st.floats(0, 1),
        st.integers(0, 3),
    ),
    max_size=30,
)
weights_st = st.lists(st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 3.0]), max_size=4).map(tuple)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(st.tuples(tenant_queues, st.integers(0, 6)), min_size=1, max_size=4),
    weights=weights_st,
)
def test_vtc_columns_equal_the_reference_over_steps(steps, weights) -> None:
    reference, engine = get("vtc"), get("vtc")
    reference.tenant_weights = weights
    waiting: list[QueuedRequest] = []
    serial = 0
    for arrivals, admit in steps:
        for arrival, prompt, frac, tenant in arrivals:
            waiting.append(req(f"q{serial}", arrival, prompt, int(prompt * frac), tenant))
            serial += 1
        expected = reference.order(waiting, 0.0)
        got = columns_order(engine, waiting, weights)
        assert got == expected
        assert dict(engine.counters) == dict(reference.counters)
        admitted = [waiting[i].request_id for i in expected[:admit]]
        if len(expected) > admit:  # one admission out of order, to exercise the lookup
            admitted.append(waiting[expected[-1]].request_id)
        reference.on_step_end(admitted + ["unknown"], 0)
        engine.on_step_end(admitted + ["unknown"], 0)
        assert dict(engine.counters) == dict(reference.counters)
        waiting = [r for r in waiting if r.request_id not in admitted]


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(st.tuples(tenant_queues, st.integers(0, 6)), min_size=1, max_size=4),
    tenant=st.integers(0, 3),
    weight=st.sampled_from([0.5, 1.0, 3.0]),
)
def test_vtc_with_one_tenant_is_fcfs_over_steps(steps, tenant, weight) -> None:
    policy = get("vtc")
    waiting: list[QueuedRequest] = []
    serial = 0
    for arrivals, admit in steps:
        for arrival, prompt, frac, _ in arrivals:
            waiting.append(req(f"q{serial}", arrival, prompt, int(prompt * frac), tenant))
            serial += 1
        order = columns_order(policy, waiting, (weight,) * 4)
        assert order == get("fcfs").order(waiting, 0.0)
        admitted = [waiting[i].request_id for i in order[:admit]]
        policy.on_step_end(admitted, 0)
        waiting = [r for r in waiting if r.request_id not in admitted]


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(st.tuples(tenant_queues, st.integers(0, 6)), min_size=1, max_size=4),
    weights=weights_st,
    quantum=st.sampled_from([1, 16, 100, 2048]),
    name=st.sampled_from(["vtc", "dlpm"]),
)
def test_every_tenant_ordering_is_a_permutation(steps, weights, quantum, name) -> None:
    policy = get(name, quantum=quantum) if name == "dlpm" else get(name)
    waiting: list[QueuedRequest] = []
    serial = 0
    for arrivals, admit in steps:
        for arrival, prompt, frac, tenant in arrivals:
            waiting.append(req(f"q{serial}", arrival, prompt, int(prompt * frac), tenant))
            serial += 1
        order = columns_order(policy, waiting, weights)
        assert sorted(order) == list(range(len(waiting)))
        admitted = [waiting[i].request_id for i in order[:admit]]
        policy.on_step_end(admitted, 0)
        waiting = [r for r in waiting if r.request_id not in admitted]


def naive_drr(queue: Sequence[QueuedRequest], quantum: int, weights) -> list[int]:
    """DLPM from a fresh state, one visit at a time (no skipped rounds), deficits summed as they
    go: exact with the dyadic weights the test draws."""
    groups: dict[int, list[int]] = {}
    for i in lpm_key_order(queue):
        groups.setdefault(queue[i].tenant, []).append(i)
    deficit = dict.fromkeys(groups, 0.0)
    active = sorted(groups)
    order: list[int] = []
    while active:
        for t in list(active):
            deficit[t] += quantum * (weights[t] if t < len(weights) else 1.0)
            while deficit[t] > 0 and groups[t]:
                i = groups[t].pop(0)
                order.append(i)
                deficit[t] -= queue[i].remaining
            if not groups[t]:
                active.remove(t)
    return order


@settings(max_examples=150, deadline=None)
@given(queue=tenant_queues, weights=weights_st, quantum=st.sampled_from([1, 16, 100, 2048]))
def test_dlpm_equals_a_naive_round_robin(queue, weights, quantum) -> None:
    views = [req(f"q{k}", a, n, int(n * f), t) for k, (a, n, f, t) in enumerate(queue)]
    policy = get("dlpm", quantum=quantum)
    policy.tenant_weights = weights
    assert policy.order(views, 0.0) == naive_drr(views, quantum, weights)


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(st.tuples(tenant_queues, st.integers(0, 6)), min_size=1, max_size=4),
    quantum=st.sampled_from([1, 100, 2048]),
    tenant=st.integers(0, 3),
)
def test_dlpm_with_one_tenant_is_lpm_over_steps(steps, quantum, tenant) -> None:
    policy = get("dlpm", quantum=quantum)
    waiting: list[QueuedRequest] = []
    serial = 0
    for arrivals, admit in steps:
        for arrival, prompt, frac, _ in arrivals:
            waiting.append(req(f"q{serial}", arrival, prompt, int(prompt * frac), tenant))
            serial += 1
        order = policy.order(waiting, 0.0)
        assert order == lpm_key_order(waiting)
        admitted = [waiting[i].request_id for i in order[:admit]]
        policy.on_step_end(admitted, 0)
        waiting = [r for r in waiting if r.request_id not in admitted]
