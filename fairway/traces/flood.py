"""Flood: a backlog of cache misses builds up, then a large stream of highly cached requests.

Two kinds of request:

* **miss**: one long unique prompt (`miss_tokens`), nothing to reuse;
* **hit**: a long shared prefix (`prefix_tokens`, one of `num_prefixes`) and a short unique
  suffix (`suffix_tokens`); with the prefix cached only the suffix is work.

The phase decides the mix: ``backlog`` sends only misses, ``flood`` only hits, any other phase
(``calm`` in the default `flood` shape) misses with probability `calm_miss_fraction`. A
cache-greedy order serves the flood first and starves the backlog; FCFS serves the backlog and
makes the cheap flood wait.

**Warm-up**: before the shape's arrivals, `warmup_requests` hit-shaped requests (phase
``warmup``, tag ``kind=warmup``) arrive at t = 0, `warmup_spacing_s`, 2 x `warmup_spacing_s`, ...,
the k-th carrying shared prefix k mod `num_prefixes` and its own unique suffix. The engine is
idle at t = 0, so the first one computes the flood's prefix before the backlog of misses builds:
when the flood starts, its requests are cache hits (as long as the KV cache has kept the prefix;
under LRU eviction that needs a cache that outlasts the backlog's misses). Without it the first
flood request is itself a miss queued behind the backlog and no order sees a hit until it runs.
They are extra requests: the phase rates, and so every other request (arrival, blocks, id), are
the same as with ``warmup_requests=0``.

Loads default to the ``ideal`` work basis, since the flood is meant to be cheap: its phase rate
is load x capacity / (expected uncached tokens of the phase's mix).

Block ids of unique content carry the seed (``fl-<seed>-...``), so two flood traces never share
by accident on one server.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairway.errors import TraceError
from fairway.traces.format import TraceRequest, make_request
from fairway.traces.shapes import LoadShape, check_work_basis, phase_rates, poisson_arrivals

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FloodParams:
    """Parameters of the ``flood`` family."""

    prefix_tokens: int = 6144
    """Shared prefix of a hit request."""
    suffix_tokens: int = 256
    """Unique suffix of a hit request."""
    miss_tokens: int = 8192
    """Length of a (unique) miss request."""
    num_prefixes: int = 1
    """Distinct shared prefixes; a hit request picks one uniformly."""
    calm_miss_fraction: float = 0.2
    """Share of misses in phases other than backlog and flood."""
    work_basis: str = "ideal"
    """How the request rate counts work: ideal or prompt (see fairway.traces.shapes)."""
    warmup_requests: int = 1
    """Hit-shaped requests at the start (t = 0, then every `warmup_spacing_s`) that compute the
    shared prefixes before the backlog builds; 0: none (the flood's prefix starts cold)."""
    warmup_spacing_s: float = 0.5
    """Seconds between two warm-up requests."""
    max_requests: int = 20000
    """Refuse to build more requests than this."""

    def __post_init__(self) -> None:
        check_work_basis(self.work_basis)
        if min(self.prefix_tokens, self.suffix_tokens, self.miss_tokens, self.num_prefixes) < 1:
            raise TraceError("prefix_tokens, suffix_tokens, miss_tokens, num_prefixes must be >= 1")
        if not 0 <= self.calm_miss_fraction <= 1:
            raise TraceError(f"calm_miss_fraction must be in [0, 1], got {self.calm_miss_fraction}")
        if self.warmup_requests < 0:
            raise TraceError(f"warmup_requests must be >= 0, got {self.warmup_requests}")
        if not (math.isfinite(self.warmup_spacing_s) and self.warmup_spacing_s >= 0):
            raise TraceError(f"warmup_spacing_s must be >= 0, got {self.warmup_spacing_s}")

    def miss_fraction(self, phase: str) -> float:
        """Probability that a request of `phase` is a miss."""
        return {"backlog": 1.0, "flood": 0.0}.get(phase, self.calm_miss_fraction)

    def expected_work(self, phase: str, prefix_tokens: float | None = None) -> float:
        """Expected work of one request of `phase` (the first hit's prefix miss is ignored).

        `prefix_tokens`: a hit's mean prefix when the prefixes differ in length (default
        `self.prefix_tokens`); it counts only on the prompt work basis.
        """
        f = self.miss_fraction(phase)
        prefix = self.prefix_tokens if prefix_tokens is None else prefix_tokens
        hit = self.suffix_tokens + (prefix if self.work_basis == "prompt" else 0)
        return f * self.miss_tokens + (1.0 - f) * hit

    def prefix_lengths(self) -> list[int]:
        """Every shared prefix has `prefix_tokens` (other families may pass their own)."""
        return [self.prefix_tokens] * self.num_prefixes


def build_flood(
    family: str, seed: int, shape: LoadShape, capacity_tps: float, params: FloodParams,
    prefix_lengths: Sequence[int] | None = None,
) -> tuple[list[TraceRequest], dict[str, Any]]:
    """Requests of a flood trace and the facts for the header's ``info``.

    `prefix_lengths`: tokens of each shared prefix (one per prefix; default every one
    `prefix_tokens`), for families whose hot contexts differ in length (`hit-heavy`).
    """
    lengths = list(prefix_lengths) if prefix_lengths is not None else params.prefix_lengths()
    if len(lengths) != params.num_prefixes or min(lengths) < 1:
        raise TraceError(f"{family}: need {params.num_prefixes} prefix lengths >= 1, got {lengths}")
    mean_prefix = sum(lengths) / len(lengths)
    work = {p.name: params.expected_work(p.name, mean_prefix) for p in shape.phases}
    rates = phase_rates(shape, capacity_tps, work)
    times = poisson_arrivals(shape, rates, np.random.default_rng([seed, 1]))
    if len(times) + params.warmup_requests > params.max_requests:
        raise TraceError(
            f"{family}: the shape needs {len(times)} requests (+ {params.warmup_requests} "
            f"warm-up), more than max_requests="
            f"{params.max_requests}; lower the load or raise max_requests"
        )
    draws = np.random.default_rng([seed, 2]).random((len(times), 2))
    warmup = _warmup_requests(family, seed, params, lengths)
    shaped = []
    for i, t in enumerate(times):
        t = round(float(t), 6)
        phase = shape.phase_at(t)
        if draws[i, 0] < params.miss_fraction(phase):
            blocks = [(f"fl-{seed}-miss-{i}", params.miss_tokens)]
            tags: dict[str, Any] = {"kind": "miss"}
        else:
            j = min(int(draws[i, 1] * params.num_prefixes), params.num_prefixes - 1)
            blocks = [_prefix_block(j, lengths[j]), (f"fl-{seed}-suffix-{i}", params.suffix_tokens)]
            tags = {"kind": "hit", "prefix": j}
        shaped.append(make_request(f"{family}-{i:05d}", t, blocks, phase=phase, tags=tags))
    # Merge by arrival (stable: at equal times a warm-up request goes first).
    reqs = sorted([*warmup, *shaped], key=lambda r: r.arrival_s)
    info = {
        "work_basis": params.work_basis,
        "work_per_request_tokens": {k: round(v, 3) for k, v in sorted(work.items())},
        "warmup": [
            {"request_id": r.request_id, "arrival_s": r.arrival_s, "prefix": r.tags["prefix"]}
            for r in warmup
        ],
    }
    return reqs, info


def _prefix_block(j: int, tokens: int) -> tuple[str, int]:
    """Shared prefix j of `tokens` tokens (the length is in the id: one id, one token count)."""
    return f"fl-prefix-{j}-{tokens}", tokens


def _warmup_requests(family: str, seed: int, params: FloodParams,
                     lengths: Sequence[int]) -> list[TraceRequest]:
    """The warm-up requests: prefix k mod num_prefixes and a unique suffix, k x spacing apart."""
    out = []
    for k in range(params.warmup_requests):
        j = k % params.num_prefixes
        blocks = [_prefix_block(j, lengths[j]), (f"fl-{seed}-warmup-{k}", params.suffix_tokens)]
        out.append(make_request(
            f"{family}-warmup-{k:02d}", k * params.warmup_spacing_s, blocks, phase="warmup",
            tags={"kind": "warmup", "prefix": j},
        ))
    return out
