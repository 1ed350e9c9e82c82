"""RAGCache's cache-aware reordering: cached / uncached tokens, highest first. Must not import vllm.

Reorder only; RAGCache's PGDSF cache replacement is a separate (eviction) concern.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from fairway.policies.base import Policy, register_policy
from fairway.policies.queue import QueuedRequest


@register_policy("ragcache")
@dataclass(eq=False)
class RAGCachePolicy(Policy):
    """RAGCache-order: OrderPriority = h / max(c, 1), highest first, with an optional window.

    Formula: OrderPriority_r = h_r / max(c_r, 1), where h = `cached_tokens` and c = `remaining`
    (uncached tokens, already >= 1). Source: Jin et al., "RAGCache", arXiv 2404.12457, §5.2
    "Cache-aware Reordering" (formula confirmed through a secondary reading). The ratio, not
    absolute h, avoids favouring long prompts that are only partly cached.

    Anti-starvation window (choice): the paper serves a request "regardless of its priority" once it
    has waited longer than a window, but its unit and default were not recovered. Here the window is
    in seconds of wait (`now - arrival`), because a count of scheduling steps would mean different
    waits under different step lengths and loads. Requests with wait strictly greater than
    `window_s` go first, in arrival order; the others follow by priority. Default None: no window
    (pure reordering), the cache-greedy reading of the paper.

    Tie-breaks: equal priority by arrival, then queue position; the urgent group by arrival, then
    queue position.

    Args:
        window_s: wait in seconds beyond which a request is served in arrival order ahead of all
            non-urgent ones; None (default) disables it; otherwise a finite number > 0.

    Caller's contract: `now` on the clock of `arrival`; no state, `on_step_end` is a no-op.
    """

    needs_cache_hits: ClassVar[bool] = True

    #: Anti-starvation window in seconds of wait; None: off.
    window_s: float | None = None

    def __post_init__(self) -> None:
        """Validate the parameters (ValueError naming the parameter and its allowed range)."""
        w = self.window_s
        if w is not None and (
            isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w <= 0
        ):
            raise ValueError(f"window_s must be None or a finite number of seconds > 0, got {w!r}")

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """Return urgent requests by arrival, then the rest by (−h / max(c, 1), arrival)."""
        urgent: list[int] = []
        rest: list[int] = []
        if self.window_s is None:
            rest = list(range(len(queue)))
        else:
            window_s = self.window_s
            for i, r in enumerate(queue):
                (urgent if now - r.arrival > window_s else rest).append(i)
            urgent.sort(key=lambda i: queue[i].arrival)  # stable: ties keep queue position
        rest.sort(key=lambda i: (-queue[i].cached_tokens / queue[i].remaining, queue[i].arrival))
        return urgent + rest
