"""The queue view, the policy contract and the registry by name. Must not import vllm.

Every ordering in this package sees the waiting queue as a sequence of `QueuedRequest`s and returns
a permutation of their indices, highest priority first. The same policy objects serve vLLM's
scheduler (`fairway.vllm`) and the virtual-clock replay (`fairway.replay.sim`), so a result in the
replay is a result of the code that ships.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from fairway.errors import FairwayConfigError

if TYPE_CHECKING:
    import numpy as np

    from fairway.policies.columns import HeadOrder, QueueColumns

#: The lane label of an ordered position that `Policy.order_head` left in queue order: no lane
#: placed it. Equal to `fairway.vllm.metrics.NO_LANE` ("admitted outside Fairway's order");
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
    """

    request_id: str
    arrival: float
    prompt_tokens: int
    cached_tokens: int

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


@dataclass(slots=True)
class PrefillingRequest:
    """A running request whose prefill is not finished (vLLM continues it before the queue).

    Read-only by contract, not frozen: the scheduler builds one per running prefill every step,
    and a frozen dataclass's `__init__` sets each field through `object.__setattr__`.

    Attributes:
        request_id: the engine's id.
        arrival: arrival time, on the clock of `QueuedRequest.arrival`.
        remaining: prompt tokens still to compute (>= 1).
        prompt_tokens: its full length L (prompt, plus output so far when resumed); the tokens
            already computed, L - remaining, play the cached prefix's part in the Fast score.
    """

    request_id: str
    arrival: float
    remaining: int
    prompt_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prompt_tokens < self.remaining:
            self.prompt_tokens = self.remaining


@dataclass(frozen=True, slots=True)
class StepBudget:
    """What one scheduling step can give to prefills, for `Policy.step_share`.

    Attributes:
        tokens: P, the step's token budget minus what the running decodes need this step.
        free_slots: how many waiting requests the engine may still start (max_num_seqs - running).
        ahead: remaining tokens of requests the engine serves from the waiting queue before the
            policy's order (preempted requests it keeps at the head), in that order.
        ahead_ids: their ids.
        scan: how many positions of the waiting order vLLM's scan can reach this step (None:
            any); a policy may order only those exactly and leave the rest in row order.
    """

    tokens: int
    free_slots: int
    ahead: tuple[int, ...] = ()
    ahead_ids: tuple[str, ...] = ()
    scan: int | None = None


@dataclass(frozen=True, slots=True)
class StepShare:
    """A cross-step policy's decision for one step (see `Policy.step_share`).

    Attributes:
        waiting_order: the waiting queue's new order (a permutation of its indices, or a
            `HeadOrder`).
        front_id: the Fair lane's front (the oldest request not done with its prefill), if any.
        cap: per-request prefill cap for this step (vLLM's `long_prefill_token_threshold`), or
            None to leave the engine's own setting.
        running_order: prefilling running requests in the order to serve them this step (they
            trade places among the positions prefills hold in vLLM's running list).
        hold: prefilling running requests left out of this step.
        budget: P, the step's prefill tokens (budget minus decodes and the requests served first).
        contested: whether the lanes contest this step (the ledgers are charged after it).
        lanes: request id -> the lane ("fast" / "fair") that placed it, for the placed requests.
    """

    waiting_order: Sequence[int] | np.ndarray
    front_id: str | None = None
    cap: int | None = None
    running_order: tuple[str, ...] = ()
    hold: frozenset[str] = frozenset()
    budget: int = 0
    contested: bool = False
    lanes: Mapping[str, str] = field(default_factory=dict)


