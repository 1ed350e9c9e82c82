"""SGLang's HRRN as merged: response ratio on a token clock, FCFS above 128 waiting.

This module must not import vllm."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from fairway.policies.base import Policy, register_policy
from fairway.policies.queue import QueuedRequest

logger = logging.getLogger(__name__)

#: SGLang sorts (HRRN, LPM) only while at most this many requests wait; above it the queue keeps
#: its order (`SchedulePolicy._determine_active_policy`: `len(waiting_queue) > 128`). A constant
#: in SGLang, with no option to change it: a constant here.
SORT_LIMIT = 128


@register_policy("hrrn")
@dataclass(eq=False)
class HRRNPolicy(Policy):
    """Highest response ratio next on a token clock: (T_now − T_seen) / c, highest first, and no
    reordering at all while more than 128 requests wait.

    Formula: priority_r = (T_now − T_seen_r) / c_r, where T counts the prefill tokens the engine
    has computed (advanced by `on_step_end`), T_seen_r is T when r entered the queue and
    c_r = `remaining` (uncached tokens, >= 1). It is textbook HRRN's (wait + service) / service
    minus the constant 1, with the wait measured in work the engine did instead of seconds.

    Source: SGLang, PR #32911; `python/sglang/srt/managers/schedule_policy.py`,
    `SchedulePolicy._sort_by_hrrn` (the key) and `_determine_active_policy` (the fallback), and
    `scheduler.py`'s `processed_tokens_counter` (the clock: each forward batch's
    `extend_num_tokens`, snapshotted into `req.arrival_processed_tokens` when a request enters
    the waiting queue); read at commit 00550cd1 (2026 main).

    The rule, as SGLang's:
        * more than `SORT_LIMIT` (128) waiting requests (so 129 and up): the queue keeps its
          current order: vLLM's deque as the last step left it, new arrivals at its end. This is
          SGLang's "FCFS" fallback, which skips the sort of its persistent list; it is not
          arrival order. SGLang has no option for it, so neither has this policy; such steps
          are counted in `num_unsorted_steps`;
        * otherwise by −(T_now − T_seen) / c, ties by request id (SGLang's `(-ratio, rid)`).

    Where vLLM's queue differs:
        * c counts the prompt and, for a preempted request, its output so far; SGLang's
          `_uncached_len` counts the original prompt only, so there a retracted request whose
          cached prefix covers its prompt has c <= 0 and goes first ("no prefill work; drain
          immediately"). Here c >= 1 (vLLM recomputes at least the last token) and no request
          takes that path;
        * T_seen is taken when this policy first sees the request, which is the step after it
          arrived (`orders_every_step`: the policy is asked at every step with a waiting request,
          so no step's tokens are missed); a preempted request that comes back starts from
          zero again, as SGLang re-snapshots a requeued request;
        * ties by request id are arbitrary but deterministic, as in SGLang (its ids are random
          too); equal ratios are common only among requests that arrived since the last step
          (ratio 0);
        * the queue length counts the rows this policy orders; requests vLLM keeps ahead of them
          (preempted ones) are not counted;
        * SGLang's in-batch prefix deferral (cold requests sharing >= 32 tokens with an earlier
          cold one go last for a step) is not reproduced, as for `lpm`: all arms or none.

    Caller's contract: call `order()` before every step with a waiting request and `on_step_end`
    after it with the prefill tokens computed in that step (all requests, not decode tokens).
    Ids that leave the queue are forgotten at the next `order()` call.
    """

    needs_cache_hits: ClassVar[bool] = True
    stateful: ClassVar[bool] = True
    orders_every_step: ClassVar[bool] = True

    #: T: prefill tokens computed by the engine so far, as reported to `on_step_end`.
    prefill_tokens_total: int = field(default=0, init=False, repr=False)
    #: How many `order()` calls kept the queue's order because more than 128 requests waited.
    num_unsorted_steps: int = field(default=0, init=False, repr=False)
    _seen: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def _memory(self) -> Mapping[str, int]:
        """T when each waiting id was first seen."""
        return self._seen

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """Indices by (−(T − T_seen) / c, request id); the queue's order above 128 waiting."""
        total = self.prefill_tokens_total
        known = self._seen
        seen = {r.request_id: known.get(r.request_id, total) for r in queue}
        self._seen = seen
        if len(queue) > SORT_LIMIT:
            self.num_unsorted_steps += 1
            logger.debug("hrrn: %d waiting > %d, order kept", len(queue), SORT_LIMIT)
            return list(range(len(queue)))
        return sorted(
            range(len(queue)),
            key=lambda i: (
                -(total - seen[queue[i].request_id]) / queue[i].remaining,
                queue[i].request_id,
            ),
        )

    def on_step_end(
        self,
        admitted_ids: Sequence[str],
        prefill_tokens: int,
        prefill_by_request: Mapping[str, int] | None = None,
    ) -> None:
        """Advance the clock by the prefill tokens computed in this step."""
        if prefill_tokens < 0:
            raise ValueError(f"prefill_tokens must be >= 0, got {prefill_tokens}")
        self.prefill_tokens_total += prefill_tokens
