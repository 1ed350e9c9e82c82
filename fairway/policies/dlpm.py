"""DLPM: deficit round robin between tenants, longest prefix match inside a tenant.

Must not import vllm. Source: Cao et al., "Locality-aware Fair Scheduling in LLM Serving",
arXiv 2501.14312 (DLPM, the single-node algorithm; its distributed D²LPM is out of scope).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from fairway.policies.base import Policy, register_policy
from fairway.policies.queue import Ordering, QueueColumns, QueuedRequest, Step
from fairway.policies.vtc import checked_weights, tenant_weight


@dataclass(frozen=True)
class _Rounds:
    """The inputs of one ordering's round robin (replayed by `on_step_end`)."""

    groups: dict[int, list[int]]  # tenant -> its rows, LPM-first
    cost: list[int]  # row -> what placing it takes from its tenant's deficit
    deficits: dict[int, float]  # the deficits the ordering started from
    cycle: list[int]  # the waiting tenants in visit order, from the pointer
    quanta: dict[int, float]  # tenant -> quantum x weight
    resume: int | None  # tenant whose open visit the first visit continues (no new quantum)


@dataclass
class _Run:
    order: list[int] = field(default_factory=list)
    visit: dict[int, int] = field(default_factory=dict)  # placed row -> its visit's number
    quanta: dict[int, int] = field(default_factory=dict)  # quanta given, per tenant
    last_tenant: int | None = None  # the tenant of the last visit run


def _round_robin(rounds: _Rounds, stop: int | None = None) -> _Run:
    """Play DRR over the tenants: every visit gives the tenant its quantum; while its deficit is
    > 0 and it has requests left it places its LPM-first one, paying its cost; then the next
    tenant. Stops after visit number `stop` if given (visits are numbered from 0, skipped idle
    rounds included), else when every request is placed.

    A deficit is always computed as start + k x quantum - paid (k: quanta given, paid: an int),
    never summed step by step, so skipping k rounds at once gives the very floats that k visits
    would (and `on_step_end` rebuilds the same numbers)."""
    groups, cost, quanta, start = rounds.groups, rounds.cost, rounds.quanta, rounds.deficits
    run = _Run(quanta=dict.fromkeys(rounds.cycle, 0))
    given = run.quanta
    paid = dict.fromkeys(rounds.cycle, 0)
    taken = dict.fromkeys(rounds.cycle, 0)

    def deficit(t: int, extra: int = 0) -> float:
        return start.get(t, 0.0) + (given[t] + extra) * quanta[t] - paid[t]

    active = deque(rounds.cycle)
    visit = idle = 0
    while active:
        t = active.popleft()
        run.last_tenant = t
        if visit > 0 or rounds.resume != t:
            given[t] += 1
        members, k = groups[t], taken[t]
        placed = False
        while k < len(members) and deficit(t) > 0:
            row = members[k]
            k += 1
            run.order.append(row)
            run.visit[row] = visit
            paid[t] += cost[row]
            placed = True
        taken[t] = k
        if k < len(members):
            active.append(t)
        if visit == stop:
            break
        visit += 1
        idle = 0 if placed else idle + 1
        if active and idle >= len(active):
            # A whole round placed nothing, so every waiting tenant has d <= 0: skip the further
            # rounds in which none would reach d > 0 (a request costing many quanta), at once.
            skip = min(_visits_to_positive(deficit, u, quanta[u]) for u in active) - 1
            if skip > 0:
                for u in active:
                    given[u] += skip
                visit += skip * len(active)
            idle = 0
    return run


def _visits_to_positive(deficit: Callable[[int, int], float], t: int, quantum: float) -> int:
    """The fewest further quanta m >= 1 that make tenant t's deficit > 0 (exact: checked with
    the same arithmetic the visits use; the deficit grows monotonically with m)."""
    m = max(1, math.floor(-deficit(t, 0) / quantum) + 1)
    while m > 1 and deficit(t, m - 1) > 0:
        m -= 1
    while deficit(t, m) <= 0:
        m += 1
    return m


