"""Longest-prefix-match orderings: SGLang's LPM and k-LPM (Dexter et al.). Must not import vllm.

Both rank by `cached_tokens` (h, absolute tokens, not the cached fraction).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fairway.policies.base import Policy, arrival_order, register_policy
from fairway.policies.queue import Ordering, QueueColumns, QueuedRequest, Step, TicketState

logger = logging.getLogger(__name__)


@register_policy("lpm")
@dataclass(eq=False)
class LPMPolicy(Policy):
    """SGLang LPM: longest cached prefix first, a stable sort on −h over a persistent list.

    Formula: sort key −h_r (h = `cached_tokens`, absolute tokens), ascending, stable.
    Source: SGLang `python/sglang/srt/managers/schedule_policy.py` (`calc_priority`, policy
    `lpm`).

    Tie-break (choice): "stable" means what it means in SGLang, whose waiting queue is a
    persistent Python list sorted in place every step: equal hits keep the order this policy
    returned at its previous call. Requests not seen at the previous call (new arrivals, and
    preempted requests coming back) are appended after all known ones, by (arrival, queue
    position). So among equal hits the older request usually wins, but not always: a request
    that an earlier sort put behind a younger one (because its hit was smaller then) stays behind
    it when their hits become equal. This is SGLang's behaviour, and it differs from the
    vllm-ascend port, which breaks ties by arrival.

    Args:
        max_queue_for_sort: SGLang switches LPM off (no reordering at all, *not* arrival order)
            when more than 128 requests wait, to bound the cost of prefix matching. None (the
            default) never switches off, which is the idealised LPM; set 128 to reproduce SGLang
            exactly. Above the cap the previous order is kept, with new requests appended as
            above, and `num_unsorted_steps` counts such calls.

    Deliberate omission: SGLang's in-batch prefix caching (cold requests sharing >= 32 tokens with
    an earlier cold one are deferred to the end for one step) is not implemented, because no other
    arm has it (k-LPM's and RAGCache's papers describe none): all arms or none.

    Caller's contract: call `order()` once per step with the whole waiting queue and apply the
    returned order; the remembered order is forgotten for ids that leave the queue, so memory is
    bounded by the queue length. `on_step_end` is not needed. `ordering()` is the same rule
    over numpy columns (what the scheduler calls): the remembered order lives in an array indexed
    by `QueueColumns.tickets`, and `QueueColumns.new` marks the requests not seen at the previous
    call. One object serves one of the two paths.
    """

    needs_cache_hits: ClassVar[bool] = True
    stateful: ClassVar[bool] = True

    #: Skip sorting (keep the previous order) above this many waiting requests; None: never.
    max_queue_for_sort: int | None = None

    #: How many `order()` calls kept the previous order because of `max_queue_for_sort`.
    num_unsorted_steps: int = field(default=0, init=False, repr=False)
    _rank: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _ticket_rank: TicketState = field(default_factory=TicketState, init=False, repr=False)
    _num_known: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        """Validate the parameters (ValueError naming the parameter and its allowed range)."""
        cap = self.max_queue_for_sort
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"max_queue_for_sort must be None or an integer >= 1, got {cap!r}")

    def _memory(self) -> Mapping[str, int]:
        """Each waiting id's position in the last order."""
        return self._rank

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """Return indices by (−cached_tokens, previous order); see the class docstring."""
        known = self._rank
        rank = [known.get(r.request_id, -1) for r in queue]
        new = [i for i, x in enumerate(rank) if x < 0]
        if new:
            base = len(known)
            new.sort(key=lambda i: queue[i].arrival)  # stable: ties keep queue position
            for offset, i in enumerate(new):
                rank[i] = base + offset
        cap = self.max_queue_for_sort
        if cap is not None and len(queue) > cap:
            self.num_unsorted_steps += 1
            logger.debug("lpm: %d waiting > max_queue_for_sort=%d, order kept", len(queue), cap)
            result = sorted(range(len(queue)), key=rank.__getitem__)
        else:
            result = sorted(range(len(queue)), key=lambda i: (-queue[i].cached_tokens, rank[i]))
        self._rank = {queue[i].request_id: pos for pos, i in enumerate(result)}
        return result

    def ordering(self, queue: QueueColumns, step: Step) -> Ordering:
        """`order()` over numpy columns: O(n log n) in numpy, no per-request Python."""
        cols = queue
        n = len(cols)
        rank = self._ticket_rank.view(cols.tickets)
        new = np.flatnonzero(cols.new)
        if len(new):
            new = new[np.argsort(cols.arrival[new], kind="stable")]  # ties keep queue position
            rank[new] = self._num_known + np.arange(len(new))
        cap = self.max_queue_for_sort
        if cap is not None and n > cap:
            self.num_unsorted_steps += 1
            logger.debug("lpm: %d waiting > max_queue_for_sort=%d, order kept", n, cap)
            result = np.argsort(rank, kind="stable")
        else:
            result = np.lexsort((rank, -cols.cached_tokens))
        self._ticket_rank.store(cols.tickets[result], np.arange(n))
        self._num_known = n
        return Ordering(result)


