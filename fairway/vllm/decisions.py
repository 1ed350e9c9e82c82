"""The decision trace: every N ordered steps, the head of the queue as Fairway ordered it, as JSONL.

Answers "why did request X wait 40 s": each record shows the first requests of Fairway's order with
what the policy saw (h cached tokens, c tokens to compute, wait, score, lane), the policy's ledgers
when it exposes them, and which of them vLLM admitted. Off by default; when off the scheduler
never builds this object (one `is None` check per step). When on, a record is built only every
N-th step with a waiting queue, and the file is size-bounded: at `max_bytes` it is rotated to
`PATH.1` (the previous `PATH.1` to `PATH.2`, ...), keeping `backups` old files.

Record (one JSON object per line)::

    {"step": 120, "time_s": 1764510000.12, "policy": "fairway", "ordered": true,
     "queue_len": 37, "fixed": 0, "admitted": ["r7", "r3"],
     "ledgers": {"fair_deficit": 120, ...}, "share": {"front_id": "r3", "cap": 384, ...},
     "tenant_counters": {"default": 0.0, "team-a": 512.0},
     "head": [{"pos": 0, "id": "r7", "lane": "fast", "L": 1088, "h": 1024, "c": 64,
               "wait_s": 0.41, "score": 16.4, "admitted": true}, ...]}

`ordered` is false on a step whose ordering failed (vLLM's order was kept; `head` is empty).
`fixed` counts preempted requests vLLM keeps at the front, before `head`. `ledgers` (the policy's
`Policy.ledgers()`, after this step was booked) and `share` (a step-planning policy's
`StepPlan`: the Fair front, the step's per-request cap, held-back prefills, ...) are null for
policies without them. `tenant_counters` (only with the `tenants` option, only for a policy that
keeps them: `fairway`; absent when empty) maps each tenant present at the top priority level to
its counter, uncached tokens served over its weight relative to the lowest (`default` also pools
the unlisted names).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from fairway.policies.base import Policy
from fairway.policies.queue import QueuedRequest, StepPlan

#: Old files kept next to the current one (PATH.1 ... PATH.<backups>).
DEFAULT_BACKUPS = 2


class RotatingJsonl:
    """Append JSON lines to a file; past `max_bytes` rotate it (PATH -> PATH.1 -> PATH.2 ...).

    Our own ten lines rather than `logging.handlers.RotatingFileHandler`: no logger, formatter or
    lock on the engine's thread, and the size check needs no `seek`.
    """

    def __init__(self, path: str | os.PathLike[str], max_bytes: int, backups: int) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._size = self.path.stat().st_size

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record (one line); flushed, so a crash loses nothing already written."""
        line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
        size = len(line.encode())
        if self._size and self._size + size > self.max_bytes:
            self._rotate()
        self._file.write(line)
        self._file.flush()
        self._size += size

    def _rotate(self) -> None:
        self._file.close()
        for k in range(self.backups, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{k}")
            newer = self.path.with_name(f"{self.path.name}.{k - 1}") if k > 1 else self.path
            if newer.exists():
                os.replace(newer, older)
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._size = 0

    def close(self) -> None:
        """Close the file (later writes raise)."""
        self._file.close()


@dataclass(frozen=True, slots=True)
class TraceSettings:
    """The decision-trace options (`decision_trace*` Fairway options)."""

    path: str
    every: int = 10
    head: int = 16
    max_bytes: int = 64 * 1024 * 1024
    backups: int = DEFAULT_BACKUPS


class DecisionTrace:
    """Builds and writes the records; the scheduler calls `after_step` once per step."""

    def __init__(self, settings: TraceSettings) -> None:
        self.settings = settings
        self.writer = RotatingJsonl(settings.path, settings.max_bytes, settings.backups)
        self._steps = 0  # steps with a waiting queue seen so far
        self.records = 0  # records written

    def after_step(
        self,
        *,
        now: float,
        policy: Policy,
        ordered: bool,
        views: Sequence[QueuedRequest],
        order: Sequence[int],
        lanes: Sequence[str] | None,
        plan: StepPlan | None,
        num_fixed: int,
        admitted: Sequence[str],
        scheduled: Mapping[str, int] | set[str],
        tenant_names: Sequence[str] = (),
    ) -> bool:
        """Write a record if this is the N-th step with a queue; returns whether it wrote.

        Args:
            now: the time the policy ordered with (clock of the requests' arrival).
            policy: the policy object (for its name, `fast_scores` and `ledgers`).
            ordered: False when the ordering failed this step and vLLM's order was kept.
            views / order: the policy's input and output of this step.
            lanes / plan: the lane of each ordered position and the step's plan (`Ordering`).
            num_fixed: preempted requests kept ahead of the order.
            admitted: ids vLLM admitted from the waiting queue this step, in order.
            scheduled: ids scheduled this step (any request).
            tenant_names: the name of each tenant code (`TenantTable.names`; empty: no tenants),
                for the policy's `tenant_counters` (written only when non-empty).
        """
        self._steps += 1
        if (self._steps - 1) % self.settings.every:
            return False
        head = (
            _head(policy, views, order, lanes, now, self.settings.head, scheduled)
            if ordered else []
        )
        record: dict[str, Any] = {
            "step": self._steps,
            "time_s": round(now, 6),
            "policy": policy.name,
            "ordered": ordered,
            "queue_len": num_fixed + len(views) if ordered else None,
            "fixed": num_fixed,
            "admitted": list(admitted),
            "ledgers": _ledgers(policy),
            "share": _plan(plan) if ordered else None,
        }
        counters = tenant_counters(policy, tenant_names)
        if counters:
            record["tenant_counters"] = counters
        record["head"] = head
        self.writer.write(record)
        self.records += 1
        return True

    def close(self) -> None:
        """Close the file."""
        self.writer.close()


def _head(
    policy: Policy,
    views: Sequence[QueuedRequest],
    order: Sequence[int],
    lanes: Sequence[str] | None,
    now: float,
    limit: int,
    scheduled: Mapping[str, int] | set[str],
) -> list[dict[str, Any]]:
    if lanes is not None and len(lanes) != len(order):
        lanes = None
    head = [views[i] for i in order[:limit]]
    scores = policy.fast_scores(head, now)
    rows = []
    for pos, view in enumerate(head):
        rows.append(
            {
                "pos": pos,
                "id": view.request_id,
                "lane": lanes[pos] if lanes is not None else "single",
                "L": view.prompt_tokens,
                "h": view.cached_tokens,
                "c": view.remaining,
                "wait_s": round(max(now - view.arrival, 0.0), 6),
                "score": _finite(scores[pos]) if scores is not None else None,
                "admitted": view.request_id in scheduled,
            }
        )
    return rows


def tenant_counters(policy: Policy, names: Sequence[str]) -> dict[str, float | int | None]:
    """The policy's tenant counters (`FairwayPolicy.tenant_counters`: code -> counter) by tenant
    name; empty without tenants, for a policy without counters, or after a one-class step."""
    get = getattr(policy, "tenant_counters", None) if names else None
    if not callable(get):
        return {}
    return {
        names[code] if 0 <= code < len(names) else str(code): _finite(value)
        for code, value in get().items()
    }


def _ledgers(policy: Policy) -> dict[str, float | int | None] | None:
    """The policy's lane ledgers after this step was booked, if it keeps them."""
    ledgers = policy.ledgers()
    if ledgers is None:
        return None
    return {str(k): _finite(v) for k, v in ledgers.items()}


def _plan(plan: StepPlan | None) -> dict[str, Any] | None:
    """The step's plan of a step-planning policy (front, cap, hold, ...), JSON-ready."""
    if plan is None:
        return None
    out: dict[str, Any] = {}
    for f in dataclasses.fields(plan):
        value = getattr(plan, f.name)
        out[f.name] = sorted(value) if isinstance(value, set | frozenset) else (
            list(value) if isinstance(value, tuple) else value)
    return out


def _finite(value: Any) -> float | int | None:
    """A JSON-safe number: ints and bools as they are, floats to 6 places; NaN and infinities:
    None."""
    if isinstance(value, int):  # bools stay bools
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return round(number, 6) if number == number and abs(number) != float("inf") else None
