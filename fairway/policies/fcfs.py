"""FCFS: the waiting queue in arrival order (vLLM's default). Must not import vllm."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fairway.policies.base import Policy, arrival_order, register_policy
from fairway.policies.queue import QueuedRequest


@register_policy("fcfs")
@dataclass(eq=False)
class FCFSPolicy(Policy):
    """First come, first served: ascending `arrival`, ties by position in the given queue.

    Source: vLLM's `FCFSRequestQueue` (append on arrival, pop from the head). This is the
    reference arm; it ignores prefix-cache hits and keeps no state.


    Caller's contract: none beyond `Policy`'s; `on_step_end` is a no-op. Note that vLLM prepends
    preempted requests to its deque, while this ordering places them by their (old) arrival time,
    which puts them ahead of every later arrival as well.
    """

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """Return indices by (arrival, queue position)."""
        return arrival_order(queue)
