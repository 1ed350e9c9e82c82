"""The head-only order (fairway-step's `ordering` with `Step.head`) schedules exactly what the
full order does.

Two real vLLM schedulers, one ordering only the positions vLLM's scan can reach (the default),
one ordering the whole queue, get the same random multi-step workload; every step must schedule
the same requests, in the same order, with the same token counts. With distinct arrival times the
order does not depend on queue positions, so this holds over any number of steps; with tied
arrivals (broken by queue position, which the head path leaves as it was past the head) each
step's head is still the full order's head of that step's queue (the second test).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from fairway.policies import Step

pytestmark = pytest.mark.integration


def _workload(rng: random.Random, helpers, steps: int, tie_arrivals: bool):
    """(step, request id, prompt, arrival, max_tokens) of a run; prompts share 5 prefixes."""
    prefixes = [helpers.tokens(100_000 * (g + 1), 16 * (2 + 5 * g)) for g in range(5)]
    n = 0
    for step in range(steps):
        for _ in range(rng.choice((0, 1, 2, 3, 6))):
            prefix = rng.choice(prefixes) if rng.random() < 0.8 else []
            prompt = prefix + helpers.tokens(1_000_000 + 1_000 * n, rng.randint(1, 300))
            arrival = step * 0.05 - (0.0 if tie_arrivals else rng.random() * 0.04)
            yield step, f"q{n}", prompt, arrival, rng.choice((1, 1, 3, 8))
            n += 1


def _build(offline, policy: str, head_only: bool, max_num_seqs: int):
    sched = offline.make_offline_scheduler(
        policy, num_blocks=400, max_num_batched_tokens=256, max_num_seqs=max_num_seqs
    )
    sched.fairway_prepass.head_only = head_only
    return sched


def _steps(offline, sched, workload, clock, total_steps: int):
    """Per step: [(request id, tokens)] in vLLM's scheduling order."""
    by_step: dict[int, list] = {}
    for step, *request in workload:
        by_step.setdefault(step, []).append(request)
    record = []
    for step in range(total_steps):
        clock[0] = step * 0.05
        for request_id, prompt, arrival, max_tokens in by_step.get(step, []):
            sched.add_request(offline.make_request(request_id, prompt, arrival, max_tokens))
        output, _ = offline.step(sched)
        record.append(list(output.num_scheduled_tokens.items()))
        if step >= max(by_step) and not sched.has_requests():
            break
    return record


@pytest.mark.parametrize(
    ("policy", "max_num_seqs", "seed", "ties"),
    [
        ("fairway-step", 6, 1, False),
        ("fairway-step", 12, 2, False),
        ("fairway-abswait", 6, 3, False),
        ("fairway-nofair", 8, 4, False),
        ("fairway", 6, 5, False),
        ("fairway", 12, 6, False),
    ],
)
def test_head_order_schedules_as_the_full_order(offline, helpers, policy, max_num_seqs, seed, ties):
    from fairway.vllm import internals

    workload = list(_workload(random.Random(seed), helpers, 60, ties))
    records, runs = [], []
    for head_only in (True, False):
        sched = _build(offline, policy, head_only, max_num_seqs)
        clock = [0.0]
        sched.fairway_clock = lambda clock=clock: clock[0]
        shorter: list[bool] = []
        plan = sched.fairway_prepass.order_queue

        def spy(current, plan=plan, shorter=shorter, sched=sched):
            bound = internals.scan_bound(sched)
            shorter.append(bound is not None and bound < len(current))
            return plan(current)

        sched.fairway_prepass.order_queue = spy
        records.append(_steps(offline, sched, workload, clock, 600))
        assert not sched.has_requests()
        assert sched.fairway_totals.policy_fallbacks == 0
        totals = sched.fairway_totals
        runs.append((any(shorter), dict(totals.placed), dict(totals.lane_prefill_tokens)))
    assert records[0] == records[1]
    assert runs[0][0], "the head was never shorter than the queue: nothing was tested"
    assert runs[0][1:] == runs[1][1:]  # no admission past the head: every one has its lane


