"""`fairway` skips its plan in steps where no prefill can run, and schedules exactly the same.

With every request slot taken and no running request in prefill, vLLM can start nothing and has
no prefill to cap, so the step is not contested: the scheduler only advances the probe and calls
the policy's `step_without_prefill()` (ledgers kept, as the plan of such a step keeps them).
Two real schedulers, one planning every step as before (the check `has_running_prefill` forced
true), get the same workload with long decodes that fill the slots; every step must schedule the
same requests and tokens, and the ledgers must agree after every step.
"""

from __future__ import annotations

import random

import pytest

pytestmark = pytest.mark.integration


def _run(offline, helpers, monkeypatch, always_plan: bool, seed: int):
    from fairway.vllm import internals

    if always_plan:
        monkeypatch.setattr(internals, "has_running_prefill", lambda scheduler: True)
    rng = random.Random(seed)
    sched = offline.make_offline_scheduler(
        "fairway", num_blocks=600, max_num_batched_tokens=128, max_num_seqs=3
    )
    clock = [0.0]
    sched.set_fairway_clock(lambda: clock[0])
    prefixes = [helpers.tokens(100_000 * (g + 1), 16 * (3 + 4 * g)) for g in range(3)]
    record, ledgers, n = [], [], 0
    for step in range(160):
        clock[0] = step * 0.05
        for _ in range(rng.choice((0, 0, 0, 1, 3))):
            suffix = helpers.tokens(1_000_000 + 1_000 * n, rng.randint(100, 700))
            prompt = rng.choice(prefixes) + suffix
            max_tokens = rng.choice((1, 2, 40, 90))  # long decodes fill the slots
            sched.add_request(offline.make_request(f"q{n}", prompt, clock[0], max_tokens))
            n += 1
        output, _ = offline.step(sched)
        record.append(list(output.num_scheduled_tokens.items()))
        ledger = sched.fairway_policy.ledger
        ledgers.append((ledger.fast, ledger.fair, ledger.steps, ledger.active))
    monkeypatch.undo()
    return record, ledgers, sched


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_skipping_steps_without_prefill_changes_nothing(offline, helpers, monkeypatch, seed):
    planned, planned_ledgers, always = _run(offline, helpers, monkeypatch, True, seed)
    skipped, skipped_ledgers, sched = _run(offline, helpers, monkeypatch, False, seed)
    assert skipped == planned
    assert skipped_ledgers == planned_ledgers
    assert always.fairway_steps_skipped == 0
    assert sched.fairway_steps_skipped > 10  # the workload has such steps, and they were skipped
    assert sched.fairway_totals.policy_fallbacks == always.fairway_totals.policy_fallbacks == 0
