"""The waiting queue and its orderings, as every policy sees them. Must not import vllm.

A policy reads the waiting queue as `QueueColumns` (numpy columns by row: arrival, prompt length,
cached prefix, a stable per-request ticket) and returns an `Ordering`: a permutation of the rows,
highest priority first, with the lane that placed each position and,
for a policy that plans steps, the step's `StepPlan`. `QueuedRequest` is the same queue one request
at a time: what a reference rule reads (`QueueColumns.views()`), and what tests build.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: The lane label of an ordered position past an exact head (`Step.head`), left in queue order:
#: no lane placed it. Equal to `fairway.vllm.metrics.NO_LANE` ("admitted outside Fairway's order");
#: `fairway:requests_placed_total` does not count such admissions.
UNPLACED_LANE = "none"


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """What a policy may know about one waiting request.

    Attributes:
        request_id: the engine's id (unique within one queue).
        arrival: arrival time in seconds, on the same clock as `now` in `Policy.order`.
        prompt_tokens: full length L in tokens (for a preempted request: prompt + output so far).
        cached_tokens: h, tokens of the longest cached prefix found now (block-granular, <= L).
        tenant: the tenant's code (`fairway.tenants.TenantTable`; 0: the default tenant).
        priority: vLLM's priority level (lower first; 0 unless `--scheduling-policy priority`).
        plain: a plain waiting request: status WAITING and no token computed yet. False for one
            preempted (or resumed), waiting for a grammar, remote KV blocks or more streamed
            input, or partly computed; vLLM 0.34's cache-aware window (`vllm-window`) moves only
            plain requests.
    """

    request_id: str
    arrival: float
    prompt_tokens: int
    cached_tokens: int
    tenant: int = 0
    priority: int = 0
    plain: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(
                f"QueuedRequest.request_id must be a non-empty str, got {self.request_id!r}"
            )
        if not math.isfinite(self.arrival):
            raise ValueError(
                f"QueuedRequest {self.request_id}: arrival must be finite, got {self.arrival!r}"
            )
        if self.prompt_tokens < 0:
            raise ValueError(
                f"QueuedRequest {self.request_id}: prompt_tokens must be >= 0, "
                f"got {self.prompt_tokens}"
            )
        if not 0 <= self.cached_tokens <= self.prompt_tokens:
            raise ValueError(
                f"QueuedRequest {self.request_id}: cached_tokens must be in [0, prompt_tokens="
                f"{self.prompt_tokens}], got {self.cached_tokens}"
            )

    @property
    def remaining(self) -> int:
        """Work left: uncached tokens, at least 1 (the last token is always computed)."""
        return max(self.prompt_tokens - self.cached_tokens, 1)


@dataclass(frozen=True, slots=True)
class PrefillingRequest:
    """A running request whose prefill is not finished (vLLM continues it before the queue).

    Attributes:
        request_id: the engine's id.
        arrival: arrival time, on the clock of `QueuedRequest.arrival`.
        remaining: prompt tokens still to compute (>= 1).
        prompt_tokens: its full length L (prompt, plus output so far when resumed; at least
            `remaining`); the tokens already computed, L - remaining, play the cached prefix's
            part in the Fast score.
        tenant: the tenant's code (0: the default tenant).
        priority: vLLM's priority level (lower first).
    """

    request_id: str
    arrival: float
    remaining: int
    prompt_tokens: int = 0
    tenant: int = 0
    priority: int = 0

    def __post_init__(self) -> None:
        if self.prompt_tokens < self.remaining:
            object.__setattr__(self, "prompt_tokens", self.remaining)

    def view(self) -> QueuedRequest:
        """The request as the queue's view: its computed tokens as the cached prefix."""
        return QueuedRequest(
            self.request_id, self.arrival, self.prompt_tokens,
            self.prompt_tokens - self.remaining, self.tenant, self.priority,
        )