@register_policy("klpm-8", k=8)
@register_policy("klpm-4", k=4)
@register_policy("klpm")
@dataclass(eq=False)
class KLPMPolicy(Policy):
    """k-LPM: one oldest request, then k−1 longest-hit requests, repeating over admissions.

    Source: Dexter et al., "LLM Query Scheduling with Prefix Reuse and Latency Constraints",
    arXiv 2502.04677, Algorithm 1. k = 1 is FCFS, k → ∞ is LPM.

    Rule: a counter `admitted` of requests the engine actually started persists across steps.
    Position i of this step's order has global index j = admitted + i; if j mod k == 0 it takes
    the oldest remaining request (min arrival, then queue position), otherwise the remaining
    request with the largest h (`cached_tokens`), then oldest, then queue position.

    Choices:
        * hit = absolute h in tokens (what "LPM" means in SGLang and in the paper's comparison),
          not the cached fraction h/L;
        * the cycle runs over admissions, not steps or placements: only ids reported to
          `on_step_end` advance the counter (with one admission per step, a per-step reset would
          turn k-LPM into FCFS);
        * hits are the real cache's hits at ordering time; the hits a placed request would create
          for later picks in the same step are not simulated.

    Args:
        k: cycle length, >= 1 (registered presets: `klpm` k=2, `klpm-4` k=4, `klpm-8` k=8).

    Caller's contract: call `on_step_end(admitted_ids, ...)` after every step with the waiting
    requests the engine started; the counter advances by `len(admitted_ids)`.

    Cost: two sorts and a linear merge with a "taken" mask, O(n log n).
    """

    name = "klpm"
    needs_cache_hits: ClassVar[bool] = True
    stateful: ClassVar[bool] = True

    #: Cycle length: 1 FCFS pick, then k − 1 longest-hit picks (>= 1).
    k: int = 2

    #: Requests admitted so far (over all steps), as reported to `on_step_end`.
    admitted: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        """Validate the parameters (ValueError naming the parameter and its allowed range)."""
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k must be an integer >= 1, got {self.k!r}")

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """Return the k-LPM sequence from the current counter; see the class docstring."""
        by_age = arrival_order(queue)
        if self.k == 1:
            return by_age
        n = len(queue)
        by_hit = sorted(range(n), key=lambda i: (-queue[i].cached_tokens, queue[i].arrival))
        taken = bytearray(n)
        result: list[int] = []
        age_pos = hit_pos = 0
        j = self.admitted
        for _ in range(n):
            if j % self.k == 0:
                while taken[by_age[age_pos]]:
                    age_pos += 1
                pick = by_age[age_pos]
            else:
                while taken[by_hit[hit_pos]]:
                    hit_pos += 1
                pick = by_hit[hit_pos]
            taken[pick] = 1
            result.append(pick)
            j += 1
        return result

    def on_step_end(
        self,
        admitted_ids: Sequence[str],
        prefill_tokens: int,
        prefill_by_request: Mapping[str, int] | None = None,
    ) -> None:
        """Advance the admission counter by the number of requests started this step."""
        self.admitted += len(admitted_ids)
