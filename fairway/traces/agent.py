"""Agent sessions: coding-agent sessions whose context grows turn by turn, with subagents.

A coding agent (Claude Code, Codex) calls the model in a loop: each call (a *turn*) re-sends the
whole previous prompt plus what happened since, the model's previous answer and the tool output
(or the user's next message), so every turn extends its parent exactly and a prefix cache can
serve all of it but the new part::

    turn 0: [system + tools] [task]
    turn k: <turn k-1 blocks> [answer k-1 + tool output k]

All sessions share the system-and-tools block (``ag-system-<tokens>``); a session's own blocks
carry the seed (``ag<seed>-s<session>-t<turn>``), so two sessions never share more than the
system block. A session ends after its drawn number of turns, or before the turn whose prompt
would exceed `max_prompt_tokens` (131,072: the replay's model context). A turn's answer may spawn
a **subagent** (Claude Code's Task tool): its own short context, ``[subagent system] [task]``
then a few turns, all subagents sharing one subagent system block; the main session continues
when the subagent has answered. A subagent is a session of its own (``s<session>-a<j>``).

**Tags.** Every request has ``session``, ``turn`` (0 first), ``agent`` (main or sub) and
``trigger`` (start, tool, user, task: a subagent's first turn, subagent: the main turn after one).
Every request but a main session's first has ``parent``, the request it follows: the previous
turn of its session, or, for a subagent's first turn, the main turn that spawned it; and
``think_s``, the seconds from the parent's first token to this request: the parent's answer
decoded (answer tokens / `decode_tps`) plus the tool's run (or the user's think time); for the
main turn after a subagent, until the subagent's last answer is decoded (its first token
estimated as below). A replay may release a request
`think_s` after its parent's first token (closed loop, as agents behave).

**Arrivals** (open loop): sessions start as a Poisson process per phase of the load shape, at a
rate that makes the expected work of a session (its uncached tokens with an infinite cache: every
block of its own, its subagents' too; `work_basis` ideal) times the rate equal to load x
capacity. The expectation is a mean over `CALIBRATION_SESSIONS` sessions drawn from a fixed seed,
so the rate does not depend on the trace's seed. A turn's ``arrival_s`` = its parent's arrival +
the parent's estimated prefill (its uncached tokens, the new block, at `capacity_tps`: an idle
engine at short context, so an underestimate at long context) + ``think_s``.

**Parameters and their sources** (token counts and seconds are log-normal: median, sigma; an
*assumption* is ours, not a published figure):

* TraceLab (Zhu et al., "TraceLab: Characterizing Coding Agent Workloads for LLM Serving", arXiv
  2606.30560, 2026; tracelab.cs.washington.edu: 4,265 Claude Code and Codex sessions, 357,161
  model calls). 52.6 B of 54.9 B input tokens were prefix-cache reads (96%; 94% of this family's
  prompt tokens are reusable). A session has on average 8.9 user-initiated and 73.6
  tool-initiated steps, a median of ~16 and a long tail: ~11% of turns follow a user message
  (`user_turn_share` 0.1), `turns` median 20, sigma 0.8 (the context cap ends 21% of the main
  sessions; 18 turns at the median). Tokens appended per step at a 32k-128k-token prefix: medians
  0.8k-1.0k, means 1.6k-3.7k, p90s 3.7k-8.3k (16k-32k: medians 1.3k-1.9k). Here the previous
  answer (`answer_tokens` 256, sigma 1.0) plus the new input (`input_tokens` 1,024, sigma 1.4):
  median 1.5k, mean 2.9k, p90 6.3k, a little above at the median, so that a session reaches a
  long context in tens of turns. 187 M output
  tokens over 357 k steps, ~520 per step (the answer's mean here: ~420). Tool calls are
  heavy-tailed, most of them reads and searches (`tool_s` 1 s, sigma 1.2: an assumption within
  that); human waits are long (TraceLab sets them against a 5-minute cache horizon;
  `user_think_s` 15 s, sigma 1.0: an assumption, short so that a preset spans minutes, not
  hours).
* Issue 47's anchor, a public coding-agent trace: turns re-send the whole growing context, median
  ~50k tokens, up to 131k (here the main turns' median is ~44k; with the subagents' short ones,
  ~36k over all requests).
* A system-and-tools prefix of 10-20k tokens (issue 47's typical figure): `prefix_tokens`
  10,240, with the task (`task_tokens` 1,024, sigma 0.7) a first prompt of ~11k.
* Subagents start a fresh context that caches poorly (an agent benchmark on VS Code,
  microsoft/vscode-azureresourcegroups#1714: 48% of subagent input cached against 93% in the
  main trajectory). How often they are spawned, their prompt and their length are assumptions:
  `subagent_share` 0.04 of main turns (~0.8 per session), a 4,096-token subagent system block, a
  512-token task (sigma 0.7), 2-8 turns.
* `decode_tps` 100 tokens/s: an assumption for the answer's decoding (the replay is a prefill
  node; the decode runs elsewhere and only delays the next turn). Think times come out at a
  median of 4.8 s, a mean of 8.4 s and a p90 of 17 s between turns (34 s median around a
  subagent).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from fairway.errors import TraceError
from fairway.traces.format import Block, TraceRequest, make_request
from fairway.traces.shapes import LoadShape, check_work_basis, phase_rates, poisson_arrivals

#: The family's default shape: 5 minutes calm, 10 busy, 5 calm (session starts; their turns run
#: on for minutes after). The loads count uncached tokens at short context: a long context makes
#: each of them dearer (attention: ~2.5 x on average here), and an evicted context is computed
#: again. Why 20 minutes: a KV cache of 0.3 x the trace's reusable content (the replay's default)
#: holds the contexts of the sessions running at once only when the trace spans several session
#: lifetimes (a few minutes each); in shorter traces FCFS thrashes (every turn a miss).
DEFAULT_SHAPE = "calm:0.15:300,busy:0.25:600,calm:0.15:300"
#: Sessions drawn (from `CALIBRATION_SEED`) to estimate the expected work of one session.
CALIBRATION_SESSIONS = 2000
CALIBRATION_SEED = 47
#: Log-normal sigma of a task's tokens (main session or subagent): an assumption.
TASK_SIGMA = 0.7


@dataclass(frozen=True)
class AgentSessionsParams:
    """Parameters of the ``agent-sessions`` family (sources in the module docstring)."""

    prefix_tokens: int = 10240
    """The system-and-tools block every main session starts with."""
    task_tokens: int = 1024
    """Median tokens of a session's task (the first user message and the context it brings)."""
    turns: float = 20.0
    """Median number of turns a main session would take if no context cap stopped it."""
    turns_sigma: float = 0.8
    """Log-normal sigma of the number of turns."""
    answer_tokens: int = 256
    """Median tokens of the model's answer to a turn (appended to the next turn)."""
    answer_sigma: float = 1.0
    """Log-normal sigma of an answer's tokens."""
    input_tokens: int = 1024
    """Median tokens of a turn's new input: the tool output, or the user's message."""
    input_sigma: float = 1.4
    """Log-normal sigma of the new input's tokens."""
    tool_s: float = 1.0
    """Median seconds a tool runs between an answer and the next turn."""
    tool_sigma: float = 1.2
    """Log-normal sigma of a tool's seconds."""
    user_turn_share: float = 0.1
    """Share of main turns (after the first) that follow a user message instead of a tool."""
    user_think_s: float = 15.0
    """Median seconds a user takes before the next message."""
    user_think_sigma: float = 1.0
    """Log-normal sigma of the user's seconds."""
    decode_tps: float = 100.0
    """Tokens per second at which an answer is decoded (it delays the next turn)."""
    subagent_share: float = 0.04
    """Probability that a main turn's answer (not the last) spawns a subagent."""
    subagent_prefix_tokens: int = 4096
    """The system block every subagent starts with."""
    subagent_task_tokens: int = 512
    """Median tokens of a subagent's task."""
    subagent_turns_min: int = 2
    """Fewest turns of a subagent."""
    subagent_turns_max: int = 8
    """Most turns of a subagent (uniform between the two)."""
    max_prompt_tokens: int = 131072
    """Longest prompt: a session ends before the turn that would exceed it."""
    work_basis: str = "ideal"
    """How the session rate counts work: ideal (uncached tokens) or prompt."""
    max_requests: int = 20000
    """Refuse to build more requests than this."""

    def __post_init__(self) -> None:
        check_work_basis(self.work_basis)
        positive = {
            "prefix_tokens": self.prefix_tokens, "task_tokens": self.task_tokens,
            "turns": self.turns, "answer_tokens": self.answer_tokens,
            "input_tokens": self.input_tokens, "decode_tps": self.decode_tps,
            "subagent_prefix_tokens": self.subagent_prefix_tokens,
            "subagent_task_tokens": self.subagent_task_tokens,
            "subagent_turns_min": self.subagent_turns_min,
        }
        nonnegative = {
            "turns_sigma": self.turns_sigma, "answer_sigma": self.answer_sigma,
            "input_sigma": self.input_sigma, "tool_s": self.tool_s,
            "tool_sigma": self.tool_sigma, "user_think_s": self.user_think_s,
            "user_think_sigma": self.user_think_sigma,
        }
        for name, value in positive.items():
            if not (math.isfinite(value) and value > 0):
                raise TraceError(f"{name} must be > 0, got {value}")
        for name, value in nonnegative.items():
            if not (math.isfinite(value) and value >= 0):
                raise TraceError(f"{name} must be >= 0, got {value}")
        for name, share in (("user_turn_share", self.user_turn_share),
                            ("subagent_share", self.subagent_share)):
            if not 0 <= share <= 1:
                raise TraceError(f"{name} must be in [0, 1], got {share}")
        if self.subagent_turns_max < self.subagent_turns_min:
            raise TraceError(f"subagent_turns_max ({self.subagent_turns_max}) must be >= "
                             f"subagent_turns_min ({self.subagent_turns_min})")
        first = self.prefix_tokens + 1
        if self.max_prompt_tokens < first:
            raise TraceError(f"max_prompt_tokens ({self.max_prompt_tokens}) must exceed "
                             f"prefix_tokens ({self.prefix_tokens})")


