"""Hit-heavy: almost every request reuses a hot prefix; the few misses are where the waiting is.

After SGLang issue #31954 ("Anti-starvation aging for the lpm schedule policy"), measured on
production agentic traffic (~115K-token mean input, ~96% radix-cache hit rate): the median TTFT was
0.7 s under `lpm`, but cache-miss requests formed a 20-60 s tail (~5% of requests) that carried
~75% of all accumulated TTFT, because every cache-hot arrival sorts ahead of a cold request.
Switching to `fcfs` removed that tail and gave up the cache-locality order everywhere else.

This family is a scaled-down, synthetic version of that workload (no data set needed):

* **hit** (share 1 - `miss_fraction`, 96% by default): one of `num_prefixes` hot contexts of
  `prefix_tokens` (an agent's long, shared context; with `prefix_tokens_max` the contexts' lengths
  step evenly from `prefix_tokens` to it, e.g. 32k-64k in the `hit-heavy-long` preset) plus a
  unique suffix of `suffix_tokens` (the new turn); with the context cached, only the suffix is
  work;
* **miss** (4%): a unique prompt of `miss_tokens`, by default as long as a hit (a cold session
  with nothing to reuse), so a miss is 33x a cached hit's work.

The split holds in every phase of the shape (unlike the `flood` family, whose phases decide the
mix). One warm-up request per hot context (phase ``warmup``) arrives at the start, so the contexts
are cached before the shape's traffic; a KV cache must then hold the hot contexts to keep the hits
hits (`fairway bench --cache-fraction 1.5`: 1.5 x the contexts' tokens; the default 0.3 of the
reusable content holds about one of four). The report's hit / miss split counts what the replay's
cache actually served, not these tags.

The requests are built by the `flood` family's builder (same arrival process, block naming and
warm-up), with every phase given this family's miss share; request ids carry this family's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fairway.errors import TraceError
from fairway.traces.flood import FloodParams, build_flood
from fairway.traces.format import TraceRequest
from fairway.traces.shapes import LoadShape, check_work_basis

#: The family's default shape: calm, 3 minutes busy (0.7 x capacity in uncached tokens), calm.
DEFAULT_SHAPE = "calm:0.4:60,busy:0.7:180,calm:0.4:60"
#: Granularity of the hot contexts' lengths (vLLM's default KV block: a context in whole blocks
#: is cached whole).
CONTEXT_BLOCK = 16
#: Phase names the `flood` builder gives a fixed mix; a hit-heavy shape must not use them.
RESERVED_PHASES = ("backlog", "flood")


@dataclass(frozen=True)
class HitHeavyParams:
    """Parameters of the ``hit-heavy`` family."""

    prefix_tokens: int = 8192
    """Tokens of one hot context (the cached prefix of a hit); the shortest one with
    prefix_tokens_max."""
    prefix_tokens_max: int | None = None
    """Longest hot context: the contexts' lengths step evenly from prefix_tokens to it, in whole
    16-token blocks (None: every context has prefix_tokens)."""
    suffix_tokens: int = 256
    """Unique suffix of a hit (its work when the context is cached)."""
    miss_tokens: int = 8448
    """Length of a (unique) miss; the default is a hit's length, prefix plus suffix."""
    num_prefixes: int = 4
    """Hot contexts; a hit picks one uniformly."""
    miss_fraction: float = 0.04
    """Share of misses among the shape's requests, in every phase (SGLang #31954: ~4-5%)."""
    work_basis: str = "ideal"
    """How the request rate counts work: ideal (uncached tokens) or prompt."""
    warmup: bool = True
    """One warm-up request per hot context at t = 0, 0.5 s, ... (phase ``warmup``)."""
    max_requests: int = 20000
    """Refuse to build more requests than this."""

    def __post_init__(self) -> None:
        check_work_basis(self.work_basis)
        if not 0 <= self.miss_fraction <= 1:
            raise TraceError(f"miss_fraction must be in [0, 1], got {self.miss_fraction}")
        if self.prefix_tokens_max is not None and self.prefix_tokens_max < self.prefix_tokens:
            raise TraceError(f"prefix_tokens_max ({self.prefix_tokens_max}) must be >= "
                             f"prefix_tokens ({self.prefix_tokens})")
        self.flood_params()  # the remaining checks are the flood family's

    def prefix_lengths(self) -> list[int]:
        """Tokens of each hot context: prefix_tokens up to prefix_tokens_max in even steps.

        Whole blocks (`CONTEXT_BLOCK` tokens), so that a cached context leaves a hit exactly
        its suffix to compute; the ends are kept as given.
        """
        low, high, n = self.prefix_tokens, self.prefix_tokens_max, self.num_prefixes
        if high is None or n == 1:
            return [low] * n
        step = (high - low) / (n - 1)
        inner = [low + CONTEXT_BLOCK * round(j * step / CONTEXT_BLOCK) for j in range(1, n - 1)]
        return [low, *inner, high]

    def flood_params(self) -> FloodParams:
        """The same workload in the `flood` family's terms (every phase gets `miss_fraction`)."""
        return FloodParams(
            prefix_tokens=self.prefix_tokens, suffix_tokens=self.suffix_tokens,
            miss_tokens=self.miss_tokens, num_prefixes=self.num_prefixes,
            calm_miss_fraction=self.miss_fraction, work_basis=self.work_basis,
            warmup_requests=self.num_prefixes if self.warmup else 0,
            max_requests=self.max_requests,
        )


def build_hit_heavy(
    family: str, seed: int, shape: LoadShape, capacity_tps: float, params: HitHeavyParams
) -> tuple[list[TraceRequest], dict[str, Any]]:
    """Requests of a hit-heavy trace and the facts for the header's ``info``."""
    reserved = [p.name for p in shape.phases if p.name in RESERVED_PHASES]
    if reserved:
        raise TraceError(
            f"{family}: phase names {', '.join(RESERVED_PHASES)} are reserved (the flood family's "
            f"fixed mixes); rename phase(s) {', '.join(reserved)}"
        )
    lengths = params.prefix_lengths()
    reqs, info = build_flood(family, seed, shape, capacity_tps, params.flood_params(), lengths)
    info["miss_fraction"] = params.miss_fraction
    if params.prefix_tokens_max is not None:
        info["prefix_lengths"] = lengths
    info["source"] = "after SGLang issue #31954 (96% radix hit rate; misses ~5% of requests)"
    return reqs, info
