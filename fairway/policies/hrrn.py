"""HRRN aged in prefill tokens (SGLang, 2026): waited work / remaining. Must not import vllm."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from fairway.policies.base import Policy, register_policy
from fairway.policies.queue import QueuedRequest


@register_policy("hrrn")
@dataclass(eq=False)
class HRRNPolicy(Policy):
    """Highest response ratio next, aged in prefill tokens: (T_now − T_seen) / c, highest first.

    Formula: priority_r = (T_now − T_seen_r) / max(c_r, 1), where T counts the prefill tokens the
    engine has computed (advanced by `on_step_end`), T_seen_r is T when this policy first saw r, and
    c = `remaining` (uncached tokens; always >= 1 here, so SGLang's "c <= 0 goes first" case cannot
    occur). This is textbook HRRN's (wait + service) / service minus the constant 1, with wait
    measured in work the engine did instead of seconds. Source: SGLang
    `python/sglang/srt/managers/schedule_policy.py` (`_sort_by_hrrn`, 2026 main).

    Choices:
        * T_seen is taken at the first `order()` call that contains the id (SGLang snapshots at
          arrival); the two agree when `order()` runs every step. A preempted request that comes
          back is a new sighting and starts aging from zero again.
        * ties (e.g. every request just seen, priority 0) by arrival, then queue position; SGLang
          breaks them by request id, which is arbitrary here.
        * SGLang's >128-waiting FCFS fallback and in-batch deferral are not reproduced (as for
          `lpm` by default).
        * `now` is ignored: wall-clock time does not age a request.


    Caller's contract: call `order()` every step with the whole waiting queue and `on_step_end`
    after every step with the prefill tokens computed (all requests, not decode tokens). Ids that
    leave the queue are forgotten at the next `order()` call.
    """

    needs_cache_hits: ClassVar[bool] = True
    stateful: ClassVar[bool] = True

    #: T: prefill tokens computed by the engine so far, as reported to `on_step_end`.
    prefill_tokens_total: int = field(default=0, init=False, repr=False)
    _seen: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def _memory(self) -> Mapping[str, int]:
        """T when each waiting id was first seen."""
        return self._seen

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """Return indices by (−(T − T_seen) / c, arrival)."""
        total = self.prefill_tokens_total
        known = self._seen
        seen = {r.request_id: known.get(r.request_id, total) for r in queue}
        self._seen = seen
        return sorted(
            range(len(queue)),
            key=lambda i: (
                -(total - seen[queue[i].request_id]) / queue[i].remaining,
                queue[i].arrival,
            ),
        )

    def on_step_end(
        self,
        admitted_ids: Sequence[str],
        prefill_tokens: int,
        prefill_by_request: Mapping[str, int] | None = None,
    ) -> None:
        """Age every waiting request by the prefill tokens computed in this step."""
        if prefill_tokens < 0:
            raise ValueError(f"prefill_tokens must be >= 0, got {prefill_tokens}")
        self.prefill_tokens_total += prefill_tokens