# --- one session's plan (token counts and think times; no clock yet) ---------------------------


@dataclass(frozen=True)
class _Turn:
    """One turn of a plan: its own block, its answer, and how it follows its parent."""

    new_tokens: int
    """Tokens of the turn's own block (the parent's answer and the new input, or a task)."""
    answer_tokens: int
    """Tokens of the model's answer to this turn."""
    trigger: str
    """start, tool, user, task or subagent (see the module docstring)."""
    think_s: float
    """Seconds from the parent's first token to this turn (0 for a start); for the main turn
    after a subagent, the think after the subagent's last answer (the wait is added later)."""


@dataclass(frozen=True)
class _Plan:
    """A main session's turns and the subagents its answers spawn (by spawning turn)."""

    turns: tuple[_Turn, ...]
    subagents: tuple[tuple[int, tuple[_Turn, ...]], ...]

    def work(self, params: AgentSessionsParams) -> float:
        """Uncached tokens (ideal basis: every own block once) or prompt tokens of the plan."""
        chains = [(params.prefix_tokens, self.turns),
                  *((params.subagent_prefix_tokens, sub) for _, sub in self.subagents)]
        if params.work_basis == "ideal":
            return float(sum(t.new_tokens for _, turns in chains for t in turns))
        return float(sum(prefix + sum(t.new_tokens for t in turns[: k + 1])
                         for prefix, turns in chains for k in range(len(turns))))


