"""`fairway:queued_uncached_tokens` on vLLM's real Scheduler: at the end of every step it is the
prompt tokens the waiting requests still have to compute after their cached prefix plus the
running ones' chunked-prefill rest (checked against vLLM's own lookups and counters), it moves
as the queue fills and drains, and reads 0 once the node is idle.
"""

from __future__ import annotations

import os

import pytest
from prometheus_client import REGISTRY

from fairway.vllm.metrics import MULTIPROC_ENV

pytestmark = pytest.mark.integration

PREFIX = 160  # tokens of a cached prefix (10 blocks of 16)


def _expected(sched) -> int:
    """The queue's work from vLLM's objects: a fresh prefix lookup per waiting request (at
    least 1 token: vLLM computes a fully cached prompt's last one), prompt minus computed
    tokens per running request."""
    mirror = sched.fairway_mirror
    waiting = sum(max(r.num_tokens - mirror.fresh_cached_tokens(r), 1) for r in sched.waiting)
    running = sum(max(r.num_prompt_tokens - r.num_computed_tokens, 0) for r in sched.running)
    return waiting + running


@pytest.mark.parametrize("policy", ["fairway", "fcfs"])
def test_queued_uncached_tokens_follows_the_queue(offline, helpers, policy):
    """One request slot, so that hits wait behind each other and behind misses."""
    sched = offline.make_offline_scheduler(policy, max_num_batched_tokens=64, max_num_seqs=1)
    prefix = helpers.tokens(50_000, PREFIX)
    sched.add_request(offline.make_request("warm", prefix + helpers.tokens(1, 16), 0.0))
    offline.run_until_idle(sched)  # the prefix is cached now
    assert sched.fairway_totals.queued_uncached_tokens == 0
    prompts = {"a": helpers.tokens(1000, 200), "b": helpers.tokens(2000, 130),
               **{f"hit{k}": prefix + helpers.tokens(100 * (k + 1), 40) for k in range(3)}}
    for k, (rid, prompt) in enumerate(prompts.items()):
        sched.add_request(offline.make_request(rid, prompt, 1.0 + k, max_tokens=3))
    seen = []
    while sched.has_requests():
        offline.step(sched)
        value = sched.fairway_totals.queued_uncached_tokens
        assert value == _expected(sched), (len(seen), value)
        seen.append(value)
        if not os.environ.get(MULTIPROC_ENV):
            labels = dict(sched.fairway_metrics.labels)
            assert REGISTRY.get_sample_value("fairway:queued_uncached_tokens", labels) == value
    # the waiting hits count only their 40 uncached tokens (not their cached 160), and the work
    # drains to 0 step by step: one step computes at most 64 tokens
    uncached = 200 + 130 + 3 * 40
    assert uncached - 64 <= seen[0] < uncached
    assert all(0 <= a - b <= 64 for a, b in zip(seen, seen[1:], strict=False))
    assert seen[-1] == 0 and len(set(seen)) > 5


def test_not_measured_without_metrics(offline, helpers):
    sched = offline.make_offline_scheduler("fairway", log_stats=False)
    sched.add_request(offline.make_request("a", helpers.tokens(1, 100), 1.0))
    offline.step(sched)
    assert sched.fairway_totals.queued_uncached_tokens is None  # no cost without metrics
    sched.fairway_prepass.exports_work = True  # what a replay that reads it switches on
    sched.add_request(offline.make_request("b", helpers.tokens(500, 100), 2.0))
    offline.step(sched)
    assert sched.fairway_totals.queued_uncached_tokens == _expected(sched)
