"""Long context in the replay: prompts up to the model's 131,072-token context, what a longer one
gets, `fairway bench`'s engine flags, and errors raised inside worker processes."""

from __future__ import annotations

import json

import pytest

from fairway import cli
from fairway.errors import TraceError
from fairway.replay import engine_sizing, sim
from fairway.replay.sim_loop import ReplayHooks
from fairway.replay.sweep import ReplayJob, run_jobs
from fairway.traces.format import Trace, TraceHeader, TraceRequest, write_trace

pytestmark = pytest.mark.integration

CONTEXT = 131_072


def make_trace(*requests: tuple[str, float, tuple[tuple[str, int], ...]]) -> Trace:
    """A trace from (request_id, arrival_s, blocks)."""
    reqs = tuple(TraceRequest(rid, t, blocks, phase="calm") for rid, t, blocks in requests)
    header = TraceHeader(family="test", seed=0, shape=None, params={}, num_requests=len(reqs))
    return Trace(header, reqs)


def small_trace() -> Trace:
    """Two short requests sharing a document."""
    return make_trace(("a", 0.0, (("doc", 4_000), ("qa", 50))),
                      ("b", 0.5, (("doc", 4_000), ("qb", 50))))


def test_the_offline_config_declares_the_replays_context(offline):
    from fairway.vllm.offline_vllm import MODEL_CONTEXT_TOKENS

    assert MODEL_CONTEXT_TOKENS == engine_sizing.MAX_PROMPT_TOKENS == CONTEXT
    # vLLM refused this before: max_model_len 131,088 > max_position_embeddings 131,072.
    sched = offline.make_offline_scheduler("fcfs", max_model_len=CONTEXT + 16)
    assert sched.max_model_len == CONTEXT + 16


def test_a_prompt_at_the_full_context_replays_and_its_prefix_is_cached():
    trace = make_trace(("full", 0.0, (("doc", CONTEXT),)), ("again", 1.0, (("doc", CONTEXT),)))
    result = sim.replay(trace, "fcfs", max_num_batched_tokens=8_192)
    full, again = result.requests
    assert [r.error for r in result.requests] == [None, None]
    assert full.cached_tokens == 0 and full.ttft_s > 10  # 16 chunks of a 128k-token miss
    # vLLM caches a prompt up to its last token, in whole blocks: the repeat waits for the first
    # and then computes its last block only.
    assert again.cached_tokens == CONTEXT - 16
    assert again.first_scheduled_s == full.first_token_s
    assert again.first_token_s - again.first_scheduled_s < 1.0
    # The prompt plus its output token, in whole blocks of 16.
    assert result.settings["max_model_len"] == CONTEXT + 16


def test_a_prompt_longer_than_the_context_is_a_clear_error_before_vllm():
    trace = make_trace(("ok", 0.0, (("a", 1_000),)), ("huge", 1.0, (("b", CONTEXT + 1),)))
    with pytest.raises(TraceError) as caught:
        sim.replay(trace, "fcfs", trace_name="t")
    message = str(caught.value)
    assert "trace 't': request 'huge' has a 131,073-token prompt" in message
    assert "1 of 2 requests are longer than 131,072 tokens" in message


