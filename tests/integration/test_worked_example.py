"""The design's worked example, inside vLLM: five cache hits and one older 6,000-token miss."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

T0 = 1_000.0
PREFIX = list(range(1_000, 7_000))  # 6,000 tokens = 375 blocks of 16


def _build(offline, helpers, policy: str, *, async_scheduling: bool = False):
    sched = offline.make_offline_scheduler(
        policy, num_blocks=3_000, max_num_seqs=16, async_scheduling=async_scheduling
    )
    sched.add_request(offline.make_request("S", PREFIX, T0))
    offline.run_until_idle(sched)  # S prefills (3 chunks) and finishes: the prefix is cached
    sched.add_request(offline.make_request("M", helpers.tokens(50_000, 6_000), T0 + 1.0))
    for i in range(1, 6):
        prompt = PREFIX + helpers.tokens(60_000 + 1_000 * i, 300)
        sched.add_request(offline.make_request(f"H{i}", prompt, T0 + 1.0 + 0.001 * i))
    sched.fairway_clock = lambda: T0 + 1.01  # negligible wait next to the cache benefit
    return sched


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_fairway_step_schedules_hits_and_a_slice_of_the_miss(offline, helpers, async_scheduling):
    sched = _build(offline, helpers, "fairway-step", async_scheduling=async_scheduling)
    for i in range(1, 6):
        assert sched.fairway_mirror.fresh_cached_tokens(sched.requests[f"H{i}"]) == 6_000
    before = sched.fairway_totals.placed.copy()

    out, _ = offline.step(sched)

    assert out.num_scheduled_tokens == {
        "H1": 300, "H2": 300, "H3": 300, "H4": 300, "H5": 300, "M": 548,
    }  # fmt: skip
    assert [sched.fairway_last_views[i].request_id for i in sched.fairway_last_order] == [
        "H1", "H2", "H3", "H4", "H5", "M",
    ]  # fmt: skip
    assert sched.fairway_last_ordering.lanes == ["fast"] * 5 + ["fair"]
    placed = {k: v - before[k] for k, v in sched.fairway_totals.placed.items()}
    assert placed == {"fast": 5, "fair": 1, "single": 0}
    helpers.check_queues(sched)
    # M continues as a chunked prefill; everyone finishes.
    offline.run_until_idle(sched)
    assert not sched.requests


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("fcfs", {"M": 2_048}),  # the older miss first, it takes the whole budget
        ("lpm", {"H1": 300, "H2": 300, "H3": 300, "H4": 300, "H5": 300, "M": 548}),
        ("fairway-nofair", {"H1": 300, "H2": 300, "H3": 300, "H4": 300, "H5": 300, "M": 548}),
    ],
)
def test_same_scheduler_class_serves_other_policies(offline, helpers, policy, expected):
    sched = _build(offline, helpers, policy)
    out, _ = offline.step(sched)
    assert out.num_scheduled_tokens == expected
    assert sched.fairway_totals.policy_fallbacks == 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_fairway_takes_the_papers_first_step_then_carries_the_charges(
    offline, helpers, async_scheduling
):
    """`fairway`'s first contested step is the paper's: the five hits (1,500 tokens = M / 4), then
    548 tokens of M. The ledgers start at (4 x 300, 6,000) and are charged what vLLM scheduled:
    Fast 1,200 + 4 x 1,500 = 7,200, Fair 6,000 + 548. Once the hits are done M is alone: no
    contest, whole steps (no cap)."""
    sched = _build(offline, helpers, "fairway", async_scheduling=async_scheduling)
    before = dict(sched.fairway_totals.lane_prefill_tokens)
    out, _ = offline.step(sched)
    assert out.num_scheduled_tokens == {
        "H1": 300, "H2": 300, "H3": 300, "H4": 300, "H5": 300, "M": 548,
    }  # fmt: skip
    share = sched.fairway_last_plan
    assert (share.front_id, share.contested) == ("M", True)
    assert sched.fairway_last_ordering.lanes == ["fast"] * 5 + ["fair"]
    ledger = sched.fairway_policy.ledger
    assert (ledger.fast, ledger.fair, ledger.fast_tokens, ledger.fair_tokens) == (
        7_200, 6_548, 1_500, 548
    )  # fmt: skip
    assert sched.scheduler_config.long_prefill_token_threshold == 0  # restored
    out, _ = offline.step(sched)
    assert dict(out.num_scheduled_tokens) == {"M": 2_048}
    assert not sched.fairway_last_plan.contested
    offline.run_until_idle(sched)
    assert not sched.requests
    lanes = sched.fairway_totals.lane_prefill_tokens
    assert {k: v - before[k] for k, v in lanes.items()} == {"fair": 6_000, "fast": 1_500}
