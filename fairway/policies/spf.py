"""SGLang's shortest-prefill-first, with its chunk reserve for shorter waiting requests.

This module must not import vllm."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fairway.policies.base import Policy, register_policy
from fairway.policies.queue import Ordering, QueueColumns, QueuedRequest, Step, StepPlan


@register_policy("spf")
@dataclass(eq=False)
class SPFPolicy(Policy):
    """Fewest uncached tokens first; a running chunked prefill is capped so that shorter waiting
    requests start, whole, in the same step.

    Order: by (max(1, L − h), arrival), ties by queue position (SGLang: `r.rid in deprioritized`,
    `_shortest_prefill_work(r)`, `wait_queue_entry_time`).

    Reserve (a `StepPlan` whose `cap` is vLLM's per-request prefill cap for the step): with a
    prefill running, walk the waiting requests in that order and reserve, for each one shorter
    than the running prefill's remaining tokens, its work rounded up to whole pages, stopping at
    the first that is not shorter or that would leave the running prefill less than a page; the
    running prefill's chunk is then capped at the rest of the step's budget, rounded down to a
    page (`reserve_cap`). No reserve, or a budget under two pages: no cap (vLLM's own setting).

    Source: SGLang, PR #40024 ("[Scheduler] Add shortest-prefill-first scheduling", merged
    2026-09, commit 65ef55e, marked experimental); `python/sglang/srt/managers/schedule_policy.py`
    at 00550cd1: `SchedulePolicy._sort_by_shortest_prefill`, `_shortest_prefill_work` and
    `shortest_prefill_chunk_limit` (applied in `scheduler.py` as `adder.chunked_req_limit`
    before `add_chunked_req`); it requires prefix caching, as this policy does.

    Where vLLM's queue differs:
        * vLLM has one cap for every request of a step (`long_prefill_token_threshold`), not a
          limit on the continuing chunk alone. A reserved request longer than the cap would be
          chunked too, so the reserve is cut back to its longest prefix whose requests all fit
          under the cap it leaves; when none does, no cap is set. SGLang's split exactly when
          every reserved request is no longer than the continuation's limit (most of the time:
          reserved requests are short); otherwise the continuation gets more than in SGLang and
          the longest reserved requests wait for a later step;
        * SGLang continues one chunked request, vLLM may run several prefills at once: they
          share the continuation's budget (one cap, the largest page multiple that keeps their
          chunks within it), and "shorter" means shorter than the shortest of them;
        * the budget is the step's tokens after the running decodes and the requests vLLM
          serves first (SGLang's prefill batches hold no decodes unless mixed chunking is on);
        * as in SGLang, a reserve is kept whether or not the reserved requests can start (free
          request slots, KV blocks): "reservation is not a guarantee of admission";
        * under vLLM's priority scheduling the levels come first (Fairway keeps them); the
          reserve is computed on this policy's order;
        * SGLang's in-batch prefix deferral (`deprioritized`, the first key) is not reproduced,
          as for `lpm`: all arms or none.

    Args:
        page_tokens: SGLang's page size, the unit the reserve and the cap are rounded to.

    Caller's contract (`plans_steps`): call `ordering()` with the step's budget and running
    prefills before every step in which a prefill can run, and apply the plan's cap; `order()`
    is the order alone. No state is kept.
    """

    needs_cache_hits: ClassVar[bool] = True
    plans_steps: ClassVar[bool] = True

    #: Tokens per page: the reserve charges each request whole pages and the cap is a whole
    #: number of pages (an integer >= 1; SGLang's `--page-size`, 1 by default).
    page_tokens: int = 1

    def __post_init__(self) -> None:
        """Validate the parameters (ValueError naming the parameter and its allowed range)."""
        p = self.page_tokens
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise ValueError(f"page_tokens must be an integer >= 1, got {p!r}")

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """Indices by (uncached work, arrival); ties keep queue position."""
        return sorted(range(len(queue)), key=lambda i: (queue[i].remaining, queue[i].arrival))

    def ordering(self, queue: QueueColumns, step: Step) -> Ordering:
        """`order()` over the columns, and the step's cap when a prefill runs."""
        order = np.lexsort((queue.arrival, queue.remaining))  # stable: ties keep row order
        budget = step.budget
        if budget is None or not step.prefilling or not len(order):
            return Ordering(order)
        tokens = max(0, budget.tokens - sum(budget.ahead))
        work = queue.remaining[order].astype(np.int64).tolist()
        running = [p.remaining for p in step.prefilling]
        cap = reserve_cap(work, running, tokens, self.page_tokens)
        if cap is None:
            return Ordering(order)
        return Ordering(order, plan=StepPlan(cap=cap, budget=tokens))


def reserve_cap(
    work: Sequence[int], running: Sequence[int], tokens: int, page_tokens: int
) -> int | None:
    """The step's per-request prefill cap that keeps part of `tokens` for shorter waiting
    requests, or None (no reserve).

    Args:
        work: uncached tokens of the waiting requests, in the order they will be admitted.
        running: remaining tokens of each running prefill.
        tokens: the step's prefill budget.
        page_tokens: the page size the reserve and the cap are rounded to.
    """
    page = page_tokens
    if not running or tokens < 2 * page:
        return None
    shortest = min(running)
    reserved: list[tuple[int, int]] = []  # (work, charge) of each reserved request
    total = 0
    for w in work:
        charge = -(-w // page) * page
        if w >= shortest or total + charge > tokens - page:
            break
        reserved.append((w, charge))
        total += charge
    while reserved:  # cut back until one cap serves the running prefills and every reserved one
        limit = (tokens - total) // page * page
        cap = _shared_cap(running, limit, page)
        if cap is not None and max(w for w, _ in reserved) <= cap:
            return cap
        total -= reserved.pop()[1]
    return None


def _shared_cap(running: Sequence[int], limit: int, page: int) -> int | None:
    """The largest per-request cap (a page multiple, or `limit` itself) under which the running
    prefills together take at most `limit` tokens; None when it would be below one token."""
    left, n = limit, len(running)
    for k, r in enumerate(sorted(running)):
        share = left // (n - k)
        if r > share:  # this one and every longer one are capped at the share
            cap = share // page * page
            return cap if cap >= 1 else None
        left -= r
    return limit  # every running prefill finishes within the limit
