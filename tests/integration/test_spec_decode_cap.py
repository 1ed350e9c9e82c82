"""Fairway's per-step cap never cuts a running decode's speculative drafts.

vLLM applies `long_prefill_token_threshold` to every running request, decodes included, and a
decode carrying k draft tokens asks for 1 + k (`num_tokens_with_spec`). The step plan's cap is
therefore never set below 1 + `num_speculative_tokens` (`step_plan.apply`).

The engine here has a real `SpeculativeConfig` (the n-gram drafter, 3 tokens: it needs no draft
model, and vLLM builds it on CPU); `make_offline_scheduler` has no argument for it, so the test
hands it to the `VllmConfig` the harness builds. The drafts are given as the engine gives a
drafter's output, through the scheduler's `update_draft_token_ids`.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

NUM_SPEC = 3
PREFIX = list(range(500, 564))  # 4 blocks, cached by a warm-up request


@pytest.fixture()
def spec_offline(offline, monkeypatch):
    """The harness, building engines with n-gram speculative decoding (3 draft tokens)."""
    from vllm.config import ParallelConfig, SpeculativeConfig, VllmConfig

    def with_spec(**kwargs):
        kwargs["speculative_config"] = SpeculativeConfig(
            method="ngram",
            num_speculative_tokens=NUM_SPEC,
            prompt_lookup_max=3,
            prompt_lookup_min=1,
            target_model_config=kwargs["model_config"],
            target_parallel_config=ParallelConfig(),
        )
        return VllmConfig(**kwargs)

    from fairway.vllm import offline_vllm

    monkeypatch.setattr(offline_vllm, "VllmConfig", with_spec)
    return offline


def test_a_decode_keeps_its_drafts_in_a_capped_step(spec_offline):
    from vllm.v1.outputs import DraftTokenIds

    offline = spec_offline
    # 7 tokens a step: the decode's 1 + 3 leave 3 for the prefills, which is Fairway's cap.
    sched = offline.make_offline_scheduler(
        "fairway", max_num_batched_tokens=7, max_num_seqs=4, num_blocks=400
    )
    assert sched.num_spec_tokens == NUM_SPEC  # vLLM's scheduler sees the drafter
    sched.add_request(offline.make_request("seed", PREFIX, 0.0))
    offline.run_until_idle(sched)
    sched.add_request(offline.make_request("D", list(range(2_000, 2_005)), 0.5, max_tokens=50))
    offline.step(sched)  # D's prompt and first token: D decodes from now on
    assert not sched.requests["D"].is_prefill_chunk
    sched.update_draft_token_ids(DraftTokenIds(req_ids=["D"], draft_token_ids=[[5, 6, 7]]))
    # A long miss (the Fair lane's front) and a young hit (the Fast lane's): a contested step.
    sched.add_request(offline.make_request("M", list(range(3_000, 3_100)), 1.0))
    sched.add_request(offline.make_request("H", [*PREFIX, 9_000, 9_001], 1.1))
    sched.fairway_clock = lambda: 1.2
    out = sched.schedule()
    plan = sched.fairway_last_plan
    assert plan is not None and plan.contested
    assert plan.cap is not None and plan.cap < 1 + NUM_SPEC  # the plan caps below a decode
    tokens = dict(out.num_scheduled_tokens)
    assert tokens["D"] == 1 + NUM_SPEC
    assert out.scheduled_spec_decode_tokens == {"D": [5, 6, 7]}
    assert sum(tokens.values()) == 7 and tokens.keys() == {"D", "M", "H"}
    assert max(tokens["M"], tokens["H"]) <= 1 + NUM_SPEC  # the prefills are still capped
    assert sched.scheduler_config.long_prefill_token_threshold == 0  # restored
    sched.update_from_output(out, offline.fake_model_output(sched, out))
    offline.run_until_idle(sched)
    assert not sched.requests


def test_the_floor_is_one_without_speculative_decoding(offline):
    from fairway.vllm import internals

    sched = offline.make_offline_scheduler("fairway")
    assert internals.decode_tokens_per_step(sched) == 1
