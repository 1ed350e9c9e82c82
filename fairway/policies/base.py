"""The policy contract and the registry by name. Must not import vllm.

Every ordering in this package is a `Policy`: it reads the waiting queue as `QueueColumns` and
returns an `Ordering` (`fairway.policies.queue`). The same policy objects serve vLLM's scheduler
(`fairway.vllm`) and the virtual-clock replay (`fairway.replay.sim`), so a result in the replay is
a result of the code that ships.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

from fairway.errors import FairwayConfigError
from fairway.policies.queue import Ordering, QueueColumns, QueuedRequest, Step


class Policy(ABC):
    """An ordering of the waiting queue, applied before every scheduling step.

    Subclasses are dataclasses whose fields are the policy's parameters (validated in
    `__post_init__`); state that must persist across steps (k-LPM's counter, Preble's pointer)
    lives in the object, so one object serves one queue.

    Two ways in, one rule:
        * `order(views, now)`: the rule in plain Python over `QueuedRequest`s, the reference a
          reader checks a policy against (and what tests and offline callers use);
        * `ordering(queue, step)`: what the engine calls before every step, over the scheduler's
          `QueueColumns`. The default runs `order` on the views; a policy with a faster path
          overrides it, and a property test keeps the two equal.

    Contract for callers (the scheduler, the replay):
        * call `ordering()` before every step in which a request can start (for a policy with
          `plans_steps` also when only prefills run; with `orders_every_step` before every
          step with a waiting request), apply its order (and plan);
        * call `step_without_prefill()` instead for a step in which no prefill can run
          (`plans_steps` only);
        * call `on_step_end()` after the step with the ids the engine started from that order
          and the prefill tokens it scheduled (stateful policies count admissions, not
          placements; HRRN ages by prefill tokens processed); a policy with `plans_steps` also
          gets the tokens per request.
    """

    #: The registry name (`register_policy`); an object built by an alias's name carries that.
    name: str = ""
    #: The ordering reads `cached_tokens`: the engine must have prefix caching on.
    needs_cache_hits: ClassVar[bool] = False
    #: The ordering keeps state across steps (see `on_step_end`).
    stateful: ClassVar[bool] = False
    #: The policy plans each step's token split (`Ordering.plan`): it wants the step's budget and
    #: running prefills in `Step`, and `on_step_end`'s `prefill_by_request`.
    plans_steps: ClassVar[bool] = False
    #: The ordering reads which requests are plain waiting ones (`QueuedRequest.plain`,
    #: `QueueColumns.plain_of`): the engine fills that in for such a policy only (a read per
    #: row); to any other policy every row reads as plain.
    reads_plain: ClassVar[bool] = False
    #: The policy is asked also in a step in which no waiting request can start (no free request
    #: slot): its order persists in vLLM's queue and the next step starts from it, as vLLM's own
    #: in-place re-sorts do (`vllm-window`), or it must see every step a request waits through
    #: (`hrrn`'s token clock, `suf`'s iteration counts). Not for a policy with `plans_steps`.
    orders_every_step: ClassVar[bool] = False

    @abstractmethod
    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """The rule: a permutation of `range(len(queue))`, highest priority first."""

    def ordering(self, queue: QueueColumns, step: Step) -> Ordering:
        """This step's order of `queue` (see the class docstring). Default: `order()` on the
        queue's views, every position exact."""
        return Ordering(self.order(queue.views(), step.now))

    def step_without_prefill(self) -> None:  # noqa: B027 - optional hook
        """A step in which no prefill can run: no free request slot and no running request in
        prefill. The engine skips `ordering()` for it (policies with `plans_steps`): nothing
        can start and nothing is capped. Default: nothing."""

    def on_step_end(  # noqa: B027 - optional hook
        self,
        admitted_ids: Sequence[str],
        prefill_tokens: int,
        prefill_by_request: Mapping[str, int] | None = None,
    ) -> None:
        """Observe the step just ordered (default: nothing).

        Args:
            admitted_ids: waiting requests the engine started in this step, in admission order.
            prefill_tokens: prompt tokens the engine computed in this step (all requests).
            prefill_by_request: request id -> prompt tokens the engine scheduled for it in this
                step, running prefills included; given to policies with `plans_steps` only.
        """

    @property
    def remembered(self) -> Mapping[str, Any]:
        """What the policy keeps across steps, by request id (read-only; tests read it to check
        that memory is bounded by the queue: ids that left it are forgotten at the next call).
        A stateful policy says what in `_memory`; default: nothing."""
        return MappingProxyType(self._memory())

    def _memory(self) -> Mapping[str, Any]:
        return {}

    def fast_scores(self, queue: Sequence[QueuedRequest], now: float) -> list[float] | None:
        """The Fast-lane score of each request, for the decision trace; None: the policy has
        no such score."""
        return None

    def ledgers(self) -> dict[str, float] | None:
        """The lane ledgers after the last booked step, for the decision trace; None: the
        policy keeps none."""
        return None

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
    """Indices by (arrival, position): the FCFS order, with ties kept in queue order (also
    the Fair lane of `fairway-step`)."""
    return sorted(range(len(queue)), key=lambda i: queue[i].arrival)


# --- registry -------------------------------------------------------------------------------------

PolicyClass = TypeVar("PolicyClass", bound=type[Policy])


@dataclass(frozen=True)
class _Entry:
    cls: type[Policy]
    presets: dict[str, Any]


_REGISTRY: dict[str, _Entry] = {}


def register_policy(name: str, **presets: Any) -> Callable[[PolicyClass], PolicyClass]:
    """Class decorator: make the policy available as `name` (kebab-case), with preset parameters.

    The same class may be registered under several names (`klpm`, `klpm-4` with `k=4`). A name
    registered twice raises, so two modules cannot silently shadow each other.
    """

    def decorate(cls: PolicyClass) -> PolicyClass:
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

