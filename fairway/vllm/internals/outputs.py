"""A step's output, the model runner's answer, and the errors vLLM reports for a request.

Why: Fairway learns from `schedule()`'s output which requests a step started and how many
prompt tokens each took (lanes' charges, metrics, the step timer), answers the offline replay's
steps as a model runner would, and finishes a request it refuses (a prompt the KV cache can never
hold) with vLLM's own error output. Checked on vLLM 0.32, 0.33 and 0.34 (`make matrix` runs the
tests below on each); a reading that differs by release names them.

Tests: `started_ids`, `resumed_ids`, `scheduled_tokens`, `model_runner_output` and the request
errors (`report_request_error`, `error_message`), `tests/integration/test_selftest.py`
(`_queue_order`, `_resumed`, `_request_error`; `OLD_READINGS` for each pre-0.33/0.34 reading)
and `tests/integration/test_oversized_error.py` (`explain_errors`); `step_chunks`,
`tests/integration/test_prefill_node.py`; `scheduled_spans`, `tests/integration/test_sim.py`;
`new_requests` and `reported_ids`, `tests/integration/test_metrics_plugin.py`;
`prefill_by_request` and `prefill_tokens`, `tests/integration/test_tenant_metrics.py` and
`tests/integration/test_share_property.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from fairway.vllm.internals.versions import shape

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request


def scheduled_tokens(output: SchedulerOutput) -> Mapping[str, int]:
    """Tokens scheduled per request id in one step."""
    return output.num_scheduled_tokens


def started_ids(output: SchedulerOutput) -> list[str]:
    """Ids of the requests a step took from the waiting queue: new ones and resumed ones, without
    the running ones' decodes."""
    return [*(data.req_id for data in output.scheduled_new_reqs), *resumed_ids(output)]


def new_requests(scheduler: Any, output: SchedulerOutput) -> list[tuple[str, Request, int]]:
    """(id, request, cached tokens at admission) of each new request of a step that the scheduler
    still holds; the count is vLLM's `num_computed_tokens` of the new-request data."""
    requests = scheduler.requests  # vLLM internal: Scheduler.requests
    return [
        (data.req_id, requests[data.req_id], data.num_computed_tokens)
        for data in output.scheduled_new_reqs
        if data.req_id in requests
    ]


def resumed_ids(output: SchedulerOutput) -> Iterable[str]:
    """Ids of the preempted requests a step resumed that are not among its new requests.

    0.32 and 0.33 list them apart (`CachedRequestData.resumed_req_ids`); from 0.34 a resumed
    request comes in `scheduled_new_reqs` with the new ones, so none is apart.
    """
    if shape().resumed_apart:
        # vLLM internal: CachedRequestData.resumed_req_ids (0.32, 0.33)
        return output.scheduled_cached_reqs.resumed_req_ids
    return ()


def model_runner_output(
    req_ids: list[str], sampled_token_ids: list[list[int]]
) -> ModelRunnerOutput:
    """A model runner's answer with these sampled tokens (the offline replay's fake model).

    0.32 and 0.33 also want `req_id_to_index` (each id's row), which 0.34 removed.
    """
    from vllm.v1.outputs import ModelRunnerOutput

    rows: dict[str, Any] = {}
    if shape().runner_output_index:
        # vLLM internal: ModelRunnerOutput.req_id_to_index (0.32, 0.33)
        rows["req_id_to_index"] = {req_id: i for i, req_id in enumerate(req_ids)}
    return ModelRunnerOutput(
        req_ids=req_ids,
        sampled_token_ids=sampled_token_ids,
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
        **rows,
    )


def reported_ids(result: Any, limit: int) -> list[str] | None:
    """Ids of the requests in `update_from_output`'s result (a dict of client index ->
    `EngineCoreOutputs`, whose `outputs` carry `request_id`); None if it is not a dict (a
    caller's stand-in) or names more than `limit` of them (then checking the pending requests
    costs less)."""
    if not isinstance(result, dict):
        return None
    ids: list[str] = []
    for outputs in result.values():
        items = outputs.outputs  # EngineCoreOutputs.outputs: a list (public)
        if len(ids) + len(items) > limit:
            return None
        ids += [item.request_id for item in items]
    return ids


def step_chunks(scheduler_output: Any) -> list[tuple[int, int]]:
    """(new_tokens, computed_before) per request of a vLLM `SchedulerOutput` (read-only).

    `num_computed_tokens` in the output is the value before this step: vLLM builds the request
    data before it advances the counters (`_update_after_schedule`).
    """
    scheduled: Mapping[str, int] = scheduler_output.num_scheduled_tokens
    chunks = [
        (scheduled.get(req.req_id, 0), req.num_computed_tokens)
        for req in scheduler_output.scheduled_new_reqs
    ]
    cached = scheduler_output.scheduled_cached_reqs
    chunks += [
        (scheduled.get(req_id, 0), computed)
        for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=False)
    ]
    return [(n, p) for n, p in chunks if n > 0]


