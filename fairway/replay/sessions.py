"""Closed-loop sessions: when each trace request enters a replay.

A request whose tags name a ``parent`` (the id of an earlier request of the same trace) and a
``think_s`` (seconds >= 0) is a turn of an agent session. An agent cannot send turn k+1 before
turn k is answered, so a replay releases such a request ``think_s`` after its parent's first token
(on a prefill node that token is the answer), or after its parent's failure (every request still
gets exactly one result). This is the default: replaying a session at its recorded arrival would
send a turn whose question does not exist yet, and the cache sees turns overlap that an agent
never overlaps. A request without a parent keeps its recorded ``arrival_s`` (open loop: those
arrivals are the offered load), and ``open_loop=True`` keeps every recorded arrival.

`Releases` is the bookkeeping both replays share in spirit (the virtual loop uses it as it is;
the live replay waits on its own events): a heap of (release time, trace index), filled with the
requests without a parent at the start and with each child when its parent is resolved.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from fairway.errors import TraceError

if TYPE_CHECKING:
    from fairway.traces.format import TraceRequest

#: The tags of a session turn (`fairway.traces.musique` writes them).
PARENT_TAG: Final = "parent"
THINK_TAG: Final = "think_s"
SESSION_TAG: Final = "session"
#: Set on a released request's result tags: the arrival the trace recorded (the open-loop one).
RECORDED_ARRIVAL_TAG: Final = "recorded_arrival_s"
#: `settings["arrivals"]` of a replay of a trace with parents (absent for a trace without).
CLOSED_LOOP: Final = "closed-loop"
OPEN_LOOP: Final = "open-loop"


def parent_of(tags: Mapping[str, Any]) -> str | None:
    """The parent request id a request's tags name, or None (a first turn, or no session)."""
    parent = tags.get(PARENT_TAG)
    return None if parent is None else str(parent)


def has_parents(requests: Sequence[TraceRequest]) -> bool:
    """Whether any request names a parent (only then do closed and open loop differ)."""
    return any(parent_of(r.tags) is not None for r in requests)


def arrivals_setting(requests: Sequence[TraceRequest], open_loop: bool) -> str | None:
    """`settings["arrivals"]`: closed-loop or open-loop for a trace with parents, else None
    (no key, so a replay of a trace without sessions is byte for byte what it was)."""
    if not has_parents(requests):
        return None
    return OPEN_LOOP if open_loop else CLOSED_LOOP


def think_time(req: TraceRequest) -> float:
    """The request's ``think_s`` tag, checked: a finite number >= 0.

    Raises:
        TraceError: missing, not a number, negative or not finite.
    """
    think = req.tags.get(THINK_TAG)
    if isinstance(think, bool) or not isinstance(think, int | float) or not (
            math.isfinite(think) and think >= 0):
        raise TraceError(
            f"request {req.request_id!r} names parent {parent_of(req.tags)!r} but its "
            f"{THINK_TAG} tag is {think!r}; a session turn needs a think time in seconds >= 0"
        )
    return float(think)


def session_children(requests: Sequence[TraceRequest]) -> dict[int, list[tuple[int, float]]]:
    """Parent index -> [(child index, think seconds)], children in trace order.

    Raises:
        TraceError: a parent that is not an earlier request of the trace, or a bad think time.
    """
    index: dict[str, int] = {}
    children: dict[int, list[tuple[int, float]]] = {}
    for i, req in enumerate(requests):
        parent = parent_of(req.tags)
        if parent is not None:
            if parent not in index:
                raise TraceError(
                    f"request {req.request_id!r} names parent {parent!r}, which is not an "
                    "earlier request of the trace (a turn is released after its parent's answer)"
                )
            children.setdefault(index[parent], []).append((i, think_time(req)))
        index[req.request_id] = i
    return children


class Releases:
    """When each request of a replay enters the engine: a heap of (release time, trace index).

    Ties on time go to trace order, so a trace without parents is released exactly in file
    order at its recorded arrivals (what the open-loop replay always did).
    """

    def __init__(self, requests: Sequence[TraceRequest], *, open_loop: bool = False) -> None:
        self.children = {} if open_loop else session_children(requests)
        #: Trace indices of the requests that wait for a parent (none in open loop).
        self.waiting = frozenset(child for kids in self.children.values() for child, _ in kids)
        #: Release time per trace index; None until known (a child before its parent resolves).
        self.release_s: list[float | None] = [
            None if i in self.waiting else r.arrival_s for i, r in enumerate(requests)]
        self._heap: list[tuple[float, int]] = [
            (t, i) for i, t in enumerate(self.release_s) if t is not None]
        heapq.heapify(self._heap)
        self._resolved = [False] * len(requests)

    def next_s(self) -> float | None:
        """The earliest pending release, or None when nothing waits in the heap."""
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[int]:
        """Pop every release at or before `now`, in (time, trace index) order."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[1])
        return out

    def resolved(self, index: int, when: float) -> None:
        """Request `index` got its first token (or failed) at `when`: its children are due
        their think time later. Only the first call per request counts."""
        if self._resolved[index]:
            return
        self._resolved[index] = True
        for child, think in self.children.get(index, ()):
            release = when + think
            self.release_s[child] = release
            heapq.heappush(self._heap, (release, child))
