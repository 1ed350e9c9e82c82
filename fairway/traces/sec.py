"""SEC filings QA: retrieval-augmented questions over FinanceBench filings and FY2023 10-Ks.

A request is ``[system prompt] + [k excerpt pages of ONE filing, in page order] + [question]``.
Each filing has a fixed retrieval set (chosen once per seed): the evidence pages of every
FinanceBench question on it plus random distractor pages, so all questions on a filing share
every excerpt block and differ only in the question block. That is the reuse a prefix cache can
exploit when requests are ordered well.

Documents: the page text of the 74 FinanceBench filings that have it
(``financebench_filing_pages.jsonl.gz``; the 10 filings without it and their 21 questions are
left out) and the 142 10-K filings (``sec_10k_fy2023_sections.jsonl.gz``), whose four sections
are cut into page-sized chunks of about `page_chars` characters at word boundaries.

Questions: a 10-K gets templated questions (`TEMPLATES` x `TOPICS`, with the company name and
period), because FinanceBench has no questions on them. A FinanceBench filing gets one of its own
FinanceBench questions (1-7 each) with probability `financebench_question_share`, else a
templated one: with FinanceBench questions alone, a popular filing would mostly repeat the very
same prompt (in a first test, 27% of the requests were exact repeats with one token of work).

Popularity: filings get a seeded random rank; rank r is drawn with probability proportional to
``1 / (r + 1) ** zipf_s``. With ``drift_per_min > 0`` the ranking rotates: every
``60 / drift_per_min`` seconds each filing moves one rank down and the least popular one becomes
the most popular (a newly hot filing is cold in the cache).

Token counts: ``ceil(chars / 4)`` after collapsing each run of whitespace to one space
(`estimate_tokens`), the usual ~4 characters per token of English BPE vocabularies; number-heavy
tables tokenize denser, so they are slightly under-counted.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from fairway.errors import TraceError
from fairway.traces.data import data_file, file_sha256
from fairway.traces.format import TraceRequest, make_request
from fairway.traces.shapes import LoadShape, check_work_basis, phase_rates, poisson_arrivals
from fairway.traces.stats import request_work

logger = logging.getLogger(__name__)

FB_PAGES = "financebench/financebench_filing_pages.jsonl.gz"
FB_QUESTIONS = "financebench/financebench_open_source.jsonl"
TENK_SECTIONS = "sec_filings/sec_10k_fy2023_sections.jsonl.gz"
TENK_ITEMS = ("item1", "item1a", "item7", "item7a")
SOURCES = ("all", "financebench", "10k")

SYSTEM_PROMPT = (
    "You are a financial analyst assistant. You answer questions about one company filing "
    "submitted to the U.S. Securities and Exchange Commission (a 10-K annual report, a 10-Q "
    "quarterly report, an 8-K current report or an earnings release). The user gives you "
    "excerpts of the filing, each introduced by its page number, followed by a question. Answer "
    "only from the excerpts. Quote the figures exactly as printed, give units and the fiscal "
    "period, and show the arithmetic when you compute a ratio, a growth rate or a margin. If "
    "the excerpts do not contain the answer, say which information is missing instead of "
    "guessing. Cite the pages you used as [p. N]. Keep the answer short: one paragraph, or a "
    "short table when the question asks for several numbers. Do not give investment advice."
)
QUESTION_FORMAT = "Question: {question}\nAnswer:"
TEMPLATES = (
    "What were the main drivers of {company}'s revenue change in fiscal {period}?",
    "How did {company}'s operating margin change in fiscal {period}, and why?",
    "What are the most significant risk factors {company} reports about {topic}?",
    "How does {company} describe its exposure to {topic}, and what does it do to manage it?",
    "Summarize {company}'s liquidity and sources of capital at the end of fiscal {period}.",
    "What does {company} say about {topic} in its discussion of results of operations?",
    "Which business segments does {company} report, and which grew fastest in fiscal {period}?",
    "What are {company}'s main capital allocation priorities according to the filing?",
    "How could changes in {topic} affect {company}'s future results, according to the filing?",
    "Describe {company}'s competitive position and its main competitors.",
    "What does {company} disclose about its market risk from {topic}?",
    "How many employees does {company} have, and what does it say about its workforce?",
)
TOPICS = (
    "interest rates", "foreign exchange", "supply chain disruption", "cybersecurity",
    "government regulation", "competition", "inflation", "labor costs", "climate change",
    "indebtedness",
)


def estimate_tokens(text: str) -> int:
    """Token count estimate of `text`: ceil(chars / 4) after collapsing whitespace, at least 1."""
    return max(1, math.ceil(len(" ".join(text.split())) / 4))


@dataclass(frozen=True)
class SecQuestion:
    """A question block: its id (block id) and size."""

    question_id: str
    tokens: int


@dataclass(frozen=True)
class SecFiling:
    """One filing as token counts per page (index = page number; 0 = no text)."""

    filing_id: str
    name: str
    source: str
    company: str
    period: str
    page_tokens: tuple[int, ...]
    evidence_pages: tuple[int, ...]
    questions: tuple[SecQuestion, ...]

    def page_block(self, page: int) -> str:
        """Block id of one page (content-addressed: same filing and page, same block)."""
        return f"{self.filing_id}-p{page}"


@dataclass(frozen=True)
class SecCorpus:
    """The filings (sorted by id) and the sha256 of the data files they came from."""

    filings: tuple[SecFiling, ...]
    source_sha256: dict[str, str]


def _financebench_filings() -> list[SecFiling]:
    pages: dict[str, dict[int, int]] = defaultdict(dict)
    with gzip.open(data_file(FB_PAGES), "rt", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            pages[rec["doc_name"]][int(rec["page_num"])] = (
                estimate_tokens(rec["text"]) if rec["text"].strip() else 0
            )
    questions: dict[str, list[SecQuestion]] = defaultdict(list)
    evidence: dict[str, set[int]] = defaultdict(set)
    companies: dict[str, str] = {}
    with open(data_file(FB_QUESTIONS), encoding="utf-8") as f:
        for line in f:
            q = json.loads(line)
            doc = q["doc_name"]
            if doc not in pages:
                continue
            text = QUESTION_FORMAT.format(question=q["question"])
            question_id = f"q-fb-{q['financebench_id']}"
            questions[doc].append(SecQuestion(question_id, estimate_tokens(text)))
            companies[doc] = q["company"]
            for ev in q.get("evidence") or ():
                if ev.get("doc_name", doc) == doc and ev.get("evidence_page_num") is not None:
                    evidence[doc].add(int(ev["evidence_page_num"]))
    filings = []
    for doc in sorted(questions):
        by_page = pages[doc]
        tokens = tuple(by_page.get(p, 0) for p in range(max(by_page) + 1))
        ev = tuple(sorted(p for p in evidence[doc] if p < len(tokens) and tokens[p] > 0))
        filings.append(SecFiling(
            f"fb-{doc}", doc, "financebench", companies[doc], doc.split("_")[-2], tokens, ev,
            tuple(sorted(questions[doc], key=lambda q: q.question_id)),
        ))
    return filings


def _chunk_tokens(text: str, page_chars: int) -> list[int]:
    """Token counts of `text` cut into ~page_chars chunks at spaces (whitespace collapsed)."""
    flat = " ".join(text.split())
    out = []
    start = 0
    while start < len(flat):
        end = min(len(flat), start + page_chars)
        if end < len(flat):
            space = flat.rfind(" ", start + page_chars // 2, end)
            if space > 0:
                end = space
        out.append(max(1, math.ceil((end - start) / 4)))
        start = end + 1 if end < len(flat) and flat[end] == " " else end
    return out


def _tenk_filings(page_chars: int) -> list[SecFiling]:
    filings = []
    with gzip.open(data_file(TENK_SECTIONS), "rt", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            tokens: list[int] = []
            for item in TENK_ITEMS:
                tokens.extend(_chunk_tokens(rec.get(item) or "", page_chars))
            names = rec.get("names") or [rec["accession"]]
            filings.append(SecFiling(
                f"10k-{rec['accession']}", rec["accession"], "10k", names[-1], "2023",
                tuple(tokens), (), (),
            ))
    return sorted(filings, key=lambda x: x.filing_id)


@lru_cache(maxsize=4)
def _load_corpus_cached(sources: str, page_chars: int, key: tuple[str, ...]) -> SecCorpus:
    filings: list[SecFiling] = []
    shas = {}
    if sources in ("all", "financebench"):
        filings += _financebench_filings()
        shas[FB_PAGES] = file_sha256(data_file(FB_PAGES))
        shas[FB_QUESTIONS] = file_sha256(data_file(FB_QUESTIONS))
    if sources in ("all", "10k"):
        filings += _tenk_filings(page_chars)
        shas[TENK_SECTIONS] = file_sha256(data_file(TENK_SECTIONS))
    return SecCorpus(tuple(sorted(filings, key=lambda x: x.filing_id)), shas)


def load_corpus(sources: str = "all", page_chars: int = 3300) -> SecCorpus:
    """The filings of `sources` (all, financebench, 10k), memoized per data file."""
    if sources not in SOURCES:
        raise TraceError(f"sources must be one of {', '.join(SOURCES)}, got {sources!r}")
    names = {"all": (FB_PAGES, FB_QUESTIONS, TENK_SECTIONS), "financebench": (FB_PAGES,
             FB_QUESTIONS), "10k": (TENK_SECTIONS,)}[sources]
    key = tuple(str(data_file(n)) for n in names)
    return _load_corpus_cached(sources, page_chars, key)


# --------------------------------------------------------------------------------------------
# Parameters and the build


@dataclass(frozen=True)
class SecParams:
    """Parameters of the ``sec`` family (the SEC QA traces ``sec-a`` and ``sec-b``)."""

    financebench_question_share: float = 0.5
    """Probability that a request on a FinanceBench filing asks one of its FinanceBench questions
    (else a templated one)."""
    zipf_s: float = 1.0
    """Zipf exponent of filing popularity (0 = uniform; larger = more skewed)."""
    drift_per_min: float = 0.0
    """Popularity rotation speed: rank shifts per minute (0 = fixed popularity)."""
    pages_min: int = 5
    """Fewest excerpt pages in a filing's retrieval set (more if it has more evidence pages)."""
    pages_max: int = 5
    """Most excerpt pages; each filing draws its count log-uniformly in [pages_min, pages_max]."""
    max_prompt_tokens: int = 16384
    """Prompts are kept under this by dropping distractor pages from the retrieval set."""
    min_page_tokens: int = 64
    """Distractor pages need at least this many tokens (skips covers and blank pages)."""
    sources: str = "all"
    """Which filings: all, financebench (74 filings) or 10k (142 filings)."""
    page_chars: int = 3300
    """Chunk size of 10-K sections in characters (~ the median FinanceBench page)."""
    work_basis: str = "prompt"
    """How the request rate counts work: prompt or ideal (see fairway.traces.shapes)."""
    max_requests: int = 20000
    """Refuse to build more requests than this (a guard against a mistaken load)."""

    def __post_init__(self) -> None:
        check_work_basis(self.work_basis)
        if self.sources not in SOURCES:
            raise TraceError(f"sources must be one of {', '.join(SOURCES)}, got {self.sources!r}")
        if not 1 <= self.pages_min <= self.pages_max:
            raise TraceError(
                f"need 1 <= pages_min <= pages_max, got {self.pages_min} and {self.pages_max}"
            )
        if not 0 <= self.financebench_question_share <= 1:
            raise TraceError("financebench_question_share must be in [0, 1]")
        if self.zipf_s < 0 or self.drift_per_min < 0:
            raise TraceError("zipf_s and drift_per_min must be >= 0")
        if self.page_chars < 100 or self.max_prompt_tokens < 256:
            raise TraceError("page_chars must be >= 100 and max_prompt_tokens >= 256")


