"""SGLang's shortest-prefill-first inside vLLM: the reserve caps a running chunked prefill so a
shorter waiting request starts, whole, in the same step (`fairway.policies.spf`)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

T0 = 1_000.0
BUDGET = 512


def _running_long_prefill(offline, helpers, policy: str, **engine):
    """A 4,000-token prompt that took the whole first step (512 tokens), then two waiting
    requests: a short cold one and one longer than the prefill's rest."""
    sched = offline.make_offline_scheduler(
        policy, num_blocks=2_000, max_num_batched_tokens=BUDGET, max_num_seqs=8, **engine
    )
    sched.add_request(offline.make_request("long", helpers.tokens(100_000, 4_000), T0))
    out, _ = offline.step(sched)
    assert out.num_scheduled_tokens == {"long": BUDGET}
    sched.add_request(offline.make_request("huge", helpers.tokens(200_000, 6_000), T0 + 1.0))
    sched.add_request(offline.make_request("short", helpers.tokens(300_000, 100), T0 + 2.0))
    sched.fairway_clock = lambda: T0 + 2.0
    return sched


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_running_prefill_gets_a_smaller_chunk_and_the_short_one_starts(
    offline, helpers, async_scheduling
):
    sched = _running_long_prefill(offline, helpers, "spf", async_scheduling=async_scheduling)
    configured = sched.scheduler_config.long_prefill_token_threshold

    out, _ = offline.step(sched)

    # 100 tokens reserved: the continuation's chunk is capped at 412; the short request
    # starts and finishes its prefill in this step; the 6,000-token one is not shorter
    assert out.num_scheduled_tokens == {"long": BUDGET - 100, "short": 100}
    assert [r.req_id for r in out.scheduled_new_reqs] == ["short"]
    assert sched.fairway_last_plan is not None and sched.fairway_last_plan.cap == BUDGET - 100
    assert sched.scheduler_config.long_prefill_token_threshold == configured  # put back
    helpers.check_queues(sched)
    offline.run_until_idle(sched)
    assert not sched.requests


def test_without_the_reserve_the_running_prefill_takes_the_step(offline, helpers):
    """The same queue under FCFS (and SPF's order alone would not help): vLLM continues the
    running prefill first with the whole budget, the short request waits."""
    sched = _running_long_prefill(offline, helpers, "fcfs")
    out, _ = offline.step(sched)
    assert out.num_scheduled_tokens == {"long": BUDGET}


def test_no_cap_when_nothing_shorter_waits(offline, helpers):
    sched = offline.make_offline_scheduler(
        "spf", num_blocks=2_000, max_num_batched_tokens=BUDGET, max_num_seqs=8
    )
    sched.add_request(offline.make_request("long", helpers.tokens(100_000, 4_000), T0))
    offline.step(sched)
    sched.add_request(offline.make_request("huge", helpers.tokens(200_000, 6_000), T0 + 1.0))
    out, _ = offline.step(sched)
    assert out.num_scheduled_tokens == {"long": BUDGET}
    assert sched.fairway_last_plan is None
