"""VTC: the Virtual Token Counter of Sheng et al., a cache-blind tenant-fair baseline.

Must not import vllm. Source: Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024,
arXiv 2401.00588 (the VTC algorithm and its weighted variant).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

import numpy as np

from fairway.policies.base import Policy, arrival_order, register_policy
from fairway.policies.queue import Ordering, QueueColumns, QueuedRequest, Step


def checked_weights(weights: Sequence[float]) -> tuple[float, ...]:
    """`Step.tenant_weights` as a tuple of floats, each finite and > 0 (else ValueError): a
    tenant's share is divided by its weight, so a zero or negative one has no meaning."""
    out = tuple(float(w) for w in weights)
    for code, w in enumerate(out):
        if not (math.isfinite(w) and w > 0):
            raise ValueError(f"tenant_weights[{code}] must be a finite number > 0, got {w!r}")
    return out


def tenant_weight(weights: Sequence[float], tenant: int) -> float:
    """The weight of tenant code `tenant` (`Step.weight_of`: 1 for a code past the end)."""
    return weights[tenant] if 0 <= tenant < len(weights) else 1.0


@dataclass(eq=False)
class _Rows:
    """What VTC keeps of its last ordering to charge admissions: each row's tenant and prompt
    tokens, its order, the weights, and the ids (resolved on demand, `QueueColumns.ids_of`)."""

    order: np.ndarray
    tenant: np.ndarray
    tokens: np.ndarray
    weights: tuple[float, ...]
    ids_of: Callable[[np.ndarray], list[str]]

    def rows_of(self, wanted: Sequence[str]) -> dict[str, int]:
        """Request id -> row, for the ids of `wanted` that are rows of this ordering."""
        n = len(self.order)
        want = set(wanted)
        # Admissions are nearly always the head of the order: resolve the ids of a few more rows
        # than were admitted, and all of them only if some admitted id is not among those.
        head = self.order[: min(n, 2 * len(want) + 8)]
        found = {rid: int(row) for rid, row in zip(self.ids_of(head), head.tolist(), strict=True)}
        if len(head) < n and not want <= found.keys():
            rows = np.arange(n, dtype=np.intp)
            found = dict(zip(self.ids_of(rows), rows.tolist(), strict=True))
        return {rid: found[rid] for rid in want if rid in found}


