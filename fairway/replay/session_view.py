"""The session view of a replay: how agent sessions fared end to end, per policy.

A trace with sessions (requests tagged `session`, turns linked by `parent`: see
`fairway.replay.sessions`) is judged by its users per session, not per request: an agent waits for
every turn in turn, so a policy that keeps each turn's TTFT fine but turns the session's cache
hits into misses (or makes turns wait behind others) shows up here first. This module defines
what is counted; `fairway.replay.summary.SessionStats` holds the numbers. Per policy:

* sessions: how many, and how many are complete (every turn got a first token);
* end-to-end time of a complete session: its first request's arrival -> its last request's first
  token (the earliest arrival and the latest first token among its turns; in a closed-loop replay
  this includes the think times, which are the same under every policy);
* hits at admission (`SESSION_HIT_DEFINITION`): of the turns with a parent, how many found their
  session's previous context in the cache when first scheduled.

Results carry no prompt blocks, so the tokens a turn shares with its parent are not known from
them; the rule instead compares the turn's cached tokens with its parent's whole prompt, less one
KV block (vLLM caches full blocks only, so a reused parent prompt leaves at most one partial
block uncached). That is exact for traces whose turns extend their parent's prompt (MuSiQue).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from fairway.replay.results import RequestResult
from fairway.replay.sessions import SESSION_TAG, parent_of

#: Tokens of one KV block (vLLM's default, the virtual replay's): the slack of a session hit.
SESSION_HIT_SLACK_TOKENS: Final = 16
#: The definition in words, for reports.
SESSION_HIT_DEFINITION: Final = (
    "session hit at admission: a turn with a parent whose cached tokens when first scheduled "
    f"are at least its parent's prompt tokens minus one KV block ({SESSION_HIT_SLACK_TOKENS} "
    "tokens), i.e. the session's previous context was reused; a turn whose cached tokens are "
    "unknown (never scheduled, or not reported by a live server) is counted as unknown"
)

SESSION_END_TO_END_DEFINITION: Final = (
    "session end to end: its first request's arrival -> its last request's first token, over "
    "the sessions whose every turn got a first token (closed loop: think times included)"
)


@dataclass(frozen=True, slots=True)
class SessionFacts:
    """The sessions of one result, counted (`fairway.replay.summary` turns them into stats).

    Attributes:
        n_sessions: distinct `session` tags.
        end_to_end_s: end-to-end seconds of each complete session (every turn got a first
            token), in order of first appearance; the others have no end-to-end time.
        n_turns_with_parent: turns that name a parent present in the result.
        n_hits: of those, hits at admission (`SESSION_HIT_DEFINITION`).
        n_unknown: of those, turns whose cached tokens are unknown.
    """

    n_sessions: int
    end_to_end_s: tuple[float, ...]
    n_turns_with_parent: int
    n_hits: int
    n_unknown: int


def end_to_end_s(turns: Sequence[RequestResult]) -> float | None:
    """First arrival -> last first token of one session; None unless every turn answered."""
    tokens = [r.first_token_s for r in turns]
    if any(r.error is not None for r in turns) or None in tokens:
        return None
    return max(t for t in tokens if t is not None) - min(r.arrival_s for r in turns)


def session_hit(turn: RequestResult, parent: RequestResult) -> bool | None:
    """Whether `turn` reused its parent's context at admission; None when unknown."""
    if turn.cached_tokens is None:
        return None
    return turn.cached_tokens >= max(parent.prompt_tokens - SESSION_HIT_SLACK_TOKENS, 0)


def session_facts(requests: Sequence[RequestResult]) -> SessionFacts | None:
    """The session view of one result; None when no request is tagged with a `session`."""
    sessions: dict[str, list[RequestResult]] = {}
    for r in requests:
        if r.tags.get(SESSION_TAG) is not None:
            sessions.setdefault(str(r.tags[SESSION_TAG]), []).append(r)
    if not sessions:
        return None
    times = [t for t in (end_to_end_s(turns) for turns in sessions.values()) if t is not None]
    by_id = {r.request_id: r for r in requests}
    hits = []
    for r in requests:
        parent = parent_of(r.tags)
        if parent is not None and parent in by_id:
            hits.append(session_hit(r, by_id[parent]))
    return SessionFacts(
        len(sessions), tuple(times), len(hits), sum(1 for h in hits if h is True),
        sum(1 for h in hits if h is None),
    )