@register_policy("dlpm")
@dataclass(eq=False)
class DLPMPolicy(Policy):
    """DLPM: tenants take turns by deficit round robin; each spends its turn LPM-first.

    Source: Cao et al., "Locality-aware Fair Scheduling in LLM Serving", arXiv 2501.14312
    (Deficit Longest Prefix Match). LPM alone maximises prefix reuse but lets one tenant's hot
    prefix starve the others; deficit round robin (Shreedhar and Varghese, SIGCOMM 1995) bounds
    each tenant's share, and inside its share a tenant keeps LPM's locality.

    Order (the placement sequence of one round robin over the waiting queue):
        * tenants are visited in cyclic order of their codes, starting from `pointer` (the first
          waiting code >= it, wrapping round); only tenants with unplaced requests are visited;
        * a visit adds quantum x w_t to the tenant's deficit d_t (w_t its weight); while d_t > 0
          and it has unplaced requests, it places its LPM-first one (most `cached_tokens`, then
          arrival, then queue position) and d_t drops by the request's cost; then the next tenant.
          Deficits can go negative (a request is placed while d_t > 0, whatever it costs); the
          debt carries over;
        * a request costing many quanta is reached after as many rounds (whole rounds in which
          nobody could place are skipped arithmetically, with the same result).

    Cost (choice): `remaining`, the uncached tokens (at least 1), as seen at ordering time. Why:
    the deficit measures the service a tenant has received, and with prefix caching the service of
    a prefill is the tokens the engine computes, not the cached prefix it reuses. Charging full
    prompts would bill a tenant for the very locality DLPM sets out to keep, and would turn the
    deficits into VTC's cache-blind ledger (`vtc`). This is a reading of the paper's cost, not a
    quotation of it (its text was not at hand when this was written); were its cost the full
    prompt, `prompt_tokens` would replace `remaining` in `order()`. Output tokens, which the
    paper's service also counts, are not charged: `on_step_end` reports no per-tenant decodes.

    Deficits and pointer (the state across steps): the ordering's deficits are for placement only.
    `on_step_end` books what really happened: the round robin is replayed up to the visit that
    placed the last admitted request, so each tenant gets the quanta of the visits that took
    place, and each admitted request's cost is charged to its tenant. The pointer then stays on
    that visit's tenant if its visit was cut short by the step's end (d_t > 0 and requests left:
    the next ordering resumes the visit without a new quantum, as DRR does) and otherwise moves to
    the next code. A tenant with no waiting request has its deficit reset to 0, as DRR does for an
    empty flow: when the ordering finds it absent, and when a step admits all its requests.
    Nothing admitted: nothing changes.

    Weights: `tenant_weights` (set from `Step.tenant_weights` by every `ordering` call; a code past
    its end weighs 1). `order()` reads the attribute as it is: set it first to call `order()`
    directly with weights.

    Args:
        quantum: tokens added to a tenant's deficit per visit, scaled by its weight; an int > 0.

    Caller's contract: call `ordering()` (or `order()`) before every step with the whole waiting
    queue, then `on_step_end` with the ids the engine started. With one tenant the order is LPM by
    (cached desc, arrival, queue position). `ordering` runs `order()` on the views (a vectorised
    round robin would not be simpler).
    """

    needs_cache_hits: ClassVar[bool] = True
    stateful: ClassVar[bool] = True

    #: Tokens added to a tenant's deficit at each round-robin visit, times its weight (int > 0).
    quantum: int = 2048

    #: Weight of each tenant code, from the last `ordering()` call's `Step.tenant_weights`.
    tenant_weights: tuple[float, ...] = field(default=(), init=False, repr=False)
    #: The tenant code the next round robin starts at (the first waiting code >= it).
    pointer: int = field(default=0, init=False, repr=False)
    #: Whether the pointer's tenant is in the middle of a visit (its next visit adds no quantum).
    visit_open: bool = field(default=False, init=False, repr=False)

    _deficits: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    _last: _Rounds | None = field(default=None, init=False, repr=False)
    _visit_of: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    _index: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _tenant_of: list[int] = field(default_factory=list, init=False, repr=False)
    _admitted: dict[int, None] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        """Validate the parameters (ValueError naming the parameter and its allowed range)."""
        q = self.quantum
        if isinstance(q, bool) or not isinstance(q, int) or q <= 0:
            raise ValueError(f"quantum must be an integer > 0 (tokens), got {q!r}")

    @property
    def deficits(self) -> Mapping[int, float]:
        """Tenant code -> its deficit after the last booked step (absent: 0)."""
        return MappingProxyType(self._deficits)

    def _memory(self) -> Mapping[str, int]:
        """Each id's row in the last ordering (only the last call's rows)."""
        return self._index

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """Return the round robin's placement sequence; see the class docstring."""
        weights = checked_weights(self.tenant_weights)
        lpm = sorted(range(len(queue)), key=lambda i: (-queue[i].cached_tokens, queue[i].arrival))
        groups: dict[int, list[int]] = {}
        for i in lpm:  # stable: ties of (hit, arrival) keep queue position
            groups.setdefault(queue[i].tenant, []).append(i)
        self._deficits = {t: d for t, d in self._deficits.items() if t in groups}
        self._index = {r.request_id: i for i, r in enumerate(queue)}
        self._tenant_of = [r.tenant for r in queue]
        self._admitted = {}
        if not groups:
            self._last = None
            self._visit_of = {}
            self.visit_open = False
            return []
        codes = sorted(groups)
        start = next((k for k, t in enumerate(codes) if t >= self.pointer), 0)
        cycle = codes[start:] + codes[:start]
        resume = cycle[0] if self.visit_open and cycle[0] == self.pointer else None
        rounds = _Rounds(
            groups=groups,
            cost=[r.remaining for r in queue],
            deficits=dict(self._deficits),
            cycle=cycle,
            quanta={t: self.quantum * tenant_weight(weights, t) for t in codes},
            resume=resume,
        )
        run = _round_robin(rounds)
        self._last = rounds
        self._visit_of = run.visit
        return run.order

    def ordering(self, queue: QueueColumns, step: Step) -> Ordering:
        """`order()` on the queue's views, with this step's tenant weights."""
        self.tenant_weights = checked_weights(step.tenant_weights)
        return Ordering(self.order(queue.views(), step.now))

    def on_step_end(
        self,
        admitted_ids: Sequence[str],
        prefill_tokens: int,
        prefill_by_request: Mapping[str, int] | None = None,
    ) -> None:
        """Book the step: the quanta of the visits that took place, the admitted requests' costs,
        the pointer, and the resets of tenants left without requests (class docstring)."""
        rounds = self._last
        if rounds is None:
            return
        rows = [self._index[rid] for rid in admitted_ids if rid in self._index]
        new = [row for row in rows if row not in self._admitted]
        if not new:
            return
        self._admitted.update(dict.fromkeys(new))
        # The deficits are rebuilt from the ordering's start with everything admitted since, so
        # several calls after one ordering (steps the engine did not order) book each visit once.
        last_visit = max(self._visit_of[row] for row in self._admitted)
        run = _round_robin(rounds, stop=last_visit)
        left = {t: len(members) for t, members in rounds.groups.items()}
        paid = dict.fromkeys(left, 0)
        for row in self._admitted:
            t = self._tenant_of[row]
            paid[t] += rounds.cost[row]
            left[t] -= 1
        deficits = {
            t: rounds.deficits.get(t, 0.0) + k * rounds.quanta[t] - paid[t]
            for t, k in run.quanta.items()
        }
        self._deficits = {t: d for t, d in deficits.items() if left[t] > 0}
        end = run.last_tenant
        assert end is not None
        if left[end] > 0 and self._deficits[end] > 0:
            self.pointer, self.visit_open = end, True
        else:
            self.pointer, self.visit_open = end + 1, False