def test_a_too_long_trace_is_refused_by_bench_before_any_replay(tmp_path, capsys):
    path = write_trace(make_trace(("huge", 0.0, (("b", 200_000),))), tmp_path / "huge.jsonl")
    code = cli.main(["bench", "--trace", str(path), "--policy", "fcfs", "--workers", "2",
                     "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("fairway: error: trace 'huge': request 'huge' has a 200,000-token")
    assert not (tmp_path / "o").exists()  # refused before the output directory was made


def test_a_fairway_error_in_a_worker_keeps_its_type_and_message():
    trace = make_trace(("huge", 0.0, (("b", CONTEXT + 100),)))
    jobs = [ReplayJob("t", trace, policy) for policy in ("fcfs", "lpm")]
    with pytest.raises(TraceError, match="request 'huge' has a 131,172-token prompt"):
        run_jobs(jobs, workers=2, progress=False)


def test_a_vllm_error_in_a_worker_reaches_the_user_with_its_message(tmp_path, capsys):
    """vLLM's pydantic ValidationError cannot be pickled; the user once saw that instead."""
    path = write_trace(small_trace(), tmp_path / "small.jsonl")
    code = cli.main(["bench", "--trace", str(path), "--policy", "fcfs", "--policy", "lpm",
                     "--workers", "2", "--max-num-batched-tokens", "16", "--out",
                     str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("fairway: error: replay small @ ")
    assert "failed: ValidationError: 1 validation error for SchedulerConfig" in err
    assert "max_num_batched_tokens (16) must be greater than or equal to max_num_seqs (256)" in err
    assert "pickle" not in err


def test_the_engine_flags_reach_vllms_scheduler(tmp_path):
    path = write_trace(small_trace(), tmp_path / "small.jsonl")
    out = tmp_path / "o"
    code = cli.main(["bench", "--trace", str(path), "--policy", "fcfs", "--workers", "0",
                     "--max-num-batched-tokens", "4096", "--max-num-seqs", "32", "--out",
                     str(out), "--no-progress"])
    assert code == 0
    settings = json.loads((out / "replays" / "small--fcfs.json").read_text())["settings"]
    # Read back from the scheduler's own config, not from the arguments.
    assert (settings["max_num_batched_tokens"], settings["max_num_seqs"]) == (4096, 32)
    config = json.loads((out / "bench.json").read_text())["config"]
    assert (config["max_num_batched_tokens"], config["max_num_seqs"]) == (4096, 32)


def test_the_step_budget_changes_the_replay():
    """A 6,000-token miss takes 3 steps of 2,048 tokens but 1 of 8,192: two fixed costs less."""
    trace = make_trace(("m", 0.0, (("x", 6_000),)))
    seen: list[tuple[int, int]] = []
    hooks = ReplayHooks(on_start=lambda s: seen.append(
        (s.max_num_scheduled_tokens, s.max_num_running_reqs)))
    small = sim.replay(trace, "fcfs", hooks=hooks)
    large = sim.replay(trace, "fcfs", max_num_batched_tokens=8_192, max_num_seqs=8, hooks=hooks)
    assert seen == [(2_048, 256), (8_192, 8)]
    assert (small.settings["engine"]["steps"], large.settings["engine"]["steps"]) == (3, 1)
    assert large.requests[0].ttft_s < small.requests[0].ttft_s


def test_bench_help_names_the_engine_flags(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-num-batched-tokens N the engine's token budget per step" in text
    assert "--max-num-seqs N the engine's limit on running requests" in text


@pytest.mark.parametrize("bad", ["0", "-3", "many"])
def test_engine_flags_must_be_positive_integers(bad, capsys):
    with pytest.raises(SystemExit) as caught:
        cli.main(["bench", "--max-num-seqs", bad])
    assert caught.value.code == 2
    assert "must be an integer >= 1" in capsys.readouterr().err


def test_the_long_presets_replay_without_data(tmp_path):
    """Fresh clone: the shipped files alone (tests/conftest.py: FAIRWAY_DATA is empty)."""
    out = tmp_path / "o"
    code = cli.main(["bench", "--trace", "mooncake-long", "--trace", "hit-heavy-long", "--quick",
                     "--policy", "fcfs", "--workers", "0", "--max-num-batched-tokens", "8192",
                     "--out", str(out), "--no-progress"])
    assert code == 0
    for name in ("mooncake-long-quick", "hit-heavy-long-quick"):
        data = json.loads((out / "replays" / f"{name}--fcfs.json").read_text())
        assert all(r["error"] is None for r in data["requests"])
        assert data["settings"]["max_num_batched_tokens"] == 8192
    longest = max(r["prompt_tokens"] for r in json.loads(
        (out / "replays" / "mooncake-long-quick--fcfs.json").read_text())["requests"])
    assert 100_000 < longest <= CONTEXT
