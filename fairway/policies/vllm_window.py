"""vLLM 0.34's cache-aware admission window, as a baseline (`vllm-window`). Must not import vllm.

Written from the rule vLLM 0.34 documents and implements (`SchedulerConfig.
cache_aware_admission_window` / `cache_aware_admission_threshold`), not from its code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fairway.policies.base import Policy, register_policy
from fairway.policies.queue import Ordering, QueueColumns, QueuedRequest, Step, head_order


@register_policy("vllm-window")
@dataclass(eq=False)
class VLLMWindowPolicy(Policy):
    """vLLM 0.34's cache-aware admission: near the head of its FCFS queue, a request whose prompt
    is already cached starts before one that would compute its own.

    Source: vLLM 0.34, `Scheduler._reorder_waiting_by_cached_prefix`
    (`vllm/v1/core/sched/scheduler.py`), options `--cache-aware-admission-window` and
    `--cache-aware-admission-threshold`; hits as `KVCacheManager.get_num_cached_tokens` (the
    longest cached prefix, the last token always recomputed: `cached_tokens` here), usage as
    `KVCacheManager.usage` (`Step.kv_usage`). `tests/integration/test_vllm_window.py` runs vLLM
    0.34's own scheduler with the options beside a Fairway one with this policy: same admissions,
    step by step.

    Rule, over the queue in its current order (row i: the i-th of the rows, `Step.num_ahead`
    positions of vLLM's queue before them):
        * if the KV cache usage (`Step.kv_usage`) is below `threshold`, or fewer than 2
          requests wait, the order is kept;
        * otherwise the window is the first `window` positions of vLLM's queue, the requests
          kept ahead of the rows included (they are preempted: never plain); within it, the
          positions held by plain waiting requests (`QueuedRequest.plain`: status WAITING,
          nothing computed) get those same requests again, sorted by h (`cached_tokens`)
          descending, the earlier queue position first among equal h. Every other position in
          the window, and every position past it, keeps its request.
    A `Step` without a usage (`kv_usage` None) is read as a full cache: the window applies, as
    in `order()`.

    The queue's current order, not arrival order, is the base (vLLM's "FCFS order" is its
    deque's): vLLM re-sorts its deque in place at every step, so each step starts from the last
    one's order (arrivals appended, requests it skipped or preempted put back at the head), ties
    break by that position, and below the threshold that order stays (arrival order is not
    restored). Fairway writes the order into the same deque, so the rows arrive in exactly that
    order; on a queue nobody re-sorted yet it is arrival order. Sorting by arrival first would
    differ from vLLM as soon as a request moved ahead at one step ties with an older one at a
    later step, or the usage falls below the threshold after a re-sort.

    Differences from vLLM's own scheduler with the same options (the engine's side, not the
    rule): Fairway orders before vLLM's step, so the usage and the hits are read before the
    running requests take their blocks for the step (a decode that crosses a block boundary
    adds one block; an allocation may evict a cached block), and it re-sorts also in a step
    in which vLLM skips it (the step preempts a running request, or prefills are deferred by
    `prefill_schedule_interval` or data-parallel throttling); requests Fairway sets apart (too
    long for the whole cache, or waiting for an offload-tier load) sit behind the rows instead
    of in the window. vLLM applies its window only under `--scheduling-policy fcfs` with prefix
    caching; under `priority` Fairway keeps the levels first, each in this order.

    Args:
        window: positions of vLLM's queue the re-sort reaches (>= 0; vLLM's default 0 is off,
            this baseline's 64 is on).
        threshold: the KV cache usage from which the window acts (0 to 1; vLLM's default 0.5).

    Caller's contract: call `ordering()` before every step with a waiting request, also one in
    which no request can start (`orders_every_step`: vLLM re-sorts in such steps too, and the
    order persists), with the usage (`Step.kv_usage`) and the positions ahead of the rows
    (`Step.num_ahead`), and apply the whole order; give the plain flags (`reads_plain`).
    `on_step_end` is a no-op; no state is kept.

    Cost: O(w log w) for a window of w rows (one plain read and one sort of those rows); the
    order returned moves only them (`head_order`).
    """

    needs_cache_hits: ClassVar[bool] = True
    reads_plain: ClassVar[bool] = True
    orders_every_step: ClassVar[bool] = True

    #: Positions at the head of vLLM's waiting queue the re-sort reaches (an integer >= 0; 0:
    #: off, the queue's order). vLLM's own default is 0 (cache-aware admission off, plain FCFS);
    #: this baseline defaults to 64, an on setting, which vLLM's option text asks to size to the
    #: usual queue depth: set it to the value of the vLLM runs it is compared with.
    window: int = 64
    #: KV cache usage (share of usable blocks in use, 0 to 1) below which the order is kept
    #: (vLLM's default 0.5: the window acts once the cache is at least half used; 0: always).
    threshold: float = 0.5

    def __post_init__(self) -> None:
        """Validate the parameters (ValueError naming the parameter and its allowed range)."""
        w = self.window
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"window must be an integer >= 0, got {w!r}")
        t = self.threshold
        if (
            isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t)
            or not 0.0 <= t <= 1.0
        ):
            raise ValueError(f"threshold must be a number in [0, 1], got {t!r}")

    def engaged(self, kv_usage: float | None) -> bool:
        """Whether the window applies at this usage (None: unknown, read as a full cache)."""
        return kv_usage is None or kv_usage >= self.threshold

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """The rule with the window applied (no usage is known here) and nothing ahead."""
        return self.reference(queue, None, 0)

    def reference(
        self, queue: Sequence[QueuedRequest], kv_usage: float | None, num_ahead: int
    ) -> list[int]:
        """The rule in plain Python (see the class docstring): the new order of `queue`'s rows.

        Args:
            queue: the rows in the queue's current order.
            kv_usage: the KV cache usage (None: unknown, the window applies).
            num_ahead: positions of vLLM's queue before the rows (inside the window first).
        """
        result = list(range(len(queue)))
        if not self.engaged(kv_usage):
            return result
        width = min(len(queue), max(self.window - num_ahead, 0))
        movable = [i for i in range(width) if queue[i].plain]
        ranked = sorted(movable, key=lambda i: (-queue[i].cached_tokens, i))
        for position, row in zip(movable, ranked, strict=True):
            result[position] = row
        return result

    def ordering(self, queue: QueueColumns, step: Step) -> Ordering:
        """`reference()` over the columns: only the window's rows are read and moved."""
        n = len(queue)
        width = min(n, max(self.window - step.num_ahead, 0))
        if width < 2 or not self.engaged(step.kv_usage):
            return Ordering(np.arange(n))
        head = np.arange(width, dtype=np.intp)
        movable = head[queue.plain_of(head)]
        if len(movable) < 2:
            return Ordering(np.arange(n))
        # stable: equal hits keep their queue order
        ranked = movable[np.argsort(-queue.cached_tokens[movable], kind="stable")]
        head[movable] = ranked
        return Ordering(head_order(head, n))