class Policy:
    """An ordering of the waiting queue, applied before every scheduling step.

    Subclasses are dataclasses whose fields are the policy's parameters (validated in
    `__post_init__`); state that must persist across steps (k-LPM's counter, Preble's pointer) lives
    in the object, so one object serves one queue.

    Contract for callers:
        * call `order()` once per step with the whole waiting queue;
        * call `on_step_end()` after the step with the ids the engine actually started from that
          order and the prefill tokens it scheduled (stateful policies count admissions, not
          placements; HRRN ages by prefill tokens processed);
        * for a policy with `shares_steps`: call `step_share()` instead of `order()` before
          every step (also with an empty queue while prefills run), apply its split, and pass
          `prefill_by_request` to `on_step_end()`.
    """

    name: ClassVar[str] = ""
    #: The ordering reads `cached_tokens`: the engine must have prefix caching on.
    needs_cache_hits: ClassVar[bool] = False
    #: The ordering keeps state across steps (see `on_step_end`).
    stateful: ClassVar[bool] = False
    #: The policy decides each step's token split (`step_share`) and wants `on_step_end`'s
    #: `prefill_by_request`; callers call `step_share` instead of `order`.
    shares_steps: ClassVar[bool] = False
    #: The policy can order just the head of the queue exactly (`order_head`). Only for policies
    #: that keep no state across steps: the positions past the head are not ordered at all.
    orders_head: ClassVar[bool] = False

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """Return a permutation of `range(len(queue))`, highest priority first."""
        raise NotImplementedError

    def order_head(self, cols: QueueColumns, now: float, head: int) -> np.ndarray | HeadOrder:
        """The first `head` positions of the order, then the other rows in row (queue) order
        (best as a `HeadOrder`: the scheduler then checks and applies only its head).

        For policies with `orders_head`. vLLM's scan admits at most its free request slots from
        the head of the queue, in order, so a caller that knows no more than `head` positions can
        be admitted this step asks for these only. Contract: a permutation of `range(len(cols))`
        whose first min(head, n) entries equal those of the full order exactly (same ties), and
        whose other entries are the remaining rows in increasing row order; `last_lanes` (if the
        policy keeps it) labels those positions `UNPLACED_LANE`. Cost: O(n) numpy + O(head)
        Python, where the full order costs O(n log n) and per-request Python.
        """
        raise NotImplementedError

    def step_share(
        self,
        waiting: Sequence[QueuedRequest],
        prefilling: Sequence[PrefillingRequest],
        budget: StepBudget | None,
        now: float,
    ) -> StepShare:
        """The waiting order plus the step's token split (policies with `shares_steps`).

        Called instead of `order()` before every step, also when the waiting queue is empty.
        `budget` None: no engine step follows (an order only). Default: `order()`, no split.
        """
        return StepShare(self.order(waiting, now) if waiting else [])

    def idle_step(self) -> None:  # noqa: B027 - optional hook
        """A step in which no prefill can run: no free request slot and no running request in
        prefill. The engine skips `step_share()` for it (policies with `shares_steps`): nothing
        can start and nothing is capped. Default: nothing."""

    def on_step_end(  # noqa: B027 - optional hook
        self, admitted_ids: Sequence[str], prefill_tokens: int
    ) -> None:
        """Observe the step just ordered (default: nothing).

        Policies with `shares_steps` also get `prefill_by_request=` (a mapping request id ->
        prompt tokens the engine scheduled for it in this step, running prefills included); the
        others are called with the two arguments only, so older policies keep working.

        Args:
            admitted_ids: waiting requests the engine started in this step, in admission order.
            prefill_tokens: prompt tokens the engine computed in this step (all requests).
        """

    def params(self) -> dict[str, Any]:
        """The policy's parameters (its dataclass init fields), for logs and result files."""
        if not dataclasses.is_dataclass(self):
            return {}
        return {
            f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.init
        }


def _plain(value: Any) -> Any:
    describe = getattr(value, "describe", None)
    return describe() if callable(describe) else value


def arrival_order(queue: Sequence[QueuedRequest]) -> list[int]:
    """Indices by (arrival, position): the FCFS order, with ties kept in queue order."""
    return sorted(range(len(queue)), key=lambda i: queue[i].arrival)


# --- registry -------------------------------------------------------------------------------------

P = TypeVar("P", bound=type[Policy])


@dataclass(frozen=True)
class _Entry:
    cls: type[Policy]
    presets: dict[str, Any]


_REGISTRY: dict[str, _Entry] = {}


def register_policy(name: str, **presets: Any) -> Callable[[P], P]:
    """Class decorator: make the policy available as `name` (kebab-case), with preset parameters.

    The same class may be registered under several names (`klpm`, `klpm-4` with `k=4`). A name
    registered twice raises, so two modules cannot silently shadow each other.
    """

    def decorate(cls: P) -> P:
        if name in _REGISTRY:
            raise ValueError(f"policy name {name!r} is already registered by {_REGISTRY[name].cls}")
        _REGISTRY[name] = _Entry(cls, dict(presets))
        if not presets:  # the canonical name; presets are aliases
            cls.name = name
        return cls

    return decorate


def names() -> list[str]:
    """All registered policy names, sorted."""
    return sorted(_REGISTRY)


def param_names(name: str) -> list[str]:
    """The parameters policy `name` accepts (its dataclass init fields)."""
    cls = _entry(name).cls
    if not dataclasses.is_dataclass(cls):
        return []
    return [f.name for f in dataclasses.fields(cls) if f.init]


def _entry(name: str) -> _Entry:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise FairwayConfigError(
            f"unknown policy {name!r}; known policies: {', '.join(names())}"
        ) from None


def get(name: str, **params: Any) -> Policy:
    """Build a fresh policy object by registry name; unknown names or parameters raise.

    Raises:
        FairwayConfigError: the name is unknown, a parameter is unknown, or a value is out of range
            (the message names the parameter and what is allowed).
    """
    entry = _entry(name)
    known = param_names(name)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise FairwayConfigError(
            f"policy {name!r} has no parameter {', '.join(map(repr, unknown))}; "
            f"its parameters are: {', '.join(known) or '(none)'}"
        )
    try:
        policy = entry.cls(**{**entry.presets, **params})
    except FairwayConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise FairwayConfigError(f"policy {name!r}: {exc}") from exc
    # Registered aliases share a class: the object reports the name it was built by.
    policy.name = name
    return policy


make_policy = get
