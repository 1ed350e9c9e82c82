"""MuSiQue multi-hop agent: one session per question, one prefill request per reasoning hop.

Hop k's prompt is hop k-1's prompt followed by new blocks, so every hop extends the previous one
exactly (the reuse an agent loop offers a prefix cache)::

    hop 1: [system] [question] [paragraphs for hop 1 ...] [step 1 question]
    hop k: <hop k-1 blocks> [step k-1 answer] [paragraphs for hop k ...] [step k question]

Hops come from ``question_decomposition`` (2-4 per question); the step question has ``#j``
replaced by step j's answer. Each hop retrieves `paragraphs_per_hop` of the question's 20
paragraphs: the hop's supporting paragraph plus distractors not retrieved before, in paragraph
order, fixed per (seed, question) so a deterministic agent repeats itself.

Sessions arrive by the load shape. Each hop's tags carry ``parent`` (the previous hop's request
id) and ``think_s`` (an exponential think time, mean `think_mean_s`), and replays are closed loop
by default: hop k is released `think_s` after hop k-1's first token, as an agent cannot ask its
next question before it has the answer (`fairway.replay.sessions`). The recorded ``arrival_s``
(hop k-1's arrival + `think_s`: a trace cannot know when hop k-1 finished) is what an open-loop
replay (``--open-loop``) uses.

Sessions take the questions in a seeded random order; when more sessions than questions are
needed the order starts over, and a repeated question gets its own question block (``-r<pass>``)
so that only the system prompt is shared across sessions, as with distinct users.

Paragraph blocks are keyed by their text, so the same paragraph has the same block (and token
ids) wherever it appears. Tokens: ``ceil(chars / 4)`` as in `fairway.traces.sec.estimate_tokens`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from fairway.errors import TraceError
from fairway.traces.data import data_file, file_sha256
from fairway.traces.format import Block, TraceRequest, make_request
from fairway.traces.sec import estimate_tokens
from fairway.traces.shapes import LoadShape, check_work_basis, phase_rates, poisson_arrivals

logger = logging.getLogger(__name__)

MUSIQUE_FILE = "musique/musique_ans_v1.0_dev.subset200.jsonl"
SYSTEM_PROMPT = (
    "You are a research agent that answers multi-hop questions. At each step you receive "
    "paragraphs retrieved for the current sub-question. Read them, answer the sub-question in a "
    "few words, and use that answer in the next step. When every step is answered, give the "
    "final answer in a few words. If the paragraphs do not contain the answer, say so."
)


@dataclass(frozen=True)
class _Hop:
    new_blocks: tuple[Block, ...]  # paragraphs + the step question (the answer comes next hop)
    answer_block: Block


@dataclass(frozen=True)
class _Question:
    question_id: str
    question_tokens: int
    hops: tuple[_Hop, ...]


@dataclass(frozen=True)
class MusiqueParams:
    """Parameters of the ``musique`` family."""

    paragraphs_per_hop: int = 4
    """Paragraphs retrieved per hop: the supporting one plus distractors."""
    think_mean_s: float = 2.0
    """Mean of the exponential think time between a hop's answer and the next hop (closed loop;
    between their arrivals in the recorded timestamps)."""
    work_basis: str = "prompt"
    """How the session rate counts work: prompt or ideal (see fairway.traces.shapes)."""
    path: str | None = None
    """A MuSiQue file in the official JSONL format (default: the 200-question dev subset)."""
    max_requests: int = 20000
    """Refuse to build more requests than this."""

    def __post_init__(self) -> None:
        check_work_basis(self.work_basis)
        if self.paragraphs_per_hop < 1:
            raise TraceError(f"paragraphs_per_hop must be >= 1, got {self.paragraphs_per_hop}")
        if self.think_mean_s < 0:
            raise TraceError(f"think_mean_s must be >= 0, got {self.think_mean_s}")


def _text_block(prefix: str, text: str) -> Block:
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return (f"{prefix}-{digest}", estimate_tokens(text))


@lru_cache(maxsize=4)
def _load_records(path: str, size: int, mtime_ns: int) -> tuple[dict[str, Any], ...]:
    records = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                ok = (
                    isinstance(rec, dict) and isinstance(rec["id"], str)
                    and isinstance(rec["paragraphs"], list) and rec["question_decomposition"]
                )
            except (json.JSONDecodeError, KeyError, TypeError):
                ok = False
            if not ok:
                raise TraceError(
                    f"{path}:{lineno}: not a MuSiQue record (needs id, question, paragraphs, "
                    "question_decomposition)"
                )
            records.append(rec)
    if not records:
        raise TraceError(f"{path}: no MuSiQue records")
    return tuple(records)


def _build_question(rec: dict[str, Any], seed: int, index: int, per_hop: int) -> _Question:
    rng = np.random.default_rng([seed, 5, index])
    paragraphs = {int(p["idx"]): p for p in rec["paragraphs"]}
    used: set[int] = set()
    answers: list[str] = []
    hops = []
    for k, step in enumerate(rec["question_decomposition"], start=1):
        support = step.get("paragraph_support_idx")
        # A supporting paragraph already retrieved as an earlier distractor is in the prompt.
        picked = [support] if support in paragraphs and support not in used else []
        others = [i for i in sorted(paragraphs) if i not in used and i not in picked]
        for j in rng.permutation(len(others))[: max(per_hop - len(picked), 0)]:
            picked.append(others[int(j)])
        used.update(picked)
        blocks = [
            _text_block("mq-p", f"Title: {p['title']}\n{p['paragraph_text']}")
            for p in (paragraphs[i] for i in sorted(picked))
        ]
        sub = re.sub(r"#(\d+)", lambda m: _answer(answers, int(m.group(1))), step["question"])
        blocks.append((f"mq-{rec['id']}-s{k}q", estimate_tokens(f"Step {k}: {sub}")))
        answer = str(step.get("answer", ""))
        answers.append(answer)
        ans_block = (f"mq-{rec['id']}-s{k}a", estimate_tokens(f"Answer to step {k}: {answer}"))
        hops.append(_Hop(tuple(blocks), ans_block))
    q_tokens = estimate_tokens(f"Question: {rec['question']}")
    return _Question(rec["id"], q_tokens, tuple(hops))


def _answer(answers: list[str], j: int) -> str:
    return answers[j - 1] if 0 < j <= len(answers) else f"#{j}"


def _session_prompts(q: _Question, system: Block, repeat: int) -> list[list[Block]]:
    """Blocks of every hop of one session (hop k's list starts with hop k-1's)."""
    suffix = f"-r{repeat}" if repeat else ""
    blocks: list[Block] = [system, (f"mq-q-{q.question_id}{suffix}", q.question_tokens)]
    out = []
    for k, hop in enumerate(q.hops):
        if k:
            blocks = blocks + [q.hops[k - 1].answer_block]
        blocks = blocks + list(hop.new_blocks)
        out.append(blocks)
    return out


def _session_work(prompts: list[list[Block]], basis: str, system_tokens: int) -> float:
    lengths = [sum(n for _, n in p) for p in prompts]
    if basis == "prompt":
        return float(sum(lengths))
    # Infinite cache: every hop hits its parent, and every session but the first hits the
    # system prompt, so a session costs its final prompt minus the system prompt.
    return float(lengths[-1] - system_tokens)


def build_musique(
    family: str, seed: int, shape: LoadShape, capacity_tps: float, params: MusiqueParams
) -> tuple[list[TraceRequest], dict[str, Any]]:
    """Requests of a MuSiQue agent trace and the facts for the header's ``info``."""
    path = Path(params.path) if params.path else data_file(MUSIQUE_FILE)
    if not path.is_file():
        raise TraceError(f"MuSiQue file {str(path)!r} not found")
    st = path.stat()
    records = _load_records(str(path), st.st_size, st.st_mtime_ns)
    questions = [
        _build_question(rec, seed, i, params.paragraphs_per_hop) for i, rec in enumerate(records)
    ]
    system = ("mq-system-v1", estimate_tokens(SYSTEM_PROMPT))
    session_work = float(np.mean([
        _session_work(_session_prompts(q, system, 0), params.work_basis, system[1])
        for q in questions
    ]))
    rates = phase_rates(shape, capacity_tps, session_work)
    starts = poisson_arrivals(shape, rates, np.random.default_rng([seed, 1]))
    rng = np.random.default_rng([seed, 2])
    order: list[int] = []
    pending: list[tuple[float, int, int, str, list[Block], dict[str, Any]]] = []
    for s, start in enumerate(starts):
        if s % len(questions) == 0:
            order = rng.permutation(len(questions)).tolist()
        q = questions[order[s % len(questions)]]
        prompts = _session_prompts(q, system, s // len(questions))
        thinks = rng.exponential(params.think_mean_s, len(prompts) - 1) if params.think_mean_s \
            else np.zeros(len(prompts) - 1)
        t = float(start)
        parent = None
        for k, blocks in enumerate(prompts, start=1):
            think = 0.0 if k == 1 else float(thinks[k - 2])
            t += think
            rid = f"{family}-s{s:05d}-h{k}"
            tags = {
                "session": f"s{s:05d}", "question_id": q.question_id, "hop": k,
                "num_hops": len(prompts), "parent": parent, "think_s": round(think, 6),
            }
            pending.append((round(t, 6), s, k, rid, blocks, tags))
            parent = rid
        if len(pending) > params.max_requests:
            raise TraceError(
                f"{family}: more than max_requests={params.max_requests} requests; lower the load"
            )
    pending.sort(key=lambda x: (x[0], x[1], x[2]))
    reqs = [
        make_request(rid, t, blocks, phase=shape.phase_at(t), tags=tags)
        for t, _, _, rid, blocks, tags in pending
    ]
    info = {
        "work_basis": params.work_basis,
        "work_per_session_tokens": round(session_work, 3),
        "num_sessions": len(starts),
        "num_questions": len(questions),
        "think": "closed loop by default: a replay releases hop k think_s after hop k-1's first "
                 "token (tags.parent); arrival_s (think_s after hop k-1's arrival) is for "
                 "--open-loop",
        "token_estimate": "ceil(chars / 4) after collapsing whitespace",
        "sources": {MUSIQUE_FILE if params.path is None else path.name: file_sha256(path)},
    }
    return reqs, info