@pytest.mark.parametrize("policy", ["fairway-step", "fairway-nofair"])
def test_each_steps_head_is_the_full_orders_head_with_tied_arrivals(offline, helpers, policy):
    workload = list(_workload(random.Random(7), helpers, 60, tie_arrivals=True))
    sched = _build(offline, policy, True, 6)
    clock = [0.0]
    sched.fairway_clock = lambda: clock[0]
    policy_obj = sched.fairway_policy
    ordering = policy_obj.ordering
    shorter = []

    def check(cols, step):
        full = ordering(cols, Step(step.now))
        got = ordering(cols, step)
        head = step.head
        assert np.asarray(got.order)[:head].tolist() == list(full.order)[:head]
        assert got.lanes[:head] == full.lanes[:head]
        shorter.append(head < len(cols))
        return got

    policy_obj.ordering = check
    _steps(offline, sched, workload, clock, 600)
    assert not sched.has_requests() and any(shorter)
    assert sched.fairway_totals.policy_fallbacks == 0
    assert sum(sched.fairway_totals.placed.values()) == len(workload)  # all admitted in a head


def test_unplaced_lane_is_the_metrics_no_lane() -> None:
    from fairway.policies import UNPLACED_LANE
    from fairway.vllm.metrics import LANES, NO_LANE

    assert UNPLACED_LANE == NO_LANE and UNPLACED_LANE not in LANES


def test_scan_bound_counts_free_slots_and_deferred(offline, helpers) -> None:
    from fairway.vllm import internals

    sched = offline.make_offline_scheduler("fairway-step", max_num_seqs=4)
    for k in range(6):
        prompt = helpers.tokens(1000 * k, 40)
        sched.add_request(offline.make_request(f"r{k}", prompt, float(k), max_tokens=50))
    assert internals.scan_bound(sched) == 4
    offline.step(sched)
    assert len(sched.running) == 4 and internals.scan_bound(sched) == 0
    sched.deferred_waiting.add(sched.waiting.peek_request())  # as if vLLM had skipped it
    assert internals.scan_bound(sched) == 1
    sched.lora_config = object()  # the LoRA limit can skip any request: no bound
    assert internals.scan_bound(sched) is None


def _long_workload(rng: random.Random, helpers, steps: int):
    """Prompts of a shared prefix, one of a few long documents (several requests of a document
    arrive in the same step, so one's blocks are cached while the next is scanned: hits that
    grow within the step) and a short tail; some steps bring a burst."""
    prefixes = [helpers.tokens(100_000 * (g + 1), 64) for g in range(3)]
    documents = [helpers.tokens(2_000_000 + 10_000 * d, rng.randint(60, 1_500))
                 for d in range(12)]
    n = 0
    for step in range(steps):
        burst = rng.choice(documents) if rng.random() < 0.4 else None  # one document for all
        for _ in range(rng.choice((0, 1, 2, 4, 12))):
            prompt = rng.choice(prefixes) + (burst or rng.choice(documents))
            prompt += helpers.tokens(5_000_000 + 1_000 * n, rng.randint(1, 40))
            yield step, f"q{n}", prompt, step * 0.05 - rng.random() * 0.04, rng.choice((1, 1, 4))
            n += 1


@pytest.mark.parametrize(("max_num_seqs", "seed"), [(16, 11), (24, 12), (32, 13)])
def test_fairway_over_the_scans_head_schedules_as_the_full_order(
    offline, helpers, max_num_seqs, seed
):
    """`fairway` given the first entries of each lane (one per position vLLM's scan can reach,
    plus one per running prefill) schedules what the whole order schedules, with the same lanes
    and lane tokens, through hits that grow within a step (documents computed by a request the
    same step admitted) and bursts not looked up yet."""
    workload = list(_long_workload(random.Random(seed), helpers, 80))
    records, runs = [], []
    for head_only in (True, False):
        sched = offline.make_offline_scheduler(
            "fairway", num_blocks=3_000, max_num_batched_tokens=256, max_num_seqs=max_num_seqs
        )
        sched.fairway_prepass.head_only = head_only
        clock = [0.0]
        sched.fairway_clock = lambda clock=clock: clock[0]
        records.append(_steps(offline, sched, workload, clock, 2_000))
        assert not sched.has_requests()
        totals = sched.fairway_totals
        assert totals.policy_fallbacks == 0
        runs.append((dict(totals.placed), dict(totals.lane_prefill_tokens)))
    assert records[0] == records[1]
    assert runs[0] == runs[1]