@register_policy("vtc")
@dataclass(eq=False)
class VTCPolicy(Policy):
    """VTC: the tenant with the least served input tokens (per unit of weight) goes first.

    Source: Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024, arXiv 2401.00588:
    the VTC algorithm, with the counters of its weighted variant (charges divided by the weight).
    It is the cache-blind tenant-fair arm: it never reads `cached_tokens`, so a tenant whose
    prompts hit the prefix cache is charged as much as one whose prompts miss (the point of the
    baseline: DLPM, `dlpm`, is the locality-aware answer to it).

    State: one counter c_t per tenant code t, in input tokens per unit of weight.

    Order (a merge): each waiting tenant's ledger starts at c_t; the tenant with the smallest
    ledger places its oldest unplaced request (arrival, then queue position: FCFS inside a
    tenant) and its ledger rises by that request's `prompt_tokens` / w_t (the full prompt,
    cache-blind). So request r's place is fixed by its start tag, c_t + (prompt tokens of t's
    requests before r in FCFS order) / w_t: the order is by (tag, arrival, queue position), which
    is what `ordering` computes with numpy (per-tenant cumulative sums, one lexsort). This is
    VTC's "serve the client with the least counter, earliest request first", played forward over
    the whole queue as if every placed request were admitted in turn.

    Counters (VTC's bookkeeping):
        * charge: `on_step_end` adds `prompt_tokens` / w_t to c_t for every request the engine
          started from the last ordering (VTC charges input tokens as they are served; admission
          is when the engine starts the prefill, and the whole prompt is charged then, as VTC
          charges a request's input when it joins the batch). A request whose prefill is
          chunked over several steps is thus charged once, in full, at its first step.
        * lift: a tenant that had no waiting request at the previous ordering and has one now
          gets c_t = max(c_t, min of the counters of the tenants that were waiting then), so a
          tenant that was idle cannot bank its idle time and take the engine over when it comes
          back (VTC's counter lift on arrival, applied at ordering time). With no previous
          non-empty ordering there is nothing to lift to; after an empty queue the tenants of the
          last non-empty ordering stand in for the waiting ones (the engine does not order an
          empty queue, so "the previous ordering" is the last non-empty one).
        * normalisation: every ordering subtracts the least counter of the waiting tenants from
          all counters and forgets idle tenants left at or below it (they would be lifted to at
          least that floor on return, since the floor never falls), so the numbers stay small
          and memory is bounded by the tenant codes. The order is unaffected (a common shift).

    Choices:
        * ties of tags (a tenant lifted to another's counter, say) go to the older request
          (arrival, then queue position), not to a tenant code: with codes the default tenant,
          code 0, would win every tie by its code alone.
        * output tokens are not charged: VTC also charges w_q per generated token, but a policy
          here sees only admissions and prefill tokens (`on_step_end`), not per-tenant decodes,
          so the counters are VTC's input-token share (w_q = 0).
        * a preempted request that comes back is charged again, its `prompt_tokens` being the
          prompt plus the output so far (the engine recomputes them).
        * ids admitted but not in the last ordering (requests the engine serves before the
          order) are not charged: the policy does not know their tenant.

    Weights: `tenant_weights` (set from `Step.tenant_weights` by every `ordering` call; a code
    past its end weighs 1). `order()` reads the attribute as it is: set it first to call
    `order()` directly with weights.

    Caller's contract: call `ordering()` (or `order()`) before every step with the whole waiting
    queue, then `on_step_end` with the ids the engine started. With one tenant the order is
    exactly FCFS.
    """

    needs_cache_hits: ClassVar[bool] = False
    stateful: ClassVar[bool] = True

    #: Weight of each tenant code, from the last `ordering()` call's `Step.tenant_weights`.
    tenant_weights: tuple[float, ...] = field(default=(), init=False, repr=False)

    _counters: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    #: The tenants waiting at the last non-empty ordering (what a returning tenant is lifted to).
    _waiting: frozenset[int] = field(default=frozenset(), init=False, repr=False)
    _last: _Rows | None = field(default=None, init=False, repr=False)
    _charged: set[str] = field(default_factory=set, init=False, repr=False)

    @property
    def counters(self) -> Mapping[int, float]:
        """Tenant code -> its counter (normalised: the least waiting tenant's is 0; an absent code
        is at or below it)."""
        return MappingProxyType(self._counters)

    def _memory(self) -> Mapping[str, tuple[int, int]]:
        """(tenant, prompt tokens) of each id of the last ordering (only the last call's rows)."""
        last = self._last
        if last is None:
            return {}
        rows = np.arange(len(last.order), dtype=np.intp)
        return {
            rid: (int(last.tenant[row]), int(last.tokens[row]))
            for rid, row in zip(last.ids_of(rows), rows.tolist(), strict=True)
        }

    # --- the rule in plain Python -----------------------------------------------------------

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """Return the merge of the tenants' FCFS lists by ledger; see the class docstring."""
        weights = checked_weights(self.tenant_weights)
        if not queue:
            self._forget()
            return []
        self._lift(sorted({r.tenant for r in queue}))
        groups: dict[int, list[int]] = {}
        for i in arrival_order(queue):
            groups.setdefault(queue[i].tenant, []).append(i)
        counters = self._counters
        placed = dict.fromkeys(groups, 0)  # prompt tokens placed so far, per tenant
        taken = dict.fromkeys(groups, 0)  # requests placed so far, per tenant
        # Heap key (ledger, arrival, position): the next request of each tenant, by its tag.
        heap = [(counters[t], queue[g[0]].arrival, g[0], t) for t, g in groups.items()]
        heapq.heapify(heap)
        result: list[int] = []
        while heap:
            _, _, i, t = heapq.heappop(heap)
            result.append(i)
            placed[t] += queue[i].prompt_tokens
            taken[t] += 1
            members = groups[t]
            if taken[t] < len(members):
                j = members[taken[t]]
                ledger = counters[t] + placed[t] / tenant_weight(weights, t)
                heapq.heappush(heap, (ledger, queue[j].arrival, j, t))
        ids = [r.request_id for r in queue]
        self._last = _Rows(
            order=np.asarray(result, dtype=np.intp),
            tenant=np.fromiter((r.tenant for r in queue), np.intp, len(queue)),
            tokens=np.fromiter((r.prompt_tokens for r in queue), np.int64, len(queue)),
            weights=weights,
            ids_of=lambda rows: [ids[k] for k in rows.tolist()],
        )
        return result

    # --- the engine's path ------------------------------------------------------------------

    def ordering(self, queue: QueueColumns, step: Step) -> Ordering:
        """`order()` over numpy columns: start tags from per-tenant cumulative sums, one lexsort."""
        self.tenant_weights = weights = checked_weights(step.tenant_weights)
        n = len(queue)
        if not n:
            self._forget()
            return Ordering(np.zeros(0, dtype=np.intp))
        tenant = queue.tenants
        codes, group = np.unique(tenant, return_inverse=True)
        group = group.reshape(-1)
        code_list: list[int] = codes.tolist()
        self._lift(code_list)
        counter = np.array([self._counters[t] for t in code_list], dtype=np.float64)
        weight = np.array([tenant_weight(weights, t) for t in code_list], dtype=np.float64)
        rows = np.arange(n, dtype=np.intp)
        fcfs = np.lexsort((rows, queue.arrival))
        by_tenant = fcfs[np.argsort(group[fcfs], kind="stable")]  # FCFS inside each tenant
        g = group[by_tenant]
        prompt = queue.prompt_tokens[by_tenant].astype(np.int64, copy=False)
        before = np.cumsum(prompt) - prompt  # tokens ahead in the concatenation, exact ints
        starts = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1])))
        before -= np.repeat(before[starts], np.diff(np.append(starts, n)))
        tag = np.empty(n, dtype=np.float64)
        tag[by_tenant] = counter[g] + before / weight[g]
        order = np.lexsort((rows, queue.arrival, tag))
        self._last = _Rows(
            order=order,
            tenant=tenant,
            tokens=queue.prompt_tokens,
            weights=weights,
            ids_of=queue.ids_of,
        )
        return Ordering(order)

    # --- the counters -----------------------------------------------------------------------

    def on_step_end(
        self,
        admitted_ids: Sequence[str],
        prefill_tokens: int,
        prefill_by_request: Mapping[str, int] | None = None,
    ) -> None:
        """Charge every admitted request of the last ordering: c_t += prompt_tokens / w_t."""
        last = self._last
        fresh = [rid for rid in dict.fromkeys(admitted_ids) if rid not in self._charged]
        if last is None or not fresh:
            return
        rows = last.rows_of(fresh)
        counters = self._counters
        for rid in fresh:  # in admission order: the float sums do not depend on the path
            row = rows.get(rid)
            if row is None:
                continue
            t = int(last.tenant[row])
            charge = int(last.tokens[row]) / tenant_weight(last.weights, t)
            counters[t] = counters.get(t, 0.0) + charge
            self._charged.add(rid)

    def _lift(self, present: list[int]) -> None:
        """VTC's lift for the tenants newly waiting, then the normalisation (class docstring)."""
        counters = self._counters
        before = self._waiting
        if before:
            floor = min(counters.get(t, 0.0) for t in before)
            for t in present:
                if t not in before and counters.get(t, 0.0) < floor:
                    counters[t] = floor
        low = min(counters.get(t, 0.0) for t in present)
        waiting = frozenset(present)
        self._counters = {
            t: c - low
            for t, c in ((t, counters.get(t, 0.0)) for t in waiting | counters.keys())
            if t in waiting or c > low
        }
        self._waiting = waiting
        self._charged = set()

    def _forget(self) -> None:
        """An empty queue: nothing to charge; the lift keeps the last non-empty ordering's
        tenants."""
        self._last = None
        self._charged = set()
