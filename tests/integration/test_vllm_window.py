"""`vllm-window` admits as vLLM 0.34's own cache-aware admission window does.

Two real schedulers get the same requests: vLLM's own, with `cache_aware_admission_window=W`
and `cache_aware_admission_threshold=T`, and Fairway's with policy `vllm-window` (same W and T;
vLLM's window off). Every step must start the same requests in the same order, with the same
tokens, and leave the same waiting queue. Runs only where vLLM has the option (0.34 on): on an
earlier vLLM there is nothing to compare with. On vLLM 0.32's install, vLLM 0.34's Python code runs
over it with `PYTHONPATH=.cache/vllm/0.34.0/site:benchmarks/compat`.

The workloads keep away from the documented differences (`VLLMWindowPolicy`'s docstring): prompts
of 16k + 1 tokens that decode at most 15 tokens and never split into chunks take no block in the
running requests' part of the step, so the usage and the hits Fairway reads before the step are
the ones vLLM reads inside it, and nothing is preempted.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.integration

STEPS = 300
BLOCK = 16


@pytest.fixture(scope="module", autouse=True)
def _needs_the_option(offline: Any) -> None:
    import vllm
    from vllm.config import SchedulerConfig

    if "cache_aware_admission_window" not in SchedulerConfig.__dataclass_fields__:
        pytest.skip(
            f"vLLM {vllm.__version__} has no cache_aware_admission_window (added in vLLM 0.34): "
            "nothing to compare vllm-window with; run with "
            "PYTHONPATH=.cache/vllm/0.34.0/site:benchmarks/compat"
        )


def _prompt(helpers: Any, prefix: list[int], n: int, blocks: int) -> list[int]:
    """`prefix`, then distinct tokens up to `blocks` full blocks and one token more: the decode
    of up to 15 tokens then needs no new block."""
    return prefix + helpers.tokens(1_000_000 + 1_000 * n, BLOCK * blocks + 1 - len(prefix))


def _workload(helpers: Any, seed: int) -> Iterator[tuple[int, str, list[int], float, int]]:
    """(step, request id, prompt, arrival, max_tokens): four shared prefixes, cold prompts among
    warm ones, a few arrivals at most steps of the first 30, added in arrival order."""
    rng = random.Random(seed)
    prefixes = [helpers.tokens(100_000 * (g + 1), BLOCK * rng.randint(2, 8)) for g in range(4)]
    n = 0
    for step in range(30):
        for _ in range(rng.choice((0, 1, 2, 3, 5))):
            prefix = rng.choice(prefixes) if rng.random() < 0.6 else []
            blocks = len(prefix) // BLOCK + rng.randint(1, 8)
            yield step, f"q{n}", _prompt(helpers, prefix, n, blocks), step + 0.01 * n, \
                rng.choice((1, 1, 3, 8, 15))
            n += 1


def _build(offline: Any, window: int, threshold: float, ours: bool) -> Any:
    limits: dict[str, Any] = {
        "num_blocks": 90, "block_size": BLOCK, "max_num_seqs": 4, "max_num_batched_tokens": 2048,
    }
    if ours:
        return offline.make_offline_scheduler(
            "vllm-window", fairway_options={"window": window, "threshold": threshold}, **limits
        )
    return offline.make_offline_scheduler(
        None, cache_aware_admission_window=window, cache_aware_admission_threshold=threshold,
        **limits,
    )


def _spy_on_vllm(sched: Any, seen: list[dict[str, Any]]) -> None:
    """Record, at each of vLLM's re-sorts, the usage it read, whether a request slot was free,
    how many waited and whether the queue changed."""
    resort = sched._reorder_waiting_by_cached_prefix

    def spy() -> None:
        before = [r.request_id for r in sched.waiting]
        resort()
        seen.append({
            "usage": sched.kv_cache_manager.usage,
            "full": len(sched.running) >= sched.max_num_running_reqs,
            "waiting": len(before),
            "moved": before != [r.request_id for r in sched.waiting],
        })

    sched._reorder_waiting_by_cached_prefix = spy


def _spy_on_policy(sched: Any, usages: list[float | None]) -> None:
    policy = sched.fairway_policy
    ordering = policy.ordering

    def spy(queue: Any, step: Any) -> Any:
        usages.append(step.kv_usage)
        return ordering(queue, step)

    policy.ordering = spy


def _run(offline: Any, helpers: Any, seed: int, window: int, threshold: float
         ) -> list[dict[str, Any]]:
    theirs = _build(offline, window, threshold, ours=False)
    ours = _build(offline, window, threshold, ours=True)
    assert theirs.cache_aware_window == window and ours.cache_aware_window == 0
    seen: list[dict[str, Any]] = []
    usages: list[float | None] = []
    _spy_on_vllm(theirs, seen)
    _spy_on_policy(ours, usages)
    by_step: dict[int, list[tuple[str, list[int], float, int]]] = {}
    for step, request_id, prompt, arrival, max_tokens in _workload(helpers, seed):
        by_step.setdefault(step, []).append((request_id, prompt, arrival, max_tokens))
    for step in range(STEPS):
        for request_id, prompt, arrival, max_tokens in by_step.get(step, []):
            for sched in (theirs, ours):
                sched.add_request(offline.make_request(
                    request_id, prompt, arrival, max_tokens, block_size=BLOCK
                ))
        calls = len(seen)
        out_theirs, _ = offline.step(theirs)
        out_ours, _ = offline.step(ours)
        where = f"seed {seed}, step {step}"
        assert [r.req_id for r in out_ours.scheduled_new_reqs] == [
            r.req_id for r in out_theirs.scheduled_new_reqs
        ], where
        assert out_ours.num_scheduled_tokens == out_theirs.num_scheduled_tokens, where
        assert helpers.queue_ids(ours) == helpers.queue_ids(theirs), where
        if len(seen) > calls and seen[-1]["waiting"]:  # both read the same usage
            assert usages[-1] == seen[-1]["usage"], where
        if step > max(by_step) and not theirs.has_requests():
            break
    assert not theirs.has_requests() and not ours.has_requests()
    assert ours.fairway_totals.policy_fallbacks == 0
    return seen


@pytest.mark.parametrize(("window", "threshold"), [(3, 0.0), (8, 0.4)])
def test_same_admissions_as_vllms_own_window(offline, helpers, window, threshold) -> None:
    seen = [call for seed in (1, 2, 3) for call in _run(offline, helpers, seed, window, threshold)]
    acting = [c for c in seen if c["waiting"] >= 2 and c["usage"] >= threshold]
    # the comparison covered what matters: vLLM's window moved requests, also in steps where no
    # request could start (Fairway asks its policy then too), and for T > 0 the threshold held
    # it back in some steps
    assert sum(c["moved"] for c in acting) >= 5
    assert any(c["moved"] and c["full"] for c in acting)
    if threshold:
        assert any(c["waiting"] >= 2 and c["usage"] < threshold for c in seen)


def test_requests_that_are_not_plain_keep_their_positions(offline, helpers) -> None:
    """A request waiting for remote KV blocks and one partly computed hold their positions in
    both re-sorts, the ones past the window too (vLLM's re-sort called alone, and Fairway's
    pre-pass alone: the scan would treat those two requests specially)."""
    doc = helpers.tokens(50_000, 3 * BLOCK)
    queues = []
    for ours in (False, True):
        sched = _build(offline, 4, 0.0, ours)
        sched.add_request(offline.make_request("first", doc + [9], 0.0, block_size=BLOCK))
        offline.step(sched)  # the document is now cached
        names = ["cold", "blocked", "started", "warm", "warm-tail"]
        for k, name in enumerate(names):
            prompt = (doc if name.startswith("warm") else helpers.tokens(60_000 * (k + 1), 48))
            sched.add_request(offline.make_request(
                name, prompt + [k + 10], 1.0 + k, block_size=BLOCK
            ))
        from vllm.v1.request import RequestStatus

        sched.requests["blocked"].status = RequestStatus.WAITING_FOR_REMOTE_KVS
        sched.requests["started"].num_computed_tokens = BLOCK
        if ours:
            sched.fairway_prepass.reorder()
        else:
            sched._reorder_waiting_by_cached_prefix()
        queues.append(helpers.queue_ids(sched))
    assert queues[0] == ["warm", "blocked", "started", "cold", "warm-tail"]
    assert queues[1] == queues[0]