@dataclass(frozen=True, slots=True)
class StepBudget:
    """What one scheduling step can give to prefills (`Step.budget`).

    Attributes:
        tokens: the step's token budget minus what the running decodes need this step.
        free_slots: how many waiting requests the engine may still start (max_num_seqs - running).
        ahead: remaining tokens of requests the engine serves from the waiting queue before the
            policy's order (preempted requests it keeps at the head), in that order.
        ahead_ids: their ids.
        free_blocks: KV blocks the engine can still hand out this step (free or evictable);
            None: unknown, no KV stop is foreseen.
        block_size: tokens per KV block.
    """

    tokens: int
    free_slots: int
    ahead: tuple[int, ...] = ()
    ahead_ids: tuple[str, ...] = ()
    free_blocks: int | None = None
    block_size: int = 16


@dataclass(frozen=True, slots=True)
class Step:
    """What the engine tells a policy about the step it orders for (`Policy.ordering`).

    Attributes:
        now: the time, on the clock of `QueuedRequest.arrival`.
        head: how many positions of the order vLLM's scan can reach this step (None: any). A
            policy may order only those exactly and leave the other rows in row order.
        budget: the step's prefill budget, for a policy with `plans_steps` (None: no engine
            step follows, an order only).
        prefilling: the running requests whose prefill is not finished (`plans_steps` only).
        tenant_weights: the weight of each tenant code (`QueueColumns.tenant`), for policies
            that share the step between tenants; a code past its end weighs 1.
        kv_usage: the share of the KV cache's usable blocks in use before the step, 1 - free /
            usable (vLLM's `KVCacheManager.usage`; cached blocks no request holds count as
            free); None: unknown.
        num_ahead: positions at the head of vLLM's queue held by requests the engine keeps
            before the rows (preempted requests kept first), not given to the policy.
    """

    now: float
    head: int | None = None
    budget: StepBudget | None = None
    prefilling: Sequence[PrefillingRequest] = ()
    tenant_weights: tuple[float, ...] = ()
    kv_usage: float | None = None
    num_ahead: int = 0

    def weight_of(self, tenant: int) -> float:
        """The weight of tenant code `tenant` (1 when none is configured for it)."""
        weights = self.tenant_weights
        return weights[tenant] if 0 <= tenant < len(weights) else 1.0


@dataclass(frozen=True, slots=True)
class StepPlan:
    """A step-planning policy's decision for one step, beyond the waiting order (`Ordering.plan`).

    Attributes:
        front_id: the Fair lane's front (the oldest request not done with its prefill), if any.
        cap: per-request prefill cap for this step (vLLM's `long_prefill_token_threshold`), or
            None to leave the engine's own setting.
        running_order: prefilling running requests in the order to serve them this step (they
            trade places among the positions prefills hold in vLLM's running list).
        hold: prefilling running requests left out of this step.
        budget: the step's prefill tokens (budget minus decodes and the requests served first).
        contested: whether the lanes contest this step (the ledgers are charged after it).
        lanes: request id -> the lane ("fast" / "fair") it is charged to, for the placed requests.
    """

    front_id: str | None = None
    cap: int | None = None
    running_order: tuple[str, ...] = ()
    hold: frozenset[str] = frozenset()
    budget: int = 0
    contested: bool = False
    lanes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Ordering:
    """A policy's answer for one step (`Policy.ordering`).

    Attributes:
        order: a permutation of the queue's rows, highest priority first (a list or an int
            array; a policy that orders only the scan's head returns `head_order`).
        lanes: the lane that placed each position of `order` ("fast", "fair", or
            `UNPLACED_LANE` past an ordered head); None: the policy has one lane.
        plan: the step's token split, for a policy with `plans_steps` (None: vLLM's own).
    """

    order: Sequence[int] | np.ndarray
    lanes: Sequence[str] | None = None
    plan: StepPlan | None = None


