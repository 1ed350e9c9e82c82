"""NVIDIA Dynamo's router queue ordered by WSPT (weighted shortest processing time).

This module must not import vllm."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from fairway.policies.base import Policy, register_policy
from fairway.policies.queue import Ordering, QueueColumns, QueuedRequest, Step


@register_policy("wspt")
@dataclass(eq=False)
class WSPTPolicy(Policy):
    """Highest weight / cost first, the cost being the uncached tokens seen when the request
    arrived.

    Formula: score_r = (1 + max(0, priority_jump_r)) / cost_r, highest first, with
    cost_r = max(1, ISL_r − cached_r) taken once, when the request enters the queue (here: when
    this policy first sees it with its cached prefix looked up); ties by the earlier arrival,
    then queue position (Dynamo's enqueue sequence). vLLM requests carry no priority jump, so
    the weight is 1 and the order is the cost ascending.

    Source: NVIDIA Dynamo, the KV router's pending queue (`--router-queue-policy wspt`),
    `lib/kv-router/src/scheduling/policy_queue.rs` (read at 0bebf6de and a later 2026-09 main):
    `QueueSnapshot::new` gives `scheduling_cost_tokens = max(1, raw_isl_tokens − cached_tokens)`,
    `PolicyQueue::enqueue` "captures the immutable scheduling key" with the WSPT score above,
    and `cmp_queue_order` orders by (strict priority, due time, score, enqueue sequence); flow
    control PRs #14123/#14176 (design DEP #13891), the documented formula in docs PR #12635.

    Where vLLM's queue differs:
        * Dynamo orders the router's queue, which holds requests only while every worker is
          above `--router-queue-threshold`; here the rule orders one engine's waiting queue at
          every step;
        * the key is fixed at enqueue in Dynamo ("the immutable scheduling key"), with the
          router's overlap estimate on its chosen worker as `cached`. Here `cached` is the
          engine's own hit at first sight; a hit not looked up yet (`QueueColumns.unprobed`) is
          not frozen, the key is fixed at the first step that has it. A preempted request that
          comes back is a new request;
        * Dynamo's strict-priority tiers and due times come before the score: under vLLM's
          priority scheduling Fairway keeps the levels first (each level in this order); no
          request has a due time;
        * Dynamo's deficit round robin across policy classes is not reproduced (one class).

    Caller's contract: call `ordering()` (or `order()`) before every step with a waiting request
    (`orders_every_step`: the first sight is the step after arrival); `on_step_end` is a no-op.
    Ids that leave the queue are forgotten at the next call.
    """

    needs_cache_hits: ClassVar[bool] = True
    stateful: ClassVar[bool] = True
    orders_every_step: ClassVar[bool] = True

    _cost: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def _memory(self) -> Mapping[str, int]:
        """The cost each waiting id was given when first seen."""
        return self._cost

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """Indices by (−1 / cost, arrival, queue position); every hit counts as looked up."""
        return self._rank(queue, None)

    def ordering(self, queue: QueueColumns, step: Step) -> Ordering:
        """`order()` on the views, freezing no cost whose hit is not looked up yet."""
        unprobed = queue.unprobed
        return Ordering(self._rank(queue.views(), None if unprobed is None else unprobed.tolist()))

    def _rank(self, queue: Sequence[QueuedRequest], unprobed: Sequence[bool] | None) -> list[int]:
        known = self._cost
        cost: dict[str, int] = {}
        for i, r in enumerate(queue):
            frozen = known.get(r.request_id)
            if frozen is not None:
                cost[r.request_id] = frozen
            elif unprobed is None or not unprobed[i]:
                cost[r.request_id] = r.remaining
        self._cost = cost
        weight = 1.0  # 1 + max(0, priority_jump); vLLM requests have none
        return sorted(
            range(len(queue)),
            key=lambda i: (
                -weight / cost.get(queue[i].request_id, queue[i].remaining),
                queue[i].arrival,
            ),
        )
