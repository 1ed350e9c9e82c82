"""What the client of a request too large for the whole KV cache receives, on every supported
vLLM.

Fairway finishes such a request through vLLM's `grammar_compile_error_reqs` (what
`update_from_output` turns into a FINISHED_ERROR output without other state). In 0.32 it is a
set of ids and the error output carries no text, so Fairway puts the reason in its
`stop_reason`; from 0.33 it maps ids to vLLM's `RequestError`, which carries the reason to an
`AsyncLLM` client (the OpenAI server: HTTP 400 with the text). These tests follow it from the
engine core output through vLLM's msgpack wire format and output processor to what an `LLM` /
`AsyncLLM` caller gets, and record what vLLM's OpenAI server answers.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def _errors_carry_text() -> bool:
    """vLLM 0.33 and later: the error output has `error` (a `RequestError`)."""
    from vllm.v1.engine import EngineCoreOutput

    return "error" in EngineCoreOutput.__struct_fields__

#: 39 usable blocks of 16 tokens (624 tokens); 700 tokens need 44 blocks.
REASON = (
    "Fairway: the request needs 44 KV blocks (700 tokens, block size 16) but the KV cache has "
    "only 39 usable blocks, so it can never be scheduled. Send a shorter prompt, or raise the "
    "server's KV cache size."
)


def _huge_outputs(offline, helpers, async_scheduling):
    sched = offline.make_offline_scheduler(
        "fcfs", num_blocks=40, max_num_batched_tokens=2_048, async_scheduling=async_scheduling
    )
    sched.add_request(offline.make_request("huge", helpers.tokens(1, 700), 1.0))
    sched.add_request(offline.make_request("small", helpers.tokens(2_000, 50), 2.0))
    out, engine_outputs = offline.step(sched)
    assert set(out.num_scheduled_tokens) == {"small"}
    found = [o for outs in engine_outputs.values() for o in outs.outputs if o.request_id == "huge"]
    return sched, engine_outputs, found


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_error_output_says_why(offline, helpers, async_scheduling):
    from vllm.v1.engine import FinishReason

    sched, _, found = _huge_outputs(offline, helpers, async_scheduling)
    assert len(found) == 1
    output = found[0]
    assert output.finish_reason == FinishReason.ERROR and str(output.finish_reason) == "error"
    assert output.new_token_ids == []
    assert output.stop_reason == REASON
    if _errors_carry_text():
        assert (output.error.code, output.error.message) == ("validation_error", REASON)
    assert "huge" not in sched.requests and not sched.fairway_prepass.error_reasons
    offline.run_until_idle(sched)
    assert not sched.requests


def test_the_reason_reaches_the_completion_output(offline, helpers):
    """Engine core -> msgpack (the engine/front-end socket) -> vLLM's OutputProcessor: the
    `RequestOutput` an `LLM.generate` / `AsyncLLM.generate` caller gets."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    _, engine_outputs, _ = _huge_outputs(offline, helpers, False)
    (outputs,) = engine_outputs.values()  # one client
    wire = MsgpackEncoder().encode(outputs)
    received = MsgpackDecoder(EngineCoreOutputs).decode(wire)
    processor = OutputProcessor(tokenizer=None, log_stats=False)
    params = SamplingParams(
        max_tokens=1, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY
    )
    processor.add_request(
        EngineCoreRequest(
            request_id="huge", prompt_token_ids=helpers.tokens(1, 700), mm_features=None,
            sampling_params=params, pooling_params=None, arrival_time=1.0, lora_request=None,
            cache_salt=None, data_parallel_rank=None, external_req_id="huge",
        ),
        None,
    )
    processed = processor.process_outputs(
        [o for o in received.outputs if o.request_id == "huge"]
    )
    (request_output,) = processed.request_outputs
    assert request_output.finished
    (completion,) = request_output.outputs
    assert (completion.text, completion.finish_reason) == ("", "error")
    assert completion.stop_reason == REASON


def test_an_async_client_gets_the_reason_as_a_validation_error(offline, helpers):
    """0.33 and later: vLLM's output processor hands an `AsyncLLM` caller (the OpenAI server)
    the output's `RequestError` as an exception, which the server answers with HTTP 400 and the
    reason. 0.32: no such path (the error output carries no text)."""
    if not _errors_carry_text():
        pytest.skip("vLLM 0.32's error output carries no text (see the stop_reason tests)")
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    from vllm.exceptions import VLLMValidationError

    _, engine_outputs, found = _huge_outputs(offline, helpers, False)
    exc = found[0].error.to_exception()
    assert isinstance(exc, VLLMValidationError) and str(exc) == REASON
    answer = create_error_response(exc).model_dump()["error"]
    assert (answer["code"], answer["message"]) == (400, REASON)


def test_what_vllms_openai_server_answers_an_error_finish():
    """vLLM 0.32's OpenAI server turns finish_reason "error" into its fixed 500 text: the reason
    is not in the HTTP answer (it is in the server log, one line per request, and in the
    `stop_reason` above). A vLLM that changes this changes FAIRWAY.md's "A request that can
    never fit". (0.33 and later: the test above.)"""
    if _errors_carry_text():
        pytest.skip("from vLLM 0.33 the error carries its text (the test above)")
    from vllm.entrypoints.generate.base.serving import GenerateBaseServing
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    from vllm.exceptions import GenerationError

    with pytest.raises(GenerationError) as raised:
        GenerateBaseServing._raise_if_error(None, "error", "huge")  # self is unused
    assert raised.value.status_code == 500
    assert create_error_response(raised.value).model_dump() == {
        "error": {
            "message": "Internal server error",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
    }


def test_an_aborted_rejected_request_leaves_no_reason_behind(offline, helpers):
    """Aborted between the rejection and vLLM's update: no error output comes, and the pending
    reason is dropped once the request is gone."""
    from vllm.v1.request import RequestStatus

    sched = offline.make_offline_scheduler("fcfs", num_blocks=40, max_num_batched_tokens=2_048)
    sched.add_request(offline.make_request("huge", helpers.tokens(1, 700), 1.0))
    sched.add_request(offline.make_request("small", helpers.tokens(2_000, 50), 2.0))
    out = sched.schedule()
    assert sched.fairway_prepass.error_reasons == {"huge": REASON}
    sched.finish_requests("huge", RequestStatus.FINISHED_ABORTED)
    engine_outputs = sched.update_from_output(out, offline.fake_model_output(sched, out))
    assert "huge" not in offline.finished_ids(engine_outputs)
    offline.step(sched)
    assert sched.fairway_prepass.error_reasons == {}
    offline.run_until_idle(sched)
    assert not sched.requests