@dataclass(slots=True)
class QueueColumns:
    """One step's orderable queue, row i describing the request at queue position i.

    Attributes:
        arrival: float64 seconds, on the clock of `now`.
        prompt_tokens: int64 L (prompt + output so far for a preempted request).
        cached_tokens: int64 h, block-granular, <= L (0 while a request is not yet probed).
        tickets: intp, a small integer per request (its ticket in the scheduler's table), stable
            while it waits and unique within the queue; reused after the request leaves. Policies
            keep per-request state in arrays indexed by it (LPM's rank, say) instead of dicts
            keyed by request id.
        new: bool, True for a request this policy has not been given before (its ticket's state is
            stale and must be initialised).
        tenant: intp, the tenant's code (`fairway.tenants.TenantTable`; 0: the default tenant);
            None: every row is the default tenant's.
        priority: int64, vLLM's priority level (lower first); None: every row is level 0.
        tier_tokens: int64, offload-tier hit tokens beyond the GPU hit; None: no tier.
    """

    arrival: np.ndarray
    prompt_tokens: np.ndarray
    cached_tokens: np.ndarray
    tickets: np.ndarray
    new: np.ndarray
    #: `rows -> their request ids` (read only for the rows a policy asks about).
    # speed: scheduler_overhead.py admit 10000 fairway: 2.21 ms -> 0.73 ms per step (ids on demand)
    ids_source: Callable[[Any], list[str]] = field(repr=False, default=lambda rows: [])
    _ids: list[str] | None = field(default=None, repr=False)
    tenant: np.ndarray | None = None
    priority: np.ndarray | None = None
    #: Tokens of each row's prompt that vLLM's CPU offload tier holds beyond its GPU hit (int64;
    #: None: no tier). `cached_tokens` already counts them at the tier rule's weight; vLLM loads
    #: them in the step that admits the row, which then computes nothing for it (the row waits
    #: for the copy and is computed from the next step on).
    tier_tokens: np.ndarray | None = None
    #: True for a row whose hit is not looked up yet (its `cached_tokens` 0 says nothing: vLLM
    #: may find any hit); None: every row's hit is known.
    unprobed: np.ndarray | None = None
    #: `rows -> bool array`: whether each of these rows is a plain waiting request
    #: (`QueuedRequest.plain`), read from the engine when asked (`plain_of`: call it within
    #: `ordering()`, a request's state changes with the step); None: every row is plain.
    plain_source: Callable[[np.ndarray], np.ndarray] | None = field(default=None, repr=False)
    #: Uncached work per request, at least 1 (as `QueuedRequest.remaining`), float64.
    remaining: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.remaining = np.maximum(self.prompt_tokens - self.cached_tokens, 1.0)

    @property
    def tenants(self) -> np.ndarray:
        """The tenant code of every row (zeros when the queue has no tenant column)."""
        if self.tenant is None:
            return np.zeros(len(self.arrival), dtype=np.intp)
        return self.tenant

    @property
    def priorities(self) -> np.ndarray:
        """The priority level of every row (zeros when the queue has no priority column)."""
        if self.priority is None:
            return np.zeros(len(self.arrival), dtype=np.int64)
        return self.priority

    @property
    def mixed(self) -> bool:
        """Whether the rows span more than one tenant or more than one priority level."""
        return any(
            col is not None and len(col) > 1 and col.min() != col.max()
            for col in (self.tenant, self.priority)
        )

    def __len__(self) -> int:
        return len(self.arrival)

    @property
    def request_ids(self) -> list[str]:
        """Request ids in row order (built on first use)."""
        if self._ids is None:
            self._ids = self.ids_source(slice(None))
        return self._ids

    def ids_of(self, rows: Any) -> list[str]:
        """Request ids of these rows (a sequence of indices), without building all of them."""
        if self._ids is not None:
            return [self._ids[i] for i in rows]
        return self.ids_source(np.asarray(rows, dtype=np.intp))

    def plain_of(self, rows: Any) -> np.ndarray:
        """Whether each of these rows (a sequence of indices) is a plain waiting request
        (`QueuedRequest.plain`), as a bool array; only those rows are read."""
        index = np.asarray(rows, dtype=np.intp)
        if self.plain_source is None:
            return np.ones(len(index), dtype=bool)
        return np.asarray(self.plain_source(index), dtype=bool)

    @property
    def oldest_row(self) -> int:
        """The row of the earliest arrival (the first of equals). The queue must not be empty."""
        return int(self.arrival.argmin())

    def views(self) -> list[QueuedRequest]:
        """The same queue as `QueuedRequest`s (the path for policies without columns)."""
        return list(
            map(
                QueuedRequest,
                self.request_ids,
                self.arrival.tolist(),
                self.prompt_tokens.tolist(),
                self.cached_tokens.tolist(),
                self.tenants.tolist(),
                self.priorities.tolist(),
                self.plain_of(np.arange(len(self))).tolist(),
            )
        )

    @classmethod
    def of(
        cls, queue: Sequence[QueuedRequest], tickets: Sequence[int] | None = None
    ) -> QueueColumns:
        """Columns of a list of views (tests, the replay); `tickets` default to the positions."""
        n = len(queue)
        ids = [r.request_id for r in queue]
        # lists, then arrays, for the few running prefills `fairway` builds columns of every
        # step: 8.0 -> 6.9 us per call of two views (np.fromiter over generators before; best
        # of 7 x 20,000 calls)
        tenant = np.array([r.tenant for r in queue], dtype=np.intp)
        priority = np.array([r.priority for r in queue], dtype=np.int64)
        plain = np.array([r.plain for r in queue], dtype=bool)
        return cls(
            arrival=np.array([r.arrival for r in queue], dtype=np.float64),
            prompt_tokens=np.array([r.prompt_tokens for r in queue], dtype=np.int64),
            cached_tokens=np.array([r.cached_tokens for r in queue], dtype=np.int64),
            tickets=(
                np.arange(n, dtype=np.intp) if tickets is None else np.asarray(tickets, np.intp)
            ),
            new=np.ones(n, dtype=bool),
            ids_source=lambda rows: np.asarray(ids, dtype=object)[rows].tolist(),
            tenant=tenant if tenant.any() else None,
            priority=priority if priority.any() else None,
            plain_source=None if plain.all() else plain.__getitem__,
        )


