"""TensorRT-LLM's shortest-uncached-first context scheduling, with its starvation guard. Must
not import vllm."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from fairway.policies.base import Policy, register_policy
from fairway.policies.queue import QueuedRequest


@register_policy("suf")
@dataclass(eq=False)
class SUFPolicy(Policy):
    """Fewest uncached prompt tokens first; a request passed over `starvation_iterations` times
    goes before all of them.

    Formula: starved requests (waited >= N iterations) first, by (arrival, queue position); then
    the others by (c, arrival, queue position), c = `remaining` (prompt tokens the reusable KV
    cache does not cover, >= 1). N = `starvation_iterations`; None (the default) has no starved
    requests: plain shortest-uncached-first.

    Source: TensorRT-LLM 1.4 (`tensorrt_llm.llmapi.SchedulerConfig`, first documented in
    1.4.0rc4): `context_scheduling_policy` = `fcfs` (its default) | `shortest_uncached_first`
    ("fewest prompt tokens not covered by reusable KV cache first"), and
    `context_starvation_iterations` (an int > 0, default None). Written from that
    documentation: the implementing source was not reachable here (1.2.1, the newest release on
    PyPI, predates it; the repository was not in the code index), so the three choices below
    are this module's reading, not TensorRT-LLM's code:
        * an iteration is one engine step; a request is passed over in every step it waits
          through without being started, whether or not another request started instead;
        * starved requests keep arrival order among themselves;
        * ties in c go to the earlier arrival.

    Where vLLM's queue differs: the rule orders vLLM's waiting queue; a prefill already started
    continues first in vLLM (TensorRT-LLM's context chunks of running requests are not
    reordered by it either, as far as its documentation says). A preempted request that comes
    back is a new request here and counts from zero.

    Caller's contract: call `order()` before every step with a waiting request
    (`orders_every_step`: a step in which no request can start counts as an iteration too) and
    `on_step_end` after it with the ids started in it. Ids that leave the queue are forgotten
    at the next `order()` call.
    """

    needs_cache_hits: ClassVar[bool] = True
    stateful: ClassVar[bool] = True
    orders_every_step: ClassVar[bool] = True

    #: Iterations (engine steps) a waiting request may be passed over before it goes first
    #: (an integer > 0); None: never (TensorRT-LLM's `context_starvation_iterations` default).
    starvation_iterations: int | None = None

    _waited: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        """Validate the parameters (ValueError naming the parameter and its allowed range)."""
        n = self.starvation_iterations
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"starvation_iterations must be None or an integer >= 1, got {n!r}")

    def _memory(self) -> Mapping[str, int]:
        """Iterations each waiting id has been passed over."""
        return self._waited

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """Starved requests by arrival, then the rest by (c, arrival); ties by queue position."""
        known = self._waited
        waited = {r.request_id: known.get(r.request_id, 0) for r in queue}
        self._waited = waited
        limit = self.starvation_iterations
        starved = [] if limit is None else [
            i for i, r in enumerate(queue) if waited[r.request_id] >= limit
        ]
        taken = set(starved)
        rest = [i for i in range(len(queue)) if i not in taken]
        starved.sort(key=lambda i: queue[i].arrival)  # stable: ties keep queue position
        rest.sort(key=lambda i: (queue[i].remaining, queue[i].arrival))
        return starved + rest

    def on_step_end(
        self,
        admitted_ids: Sequence[str],
        prefill_tokens: int,
        prefill_by_request: Mapping[str, int] | None = None,
    ) -> None:
        """Count one more iteration for every waiting request the step did not start."""
        started = set(admitted_ids)
        for request_id in self._waited:
            if request_id not in started:
                self._waited[request_id] += 1