def prefill_tokens(scheduler: Scheduler, output: SchedulerOutput) -> int:
    """Tokens of this step that computed prompt positions (prefill), summed over requests.

    Called after `schedule()`, when vLLM has already advanced `num_computed_tokens` by the
    scheduled count: a request was prefilling if it started the step below its prompt length.
    A resumed preempted request recomputes prompt + earlier output, all of it counted.
    """
    requests = scheduler.requests  # vLLM internal: Scheduler.requests
    total = 0
    for req_id, n in output.num_scheduled_tokens.items():
        request = requests.get(req_id)
        # vLLM internal: schedule() advances Request.num_computed_tokens before it returns
        if request is not None and request.num_computed_tokens - n < request.num_prompt_tokens:
            total += n
    return total


def scheduled_spans(
    scheduler: Scheduler, scheduled: Mapping[str, int]
) -> dict[str, tuple[int, int, int]]:
    """request id -> (start, end, prompt tokens) of the positions each request computes this step.

    Read after `schedule()`, which has already advanced `num_computed_tokens` by the scheduled
    count, so the span is [computed - n, computed). Used by the virtual replay's cost model.
    """
    requests = scheduler.requests  # vLLM internal: Scheduler.requests
    spans = {}
    for request_id, n in scheduled.items():
        request = requests[request_id]
        # vLLM internal: schedule() advances Request.num_computed_tokens before it returns
        end = request.num_computed_tokens
        spans[request_id] = (end - n, end, request.num_prompt_tokens)
    return spans


def prefill_by_request(scheduler: Scheduler, output: SchedulerOutput) -> dict[str, int]:
    """Prompt tokens scheduled per request in `output` (read right after `schedule()`)."""
    requests: Mapping[str, Request] = scheduler.requests  # vLLM internal: Scheduler.requests
    result: dict[str, int] = {}
    for request_id, n in output.num_scheduled_tokens.items():
        request = requests.get(request_id)
        if request is None:
            continue
        # vLLM internal: schedule() advances Request.num_computed_tokens before it returns
        start = request.num_computed_tokens - n
        prompt = max(request.num_prompt_tokens, request.num_tokens - 1)
        if start < prompt:
            result[request_id] = min(n, prompt - start)
    return result


# --- request errors -------------------------------------------------------------------------------


def report_request_error(scheduler: Scheduler, request_id: str, reason: str) -> None:
    """Have vLLM finish a waiting request with FINISHED_ERROR at the next `update_from_output`.

    vLLM finishes a waiting request with an error output delivered to its client only from
    `update_from_output`, via what it drains there; `grammar_compile_error_reqs` is the one that
    needs no other state. 0.32 keeps a set of ids, and its error output carries no text
    (`explain_errors` adds `reason` as its `stop_reason`). From 0.33 it maps each id to a
    `RequestError`, vLLM's type for a request-level error: an `AsyncLLM` client (the OpenAI
    server) gets `reason` as a validation error.
    """
    # vLLM internal: Scheduler.grammar_compile_error_reqs (a set of ids in 0.32, a dict of
    # RequestError since 0.33; `check_internals` refuses anything else at start-up)
    errors = scheduler.grammar_compile_error_reqs
    if isinstance(errors, dict):
        from vllm.outputs import RequestError

        errors[request_id] = RequestError(code="validation_error", message=reason)
    else:
        errors.add(request_id)


def explain_errors(result: Any, reasons: dict[str, str]) -> None:
    """Put `reasons[request_id]` in the `stop_reason` of that request's error output in
    `update_from_output`'s result (client index -> `EngineCoreOutputs`); each reason given is
    removed from `reasons`.

    0.32 has no field for an error's text on a generation request: the error output
    `update_from_output` builds for a `report_request_error` request carries `finish_reason`
    ERROR and nothing else, and its output processor copies `stop_reason` into the client's
    `CompletionOutput.stop_reason`; vLLM's OpenAI server answers every "error" finish with HTTP
    500 "Internal server error". From 0.33 the output's `error` carries the text to an
    `AsyncLLM` client; an `LLM.generate` caller still reads it in `stop_reason`.
    """
    from vllm.v1.engine import FinishReason

    if not isinstance(result, dict):
        return
    for outputs in result.values():
        for item in outputs.outputs:
            if item.finish_reason == FinishReason.ERROR and item.request_id in reasons:
                # vLLM internal: EngineCoreOutput.stop_reason of an error output (vLLM leaves
                # it None; the output processor forwards it to CompletionOutput.stop_reason)
                item.stop_reason = reasons.pop(item.request_id)


def error_message(output: Any) -> str | None:
    """The text of an error output (`EngineCoreOutput.error`, a `RequestError`, 0.33 and 0.34);
    None when it carries none, and always on 0.32, whose outputs have no such field.

    Why: the self-test checks that `report_request_error`'s reason reaches the client where the
    release carries one (`tests/integration/test_selftest.py`, `_request_error`).
    """
    if not shape().output_error:
        return None  # 0.32: no field (`explain_errors` puts the text in `stop_reason`)
    # vLLM internal: EngineCoreOutput.error (0.33, 0.34; no default: the field is declared)
    error = getattr(output, "error")  # noqa: B009 (0.32's type lacks it)
    return None if error is None else str(error.message)
