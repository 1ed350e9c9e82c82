"""The running list and the step's knobs: the step plan's reads and writes.

Why: a Fairway step plan splits a contested step's prefill tokens between its lanes by setting
vLLM's per-request long-prefill cap (and, with a running chunked prefill, the request slots)
between steps. Checked on vLLM 0.32, 0.33 and 0.34 (`make matrix` runs the tests below on each).

Tests: the cap, the budget, the slots and the running prefills,
`tests/integration/test_selftest.py` (`_prefill_cap`) and
`tests/integration/test_share_property.py`; `decode_tokens_per_step`,
`tests/integration/test_spec_decode_cap.py`; `has_running_prefill`,
`tests/integration/test_idle_steps.py`; `prompt_tokens_left` (the queued-work gauge),
`tests/integration/test_queued_work.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fairway.policies.queue import PrefillingRequest
from fairway.vllm.internals.queues import vllm_config

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request


def running_requests(scheduler: Scheduler) -> list[Request]:
    """vLLM's RUNNING list itself (served first, in list order); callers may reorder it."""
    return scheduler.running  # vLLM internal: Scheduler.running (a list)


def chunked_prefill(scheduler: Scheduler) -> bool:
    """The share needs chunked prefill (a capped request continues in the next step)."""
    # vLLM internal: Scheduler.scheduler_config / SchedulerConfig.enable_chunked_prefill
    return bool(scheduler.scheduler_config.enable_chunked_prefill)


def token_budget(scheduler: Scheduler) -> int:
    """Tokens one step may schedule (`--max-num-batched-tokens`)."""
    return scheduler.max_num_scheduled_tokens  # vLLM internal: Scheduler.max_num_scheduled_tokens


def prefill_cap(scheduler: Scheduler) -> tuple[int, bool]:
    """(long_prefill_token_threshold, adaptive_long_prefill_threshold): the per-request cap of
    a step and whether vLLM may raise it (re-read at the start of every step)."""
    config = scheduler.scheduler_config  # vLLM internal: Scheduler.scheduler_config
    # vLLM internal: SchedulerConfig.long_prefill_token_threshold
    # vLLM internal: Scheduler.adaptive_long_prefill_threshold
    return config.long_prefill_token_threshold, scheduler.adaptive_long_prefill_threshold


def decode_tokens_per_step(scheduler: Scheduler) -> int:
    """The most tokens one running decode takes in a step: its sampled token plus the draft
    tokens of speculative decoding (`--speculative-config`'s `num_speculative_tokens`, 0
    without it; vLLM's `Scheduler.num_spec_tokens` is a copy of it)."""
    return 1 + int(vllm_config(scheduler).num_speculative_tokens)


def set_prefill_cap(scheduler: Scheduler, threshold: int, adaptive: bool) -> None:
    """Set what `prefill_cap` reads."""
    # vLLM internal: SchedulerConfig.long_prefill_token_threshold (re-read by every schedule())
    scheduler.scheduler_config.long_prefill_token_threshold = threshold
    # vLLM internal: Scheduler.adaptive_long_prefill_threshold
    scheduler.adaptive_long_prefill_threshold = adaptive


def active_limit(scheduler: Scheduler) -> int:
    """The request-slot limit vLLM's admission stops at."""
    return scheduler.max_num_active_reqs  # vLLM internal: Scheduler.max_num_active_reqs


def set_active_limit(scheduler: Scheduler, limit: int) -> None:
    """Set what `active_limit` reads."""
    scheduler.max_num_active_reqs = limit  # vLLM internal: Scheduler.max_num_active_reqs


def is_prefill_chunk(request: Request) -> bool:
    """vLLM's flag for a running request whose prompt is not computed yet."""
    return request.is_prefill_chunk  # vLLM internal: Request.is_prefill_chunk


def running_prefills(
    scheduler: Scheduler, classify: Callable[[Request], tuple[int, int]] | None = None
) -> tuple[list[PrefillingRequest], int]:
    """Views of the running requests still in prefill, and the tokens the other running ones
    (decodes) may take this step (one per request, more with placeholders or spec tokens).
    `classify`: request -> (tenant code, priority level) of each view (None: 0 and 0)."""
    views: list[PrefillingRequest] = []
    decode_tokens = 0
    view = PrefillingRequest
    for request in scheduler.running:  # vLLM internal: Scheduler.running
        # vLLM internal: Request.is_prefill_chunk (as `_in_prefill`, inlined: this runs for
        # every running request every step)
        num_tokens, computed = request.num_tokens, request.num_computed_tokens
        if request.is_prefill_chunk and num_tokens > computed:
            classes = classify(request) if classify is not None else (0, 0)
            views.append(
                view(request.request_id, request.arrival_time, num_tokens - computed, num_tokens,
                     *classes)
            )
        else:
            # vLLM internal: Request.num_tokens_with_spec / num_output_placeholders
            need = request.num_tokens_with_spec + request.num_output_placeholders - computed
            decode_tokens += need if need > 0 else 0
    return views, decode_tokens


def prompt_tokens_left(scheduler: Scheduler) -> int:
    """Prompt tokens the running requests have still to compute (their chunked prefills' rest;
    0 for a decoding request), from the requests' public fields."""
    total = 0
    for request in scheduler.running:  # vLLM internal: Scheduler.running
        left = request.num_prompt_tokens - request.num_computed_tokens
        if left > 0:
            total += left
    return total


def has_running_prefill(scheduler: Scheduler) -> bool:
    """Whether a running request is still in prefill (one `running_prefills` would list)."""
    return any(map(_in_prefill, scheduler.running))  # vLLM internal: Scheduler.running


def _in_prefill(request: Request) -> bool:
    """A running request whose prompt is not computed yet (a chunked prefill in progress)."""
    # vLLM internal: Request.is_prefill_chunk
    return request.is_prefill_chunk and request.num_tokens > request.num_computed_tokens