@dataclass(frozen=True)
class SecLongParams(SecParams):
    """Parameters of the ``sec-long`` family: the same QA with 1 to 20 pages (~1k-16k tokens)."""

    pages_min: int = 1
    pages_max: int = 20


# Independent random streams, so that e.g. the arrival count does not shift content choices.
_STREAM_ARRIVALS, _STREAM_CONTENT, _STREAM_POPULARITY, _STREAM_RETRIEVAL = 1, 2, 3, 4


@dataclass(frozen=True)
class _FilingPlan:
    filing: SecFiling
    pages: tuple[int, ...]
    questions: tuple[SecQuestion, ...]  # FinanceBench questions (may be empty)
    templated: tuple[SecQuestion, ...]


class _SecPlan:
    """Everything fixed per seed: retrieval sets, question pools, popularity order."""

    def __init__(self, corpus: SecCorpus, seed: int, params: SecParams) -> None:
        self.params = params
        self.system_tokens = estimate_tokens(SYSTEM_PROMPT)
        plans = [self._plan_filing(i, f, seed) for i, f in enumerate(corpus.filings)]
        # A filing without a usable page (a few 10-Ks have near-empty sections) is left out.
        self.plans = tuple(p for p in plans if p is not None)
        self.num_skipped = len(plans) - len(self.plans)
        n = len(self.plans)
        if n == 0:
            raise TraceError("no filings to build SEC requests from")
        self.order = np.random.default_rng([seed, _STREAM_POPULARITY]).permutation(n)
        weights = 1.0 / np.arange(1, n + 1, dtype=float) ** params.zipf_s
        self.cdf = np.cumsum(weights / weights.sum())
        self.shift_period_s = 60.0 / params.drift_per_min if params.drift_per_min > 0 else None

    @staticmethod
    def _templated(filing: SecFiling) -> tuple[SecQuestion, ...]:
        out = []
        for t, template in enumerate(TEMPLATES):
            topics = TOPICS if "{topic}" in template else (None,)
            for k, topic in enumerate(topics):
                text = QUESTION_FORMAT.format(
                    question=template.format(
                        company=filing.company, topic=topic, period=filing.period
                    )
                )
                out.append(SecQuestion(f"q-{filing.filing_id}-t{t}-k{k}", estimate_tokens(text)))
        return tuple(out)

    def _plan_filing(self, index: int, filing: SecFiling, seed: int) -> _FilingPlan | None:
        p = self.params
        rng = np.random.default_rng([seed, _STREAM_RETRIEVAL, index])
        if p.pages_min == p.pages_max:
            k = p.pages_min
        else:
            k = int(math.exp(rng.uniform(math.log(p.pages_min), math.log(p.pages_max + 1))))
            k = min(max(k, p.pages_min), p.pages_max)
        templated = self._templated(filing)
        longest = max(q.tokens for q in filing.questions + templated)
        budget = p.max_prompt_tokens - self.system_tokens - longest
        chosen: list[int] = []
        used = 0
        for page in filing.evidence_pages:  # evidence first: the question must be answerable
            if used + filing.page_tokens[page] <= budget:
                chosen.append(page)
                used += filing.page_tokens[page]
        candidates = [
            i for i, n in enumerate(filing.page_tokens)
            if n >= p.min_page_tokens and i not in chosen
        ]
        for page in rng.permutation(len(candidates)):
            if len(chosen) >= k:
                break
            page = candidates[int(page)]
            if used + filing.page_tokens[page] <= budget:
                chosen.append(page)
                used += filing.page_tokens[page]
        if not chosen:
            return None
        return _FilingPlan(filing, tuple(sorted(chosen)), filing.questions, templated)

    def filing_at(self, u: float, t: float) -> tuple[_FilingPlan, int]:
        """The filing drawn by uniform `u` at time `t`, and its popularity rank then."""
        n = len(self.plans)
        rank = min(int(np.searchsorted(self.cdf, u, side="right")), n - 1)
        shift = int(t // self.shift_period_s) if self.shift_period_s else 0
        return self.plans[self.order[(rank - shift) % n]], rank

    def mean_prompt_tokens(self) -> float:
        """Expected prompt length under the rank distribution at t = 0 (the first guess)."""
        probs = np.diff(np.concatenate([[0.0], self.cdf]))
        total = 0.0
        for rank, prob in enumerate(probs):
            plan = self.plans[self.order[rank]]
            pages = sum(plan.filing.page_tokens[i] for i in plan.pages)
            q = float(np.mean([x.tokens for x in plan.templated]))
            if plan.questions:
                share = self.params.financebench_question_share
                q = share * float(np.mean([x.tokens for x in plan.questions])) + (1 - share) * q
            total += prob * (self.system_tokens + pages + q)
        return total

    def request(self, request_id: str, t: float, phase: str, u: Sequence[float]) -> TraceRequest:
        plan, rank = self.filing_at(float(u[0]), t)
        use_fb = bool(plan.questions) and u[1] < self.params.financebench_question_share
        pool = plan.questions if use_fb else plan.templated
        q = pool[min(int(u[2] * len(pool)), len(pool) - 1)]
        f = plan.filing
        blocks = [("sec-system-v1", self.system_tokens)]
        blocks += [(f.page_block(i), f.page_tokens[i]) for i in plan.pages]
        blocks.append((q.question_id, q.tokens))
        tags = {"filing": f.name, "source": f.source, "question_id": q.question_id, "rank": rank}
        return make_request(request_id, t, blocks, phase=phase, tags=tags)


def build_sec(
    family: str, seed: int, shape: LoadShape, capacity_tps: float, params: SecParams
) -> tuple[list[TraceRequest], dict[str, Any]]:
    """Requests of an SEC trace and the facts for the header's ``info``."""
    corpus = load_corpus(params.sources, params.page_chars)
    plan = _SecPlan(corpus, seed, params)

    def assemble(work: float) -> list[TraceRequest]:
        rates = phase_rates(shape, capacity_tps, work)
        times = poisson_arrivals(shape, rates, np.random.default_rng([seed, _STREAM_ARRIVALS]))
        if len(times) > params.max_requests:
            raise TraceError(
                f"{family}: the shape needs {len(times)} requests, more than max_requests="
                f"{params.max_requests} (work per request {work:.0f} tokens on the "
                f"{params.work_basis!r} basis); lower the load or raise max_requests"
            )
        draws = np.random.default_rng([seed, _STREAM_CONTENT]).random((len(times), 3))
        out = []
        for i, t in enumerate(times):
            t = round(float(t), 6)
            out.append(plan.request(f"{family}-{i:05d}", t, shape.phase_at(t), draws[i]))
        return out

    # The expected work depends on the requests (popularity, and hits for the ideal basis), so
    # start from the expected prompt length and refine twice from the built requests.
    work = plan.mean_prompt_tokens()
    for _ in range(2):
        reqs = assemble(work)
        if reqs:
            work = float(np.mean(request_work(reqs, params.work_basis)))
    reqs = assemble(work)
    by_source: defaultdict[str, int] = defaultdict(int)
    for p in plan.plans:
        by_source[p.filing.source] += 1
    info = {
        "work_basis": params.work_basis,
        "work_per_request_tokens": round(work, 3),
        "num_filings": dict(sorted(by_source.items())),
        "num_filings_without_usable_pages": plan.num_skipped,
        "system_prompt_tokens": plan.system_tokens,
        "token_estimate": "ceil(chars / 4) after collapsing whitespace",
        "sources": corpus.source_sha256,
    }
    return reqs, info
