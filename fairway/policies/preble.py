"""Preble-local: Preble's fcfs-mpq fair queue over 10 cache-hit-ratio groups. Must not import vllm.

Only the per-GPU queue; Preble's global (multi-GPU routing) scheduler is out of scope.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from fairway.policies.base import Policy, register_policy
from fairway.policies.queue import QueuedRequest


@register_policy("preble")
@dataclass(eq=False)
class PreblePolicy(Policy):
    """Preble-local fcfs-mpq: one cache-hit-ratio group per step, cycling downward, with a quota.

    Source: Srivatsa et al., "Preble", arXiv 2407.00023 (ICLR 2025); rule read from the code,
    `WukLab/preble` `python/sglang/srt/managers/router/model_rpc.py` (`get_new_fill_batch_v2`,
    `get_schedule_group`), heuristic `fcfs-mpq`.

    Rule:
        * groups: a request is bucketed once, when this policy first sees its id, by its hit
          ratio h/L at that moment: g = 0 if h == 0 else ceil(10·h/L) − 1, so (0, 0.1] → 0 and
          (0.9, 1] → 9. It keeps that group while it waits, even if its hit changes (as in the
          code). Computed in integers (exact at the band edges); L = 0 counts as ratio 0.
        * rotation: a pointer starts at 9; every `order()` call on a non-empty queue takes the
          first non-empty group G walking down cyclically from the pointer (9, 8, ..., 0, 9, ...)
          and sets the pointer to (G − 1) mod 10. The pointer advances per call (= per step), as
          in the code, whether or not group G's requests are then admitted.
        * quota: (G + 1)·k requests of group G, oldest first (arrival, then queue position).

    Deviation (a permutation cannot make requests non-admissible): Preble admits only group G's
    quota in a step and nothing else. Here the order is group G's first (G + 1)·k requests, then
    the other groups in the order the rotation will visit them next ((G − 1), (G − 2), ... mod 10),
    then the members of G past the quota last (G is the last group the rotation comes back to),
    each part by arrival. So the quota still decides which of G's requests go first, and what
    follows is only admitted when budget is left over after G's quota, in the order Preble's next
    steps would serve it. (Placing G's overflow right after its quota instead would make the quota
    a no-op for the order.) Preble's skip-and-continue within G is not reproduced: the engine's
    admission loop (vLLM: break on the first request that does not fit) applies to every arm.

    Args:
        k: quota unit, >= 1 (Preble hard-codes 10); the number of groups is fixed at 10.

    Caller's contract: call `order()` once per scheduling step with the whole waiting queue.
    State (group of each id, pointer) is pruned to the ids in the queue at every call, so ids that
    leave (admitted, aborted) are forgotten and memory stays bounded; a preempted request that comes
    back is bucketed again. `on_step_end` is a no-op.
    """

    needs_cache_hits: ClassVar[bool] = True
    stateful: ClassVar[bool] = True
    #: Number of hit-ratio groups (hard-coded in Preble).
    NUM_GROUPS: ClassVar[int] = 10

    #: Quota unit: group g may take the first (g + 1)·k places of a step (>= 1).
    k: int = 10

    #: Where the next `order()` call starts looking for a non-empty group.
    pointer: int = field(default=9, init=False, repr=False)
    _group: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        """Validate the parameters (ValueError naming the parameter and its allowed range)."""
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k must be an integer >= 1, got {self.k!r}")

    @classmethod
    def group_of(cls, request: QueuedRequest) -> int:
        """Return the hit-ratio group, 0..9, of a request with its current hit."""
        h, length = request.cached_tokens, request.prompt_tokens
        if h == 0 or length == 0:
            return 0
        return -(-cls.NUM_GROUPS * h // length) - 1  # ceil(10·h/L) − 1, exactly

    def _memory(self) -> Mapping[str, int]:
        """The group each waiting id was given."""
        return self._group

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """Return G's quota, then the other groups in rotation order, then G's overflow."""
        num_groups = self.NUM_GROUPS
        known = self._group
        groups: list[list[int]] = [[] for _ in range(num_groups)]
        current: dict[str, int] = {}
        for i, r in enumerate(queue):
            g = known.get(r.request_id)
            if g is None:
                g = self.group_of(r)
            current[r.request_id] = g
            groups[g].append(i)
        self._group = current
        if not queue:
            return []
        chosen = next(
            g
            for g in ((self.pointer - step) % num_groups for step in range(num_groups))
            if groups[g]
        )
        self.pointer = (chosen - 1) % num_groups
        quota = (chosen + 1) * self.k
        result: list[int] = []
        for step in range(num_groups):
            members = groups[(chosen - step) % num_groups]
            members.sort(key=lambda i: queue[i].arrival)  # stable: ties keep queue position
            result.extend(members[:quota] if step == 0 else members)
        result.extend(groups[chosen][quota:])
        return result
