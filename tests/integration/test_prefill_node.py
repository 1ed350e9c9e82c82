"""Fairway on a disaggregated prefill node, and under Ray tensor parallelism (scheduler side, CPU).

The P node runs vLLM with `--kv-transfer-config '{"kv_connector":"NixlConnector",
"kv_role":"kv_producer"}'`; the proxy sends `max_tokens=1` and `kv_transfer_params=
{"do_remote_decode": true}`. The connector's scheduler half lives in vLLM's `Scheduler.__init__`,
so Fairway's subclass inherits it: requests finish after one token, hand back
`kv_transfer_params` for the decoder, and keep their blocks until the decoder has read them. The
NIXL transfer itself (worker side, RDMA) needs GPUs and the `nixl` package and is not run here.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

PRODUCER = {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
REMOTE_DECODE = {"kv_transfer_params": {"do_remote_decode": True}}
T0 = 1_000.0
NUM_BLOCKS = 3_000
PREFIX = list(range(1_000, 7_000))  # 6,000 tokens: the worked example's shared document


def _p_node(offline, **kwargs):
    return offline.make_offline_scheduler(
        "fairway", kv_transfer_config=PRODUCER, num_blocks=NUM_BLOCKS, max_num_seqs=16, **kwargs
    )


def _remote_decode_request(offline, request_id, tokens, arrival):
    return offline.make_request(request_id, tokens, arrival, max_tokens=1, extra_args=REMOTE_DECODE)


def _free_blocks(scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def _finished(engine_outputs) -> dict:
    """{request id: EngineCoreOutput} of the requests that finished in these outputs."""
    return {
        out.request_id: out
        for client_outputs in engine_outputs.values()
        for out in client_outputs.outputs
        if out.finish_reason is not None
    }


def _run_until_finished(offline, scheduler, ids, max_steps=50, finished=None):
    """Step until every id has finished; returns {id: EngineCoreOutput} of the finish."""
    finished = dict(finished or {})
    for _ in range(max_steps):
        if set(ids) <= set(finished):
            return finished
        finished |= _finished(offline.step(scheduler)[1])
    if set(ids) <= set(finished):
        return finished
    raise AssertionError(f"not finished after {max_steps} steps: {set(ids) - set(finished)}")


def test_fairway_builds_with_the_nixl_producer(offline) -> None:
    sched = _p_node(offline)
    assert type(sched).__name__ == "FairwayScheduler"
    # NixlConnector is the pull flavour by default (NixlPullConnector) in 0.32/0.33.
    assert type(sched.connector).__name__.startswith("Nixl")  # vLLM internal: Scheduler.connector
    assert sched.fairway_options.policy == "fairway"


def test_prefill_requests_hand_over_their_kv(offline, helpers) -> None:
    sched = _p_node(offline)
    free_before = _free_blocks(sched)
    ids = ["a", "b", "c"]
    for k, rid in enumerate(ids):
        sched.add_request(
            _remote_decode_request(offline, rid, helpers.tokens(10_000 * (k + 1), 700), T0 + k)
        )
    finished = _run_until_finished(offline, sched, ids)

    for rid in ids:
        out = finished[rid]
        assert out.new_token_ids == [7]  # one token, then the request is done on P
        assert str(out.finish_reason) in ("length", "FinishReason.LENGTH")
        params = out.kv_transfer_params
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert params["remote_block_ids"] and params["remote_engine_id"]
        assert sched.requests[rid].is_finished()  # kept until the decoder has read the blocks
    held = free_before - _free_blocks(sched)
    assert held >= 3 * (700 // 16)  # every full block of the three prompts is still held
    assert not sched.waiting and not sched.running
    helpers.check_queues(sched)

    # The decoder reads: the worker reports the send as finished and the blocks come back.
    from vllm.v1.outputs import KVConnectorOutput

    output = sched.schedule()
    model_output = offline.fake_model_output(sched, output)
    model_output.kv_connector_output = KVConnectorOutput(finished_sending=set(ids))
    sched.update_from_output(output, model_output)
    assert not set(ids) & set(sched.requests)
    assert _free_blocks(sched) == free_before


def test_worked_example_order_holds_under_the_connector(offline, helpers) -> None:
    """Five hits of 300 uncached tokens and an older 6,000-token miss: hits first, then M/4."""
    sched = _p_node(offline)
    sched.add_request(_remote_decode_request(offline, "S", PREFIX, T0))
    _run_until_finished(offline, sched, ["S"])  # S's blocks are held for the decoder ...
    sched.add_request(_remote_decode_request(offline, "M", helpers.tokens(50_000, 6_000), T0 + 1))
    for i in range(1, 6):
        prompt = PREFIX + helpers.tokens(60_000 + 1_000 * i, 300)
        sched.add_request(_remote_decode_request(offline, f"H{i}", prompt, T0 + 1 + 0.001 * i))
    sched.fairway_clock = lambda: T0 + 1.01
    # ... and still count as cached prefix for the hits.
    assert sched.fairway_mirror.fresh_cached_tokens(sched.requests["H1"]) == 6_000

    out, outputs = offline.step(sched)

    assert out.num_scheduled_tokens == {
        "H1": 300, "H2": 300, "H3": 300, "H4": 300, "H5": 300, "M": 548,
    }  # fmt: skip
    assert sched.fairway_last_ordering.lanes == ["fast"] * 5 + ["fair"]
    # Self-calibration reads the same step from vLLM's real SchedulerOutput: (tokens, context).
    from fairway.vllm.internals import step_chunks

    assert sorted(step_chunks(out)) == [(300, 6_000)] * 5 + [(548, 0)]
    assert set(_finished(outputs)) == {"H1", "H2", "H3", "H4", "H5"}  # hits done in one step
    finished = _run_until_finished(
        offline, sched, ["M", "H1", "H2", "H3", "H4", "H5"], finished=_finished(outputs)
    )
    assert all(o.kv_transfer_params["do_remote_prefill"] for o in finished.values())
    assert sched.fairway_totals.policy_fallbacks == 0


# --- tensor parallel on Ray -----------------------------------------------------------------------


def test_scheduler_class_resolves_from_its_name() -> None:
    """What `--scheduler-cls` does in EngineCore; the executor (mp, ray) plays no part in it."""
    from vllm.config import SchedulerConfig

    from fairway.vllm.scheduler import FairwayAsyncScheduler, FairwayScheduler

    for name, cls in (
        ("fairway.vllm.scheduler.FairwayScheduler", FairwayScheduler),
        ("fairway.vllm.FairwayScheduler", FairwayScheduler),
        ("fairway.vllm.scheduler.FairwayAsyncScheduler", FairwayAsyncScheduler),
    ):
        config = SchedulerConfig(max_model_len=4096, is_encoder_decoder=False, scheduler_cls=name)
        assert config.get_scheduler_cls() is cls


def test_ray_tensor_parallel_config_passes_fairway_checks(offline) -> None:
    """A TP=2 Ray config: the scheduler class and Fairway's start-up checks are unaffected."""
    pytest.importorskip("ray")
    from vllm.config import ParallelConfig, VllmConfig

    from fairway.options import FairwayOptions
    from fairway.vllm.scheduler import FairwayScheduler, check_engine_config

    parallel = ParallelConfig(distributed_executor_backend="ray", tensor_parallel_size=2)
    assert parallel.distributed_executor_backend == "ray" and parallel.world_size == 2
    base = _p_node(offline).vllm_config
    config = VllmConfig(
        model_config=base.model_config,
        cache_config=base.cache_config,
        scheduler_config=base.scheduler_config,
        parallel_config=parallel,
        kv_transfer_config=base.kv_transfer_config,
        additional_config=base.additional_config,
    )
    config.scheduler_config.scheduler_cls = "fairway.vllm.scheduler.FairwayScheduler"
    assert config.scheduler_config.get_scheduler_cls() is FairwayScheduler
    options = FairwayOptions.from_vllm_config(config)
    check_engine_config(config, options, options.build_policy())  # raises on a bad config