def _lognormal(rng: np.random.Generator, median: float, sigma: float, n: int) -> np.ndarray:
    return median * np.exp(sigma * rng.standard_normal(n))


def _tokens(values: np.ndarray) -> list[int]:
    return [max(int(round(v)), 1) for v in values]


def _think(params: AgentSessionsParams, answer_tokens: int, wait_s: float) -> float:
    """Seconds from a first token to the next turn: the answer decoded, then `wait_s`."""
    return answer_tokens / params.decode_tps + wait_s


def _draw_subagent(params: AgentSessionsParams, rng: np.random.Generator,
                   spawn_answer: int) -> tuple[_Turn, ...]:
    n = int(rng.integers(params.subagent_turns_min, params.subagent_turns_max + 1))
    answers = _tokens(_lognormal(rng, params.answer_tokens, params.answer_sigma, n))
    inputs = _tokens(_lognormal(rng, params.input_tokens, params.input_sigma, n))
    tools = _lognormal(rng, params.tool_s, params.tool_sigma, n)
    task = _tokens(_lognormal(rng, params.subagent_task_tokens, TASK_SIGMA, 1))[0]
    turns = [_Turn(task, answers[0], "task", _think(params, spawn_answer, 0.0))]
    context = params.subagent_prefix_tokens + task
    for k in range(1, n):
        new = answers[k - 1] + inputs[k]
        if context + new > params.max_prompt_tokens:
            break
        context += new
        turns.append(_Turn(new, answers[k], "tool",
                           _think(params, answers[k - 1], float(tools[k]))))
    return tuple(turns)