def head_order(head: Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    """The order `head` (distinct rows of range(n): a list of ints or an int array), then every
    other row in row order, as an intp array: what a policy that orders only the head of the
    queue exactly returns (`Step.head`)."""
    rows = np.asarray(head, dtype=np.intp)
    others = np.ones(n, dtype=bool)
    others[rows] = False
    order: np.ndarray = np.concatenate((rows, others.nonzero()[0]))
    return order


def check_permutation(order: object, n: int) -> np.ndarray:
    """`order` as an intp array if it is a permutation of range(n), else ValueError."""
    return check_order(order, n)[0]


def check_order(order: object, n: int) -> tuple[np.ndarray, int]:
    """`order` as an intp array if it is a permutation of range(n), else ValueError; and t, the
    number of rows it moves to the front: `order[t:]` ascends, so the new queue is the rows
    `order[:t]`, then every other row in its current order (the shape of a `head_order`;
    0: the identity)."""
    arr = np.asarray(order)
    if arr.shape != (n,) or (n and arr.dtype.kind not in "iu"):
        raise ValueError(f"expected {n} integer indices, got shape {arr.shape} of {arr.dtype}")
    if n == 0:
        return arr.astype(np.intp), 0
    arr = arr.astype(np.intp, copy=False)
    if arr.min() < 0:
        raise ValueError(f"indices out of range({n})")
    seen = np.zeros(n, dtype=bool)
    try:
        # an index >= n raises here: no scan for the maximum
        # speed: check_order alone, a 1,000-row order: 7.0 -> 6.0 us per call (best of 7 x
        # 20,000 calls)
        seen[arr] = True
    except IndexError:
        raise ValueError(f"indices out of range({n})") from None
    if not seen.all():
        raise ValueError("an index appears twice")
    breaks = np.flatnonzero(arr[1:] <= arr[:-1])  # where the order does not ascend strictly
    moved = int(breaks[-1]) + 1 if len(breaks) else 0
    return arr, moved


class TicketState:
    """A per-request int64 array a policy indexes by `QueueColumns.tickets` (grows as needed)."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values = np.zeros(0, dtype=np.int64)

    def view(self, tickets: np.ndarray) -> np.ndarray:
        """Values of these tickets (a copy), after growing the array to hold every ticket."""
        if len(tickets) and tickets.max() >= len(self.values):
            grown = np.zeros(max(2 * len(self.values), int(tickets.max()) + 1, 64), np.int64)
            grown[: len(self.values)] = self.values
            self.values = grown
        values: np.ndarray = self.values[tickets]
        return values

    def store(self, tickets: np.ndarray, values: np.ndarray) -> None:
        self.values[tickets] = values
