"""Whether a live replay measured something: its failures grouped by cause, and a verdict.

`fairway replay` used to print "wrote the live replay (9 errors)" and exit 0 when every request
failed, with the cause only in the JSON. This module turns the per-request `error` strings into a
few lines a user can act on (the first distinct causes, with counts) and decides whether the run
succeeded: enough requests got a first token, and the server did not stop answering.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from fairway.replay.results import ReplayResult

#: A live replay in which fewer requests than this share got a first token fails (exit 1).
#: Errors in a live replay are not queueing (a request waits up to its timeout): they are a server
#: or set-up problem, so a tenth of them already makes the TTFT numbers suspect.
DEFAULT_MIN_SUCCESS = 0.9
#: How many distinct causes the terminal summary lists.
MAX_CAUSES = 3
#: `settings` key of a live replay whose server stopped answering (the value is the reason).
SERVER_STOPPED = "server_stopped"
#: The message a replay whose server went away ends with (tests and docs look for it).
STOPPED_MESSAGE = "the server stopped answering"

_NUMBER = re.compile(r"\d+(\.\d+)?")


@dataclass(frozen=True)
class Cause:
    """Requests that failed the same way: one example message and how many."""

    example: str
    count: int


@dataclass(frozen=True)
class Verdict:
    """How a live replay went, for the terminal and the exit code."""

    total: int
    succeeded: int
    min_success: float
    causes: tuple[Cause, ...]
    #: Why the replay decided the server stopped answering, or None.
    server_stopped: str | None

    @property
    def share(self) -> float:
        """Share of the requests that got a first token (1.0 for an empty trace)."""
        return self.succeeded / self.total if self.total else 1.0

    @property
    def ok(self) -> bool:
        """The run measured something: the server kept answering and enough requests succeeded."""
        return self.server_stopped is None and self.total > 0 and self.share >= self.min_success

    def lines(self) -> list[str]:
        """The terminal summary: the failure causes (most frequent first) and the verdict."""
        failed = self.total - self.succeeded
        out = []
        if self.server_stopped is not None:
            out.append(f"{STOPPED_MESSAGE} ({self.server_stopped})")
        if failed:
            out.append(f"{failed} of {self.total} requests failed; causes:")
            out.extend(f"  {c.count} x {c.example}" for c in self.causes)
            shown = sum(c.count for c in self.causes)
            if shown < failed:
                out.append(f"  {failed - shown} more with other causes (see the result JSON)")
        if not self.ok and self.server_stopped is None:
            out.append(
                f"only {self.succeeded} of {self.total} requests ({self.share:.0%}) got a first "
                f"token; --min-success is {self.min_success:g}"
            )
        return out


def cause_key(error: str) -> str:
    """Errors that differ only in numbers (token ids, sizes, times) are one cause."""
    return _NUMBER.sub("N", error)


def group_errors(errors: Sequence[str], limit: int = MAX_CAUSES) -> tuple[Cause, ...]:
    """The `limit` most frequent causes (first seen first among equals), each with an example."""
    counts: dict[str, int] = {}
    examples: dict[str, str] = {}
    for error in errors:
        key = cause_key(error)
        counts[key] = counts.get(key, 0) + 1
        examples.setdefault(key, error)
    ranked = sorted(counts, key=lambda k: -counts[k])  # stable: ties keep first-seen order
    return tuple(Cause(examples[k], counts[k]) for k in ranked[:limit])


def verdict(result: ReplayResult, min_success: float = DEFAULT_MIN_SUCCESS) -> Verdict:
    """The verdict of a live replay result (requests without a TTFT count as failed)."""
    failed = [r for r in result.requests if r.ttft_s is None]
    errors = [r.error or "no first token" for r in failed]
    return Verdict(
        total=len(result.requests),
        succeeded=len(result.requests) - len(failed),
        min_success=min_success,
        causes=group_errors(errors),
        server_stopped=result.settings.get(SERVER_STOPPED),
    )