def _draw_plan(params: AgentSessionsParams, rng: np.random.Generator) -> _Plan:
    """One main session's turns and subagents, from `rng` alone (no clock, no capacity)."""
    wanted = max(int(round(float(_lognormal(rng, params.turns, params.turns_sigma, 1)[0]))), 1)
    answers = _tokens(_lognormal(rng, params.answer_tokens, params.answer_sigma, wanted))
    inputs = _tokens(_lognormal(rng, params.input_tokens, params.input_sigma, wanted))
    tools = _lognormal(rng, params.tool_s, params.tool_sigma, wanted)
    users = _lognormal(rng, params.user_think_s, params.user_think_sigma, wanted)
    is_user = rng.random(wanted) < params.user_turn_share
    spawns = rng.random(wanted) < params.subagent_share
    task = _tokens(_lognormal(rng, params.task_tokens, TASK_SIGMA, 1))[0]
    turns = [_Turn(task, answers[0], "start", 0.0)]
    subagents: list[tuple[int, tuple[_Turn, ...]]] = []
    context = params.prefix_tokens + task
    for k in range(1, wanted):
        new = answers[k - 1] + inputs[k]
        if context + new > params.max_prompt_tokens:
            break
        context += new
        if spawns[k - 1]:
            sub = _draw_subagent(params, rng, answers[k - 1])
            subagents.append((k - 1, sub))
            trigger, wait = "subagent", _think(params, sub[-1].answer_tokens, 0.0)
        elif is_user[k]:
            trigger, wait = "user", _think(params, answers[k - 1], float(users[k]))
        else:
            trigger, wait = "tool", _think(params, answers[k - 1], float(tools[k]))
        turns.append(_Turn(new, answers[k], trigger, wait))
    # A turn spawns only once its next turn fits: every subagent returns to a main turn.
    return _Plan(tuple(turns), tuple(subagents))


@lru_cache(maxsize=16)
def expected_session_work(params: AgentSessionsParams) -> float:
    """Mean work of a session (its `work_basis`) over `CALIBRATION_SESSIONS` fixed draws."""
    rng = np.random.default_rng(CALIBRATION_SEED)
    return float(np.mean([_draw_plan(params, rng).work(params)
                          for _ in range(CALIBRATION_SESSIONS)]))


# --- the clock: plans -> requests ----------------------------------------------------------------


@dataclass(frozen=True)
class _Timed:
    """A request before it becomes a `TraceRequest` (requests are sorted by `key`)."""

    key: tuple[float, int, int, int]
    request_id: str
    blocks: tuple[Block, ...]
    tags: dict[str, Any]

    @property
    def arrival_s(self) -> float:
        """Arrival in seconds."""
        return self.key[0]


#: (request id, estimated first token in s) of the request a turn follows.
_Parent = tuple[str, float]
#: Called with (turn index, request id, first token) after each turn of a chain; returns the
#: seconds the next turn waits beyond its own think (a subagent's run).
_OnAnswer = Callable[[int, str, float], float]


def _chain(family: str, seed: int, s: int, sub: int, prefix: Block, turns: tuple[_Turn, ...],
           start: float, parent: _Parent | None, capacity_tps: float,
           on_answer: _OnAnswer | None = None) -> list[_Timed]:
    """The requests of one chain of turns: a main session (`sub` 0) or subagent `sub`.

    Turn k+1 arrives at turn k's estimated first token (its own block at `capacity_tps`) + the
    wait `on_answer` returns + turn k+1's think. `parent`: the request the first turn follows
    (a subagent's spawning turn), or None for a main session.
    """
    session = f"s{s:05d}" + (f"-a{sub}" if sub else "")
    blocks: tuple[Block, ...] = (prefix,)
    out = []
    t = start
    for k, turn in enumerate(turns):
        rid = f"{family}-{session}-t{k:03d}"
        blocks = (*blocks, (f"ag{seed}-{session}-t{k:03d}", turn.new_tokens))
        tags: dict[str, Any] = {"session": session, "turn": k, "agent": "sub" if sub else "main",
                                "trigger": turn.trigger}
        if parent is not None:
            tags.update(parent=parent[0], think_s=round(t - parent[1], 6))
        out.append(_Timed((round(t, 6), s, sub, k), rid, blocks, tags))
        token = t + turn.new_tokens / capacity_tps
        wait = on_answer(k, rid, token) if on_answer is not None else 0.0
        parent = (rid, token)
        if k + 1 < len(turns):
            t = token + wait + turns[k + 1].think_s
    return out


def _session(family: str, seed: int, s: int, start: float, plan: _Plan,
             params: AgentSessionsParams, capacity_tps: float) -> list[_Timed]:
    """Every request of main session `s` and of its subagents."""
    system = (f"ag-system-{params.prefix_tokens}", params.prefix_tokens)
    sub_system = (f"ag-subagent-system-{params.subagent_prefix_tokens}",
                  params.subagent_prefix_tokens)
    spawned = {k: (j, turns) for j, (k, turns) in enumerate(plan.subagents, start=1)}
    subs: list[_Timed] = []

    def run_subagent(k: int, rid: str, token: float) -> float:
        if k not in spawned:
            return 0.0
        j, turns = spawned[k]
        chain = _chain(family, seed, s, j, sub_system, turns, token + turns[0].think_s,
                       (rid, token), capacity_tps)
        subs.extend(chain)
        answered = chain[-1].arrival_s + turns[-1].new_tokens / capacity_tps
        return answered - token

    main = _chain(family, seed, s, 0, system, plan.turns, start, None, capacity_tps, run_subagent)
    return main + subs


def build_agent_sessions(
    family: str, seed: int, shape: LoadShape, capacity_tps: float, params: AgentSessionsParams
) -> tuple[list[TraceRequest], dict[str, Any]]:
    """Requests of an agent-sessions trace and the facts for the header's ``info``."""
    work = expected_session_work(params)
    rates = phase_rates(shape, capacity_tps, work)
    starts = poisson_arrivals(shape, rates, np.random.default_rng([seed, 1]))
    timed: list[_Timed] = []
    num_subagents = 0
    for s, start in enumerate(starts):
        plan = _draw_plan(params, np.random.default_rng([seed, 2, s]))
        num_subagents += len(plan.subagents)
        timed.extend(_session(family, seed, s, float(start), plan, params, capacity_tps))
        if len(timed) > params.max_requests:
            raise TraceError(
                f"{family}: more than max_requests={params.max_requests} requests; lower the "
                "load or raise max_requests"
            )
    timed.sort(key=lambda r: r.key)
    reqs = [make_request(r.request_id, r.arrival_s, r.blocks, phase=shape.phase_at(r.arrival_s),
                         tags=r.tags) for r in timed]
    info = {
        "work_basis": params.work_basis,
        "work_per_session_tokens": round(work, 3),
        "num_sessions": len(starts),
        "num_subagents": num_subagents,
        "think": "closed loop: a request follows tags.parent by tags.think_s after the parent's "
                 "first token; arrival_s (open loop) = the parent's arrival + its new block at "
                 "capacity_tps + think_s",
        "sources": "TraceLab (arXiv 2606.30560); issue 47's coding-agent trace anchor; "
                   "assumptions in fairway/traces/agent.py",
    }
    return reqs, info
