"""How big the virtual replay's engine is for a trace: KV cache blocks, `max_model_len`, the
longest prompt it accepts, the CPU offload tier, and vLLM's default step limits.

Why apart from `fairway.replay.sim`: sizing is decided before vLLM is imported (a bad size or an
oversized prompt fails fast, also in a worker process), and `fairway bench` and the benchmarks
size caches without replaying. Must not import vllm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fairway.errors import FairwayConfigError, TraceError
from fairway.profiling import load_cost as load_costs
from fairway.profiling.load_cost import LoadCost
from fairway.profiling.table import PrefillProfile
from fairway.replay import offload_sim
from fairway.replay.offload_sim import TierTransfers
from fairway.replay.results import default_trace_name
from fairway.traces.stats import trace_stats

if TYPE_CHECKING:
    from fairway.traces.format import Trace

#: Default share of the trace's reusable content the KV cache holds (the paper: 1/4 to 1/3).
DEFAULT_CACHE_FRACTION = 0.3
#: vLLM's default `max_num_batched_tokens` for chunked prefill on a GPU server.
DEFAULT_BATCHED_TOKENS = 2048
#: vLLM's default `max_num_seqs`; prefill-only requests leave after one step, so it rarely binds.
DEFAULT_MAX_NUM_SEQS = 256
#: Smallest `max_model_len` the replay configures (longer when a trace needs it).
MIN_MODEL_LEN = 32_768
#: Longest prompt the replay accepts: the context of the model it stands for (Llama-3.1-8B, the
#: shipped table's), which the offline engine's config declares
#: (`fairway.vllm.offline_vllm.MODEL_CONTEXT_TOKENS`, kept equal by a test; not imported: vLLM).
MAX_PROMPT_TOKENS = 131_072


# --- cache sizing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheSizing:
    """How many KV blocks the replay's engine gets, and why.

    Attributes:
        num_blocks: blocks given to vLLM (including its reserved null block).
        reusable_tokens: the trace's reusable content (`fairway.traces.stats`).
        cache_fraction: the requested share of it (None when `num_blocks` was given).
        fraction_blocks: ceil(cache_fraction x reusable_tokens / block_size).
        floor_blocks: the least that lets the largest prompt run beside a working set:
            ceil((largest prompt + 2 x max_num_batched_tokens) / block_size) + 1.
        source: "fraction", "floor" (the floor was larger) or "given".
        block_size: tokens per block.
    """

    num_blocks: int
    reusable_tokens: int
    cache_fraction: float | None
    fraction_blocks: int | None
    floor_blocks: int
    source: str
    block_size: int = 16

    @property
    def held_fraction(self) -> float | None:
        """Share of the reusable content the usable blocks can hold (may exceed 1)."""
        if self.reusable_tokens <= 0:
            return None
        return (self.num_blocks - 1) * self.block_size / self.reusable_tokens

    def to_json(self) -> dict[str, Any]:
        """For result settings."""
        return {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "reusable_tokens": self.reusable_tokens,
            "cache_fraction": self.cache_fraction,
            "fraction_blocks": self.fraction_blocks,
            "floor_blocks": self.floor_blocks,
            "source": self.source,
            "held_fraction_of_reusable": self.held_fraction,
        }


def size_cache(
    trace: Trace,
    *,
    cache_fraction: float = DEFAULT_CACHE_FRACTION,
    num_blocks: int | None = None,
    block_size: int = 16,
    max_num_batched_tokens: int = DEFAULT_BATCHED_TOKENS,
) -> CacheSizing:
    """KV cache size for a trace: `cache_fraction` of its reusable content, never below the floor.

    The floor keeps the scenario about ordering, not about a cache too small to run the trace:
    the largest prompt must fit with room for the step's other chunks (two budgets' worth).
    Without it a trace with little shared content (flood: one shared prefix) would get a cache
    smaller than one of its prompts and every policy would just fail.
    """
    if block_size < 1:
        raise FairwayConfigError(f"block_size must be >= 1, got {block_size}")
    reusable = trace_stats(trace).reusable_tokens
    largest = max((r.prompt_tokens + r.max_tokens for r in trace.requests), default=1)
    floor = -(-(largest + 2 * max_num_batched_tokens) // block_size) + 1
    if num_blocks is not None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 2:
            raise FairwayConfigError(f"num_blocks must be an integer >= 2, got {num_blocks!r}")
        return CacheSizing(num_blocks, reusable, None, None, floor, "given", block_size)
    if not (math.isfinite(cache_fraction) and cache_fraction > 0):
        raise FairwayConfigError(f"cache_fraction must be a number > 0, got {cache_fraction!r}")
    wanted = -(-math.ceil(cache_fraction * reusable) // block_size) + 1
    blocks, source = (wanted, "fraction") if wanted >= floor else (floor, "floor")
    return CacheSizing(blocks, reusable, cache_fraction, wanted, floor, source, block_size)


# --- lengths --------------------------------------------------------------------------------------


def check_prompt_lengths(trace: Trace, trace_name: str | None = None,
                         limit: int = MAX_PROMPT_TOKENS) -> None:
    """Refuse a trace with a prompt longer than the model's context, before vLLM sees it.

    vLLM's own check of an oversized `max_model_len` is a pydantic error deep in its config (a
    traceback, and unpicklable from a worker process); this one names the request.

    Raises:
        TraceError: the longest such prompt: its request id, its tokens and the limit.
    """
    longest = max(trace.requests, key=lambda r: r.prompt_tokens, default=None)
    if longest is None or longest.prompt_tokens <= limit:
        return
    over = sum(r.prompt_tokens > limit for r in trace.requests)
    name = trace_name or default_trace_name(trace)
    raise TraceError(
        f"trace {name!r}: request {longest.request_id!r} has a {longest.prompt_tokens:,}-token "
        f"prompt ({over} of {len(trace.requests)} requests are longer than {limit:,} tokens, "
        "the model's context, the longest prompt the replay's engine accepts); cut the prompts "
        "(e.g. the mooncake family's --param max_prompt_tokens=N) or leave those requests out"
    )


def model_len(trace: Trace, block_size: int) -> int:
    """The replay's `max_model_len`: its longest prompt plus output, in whole blocks.

    Never below `MIN_MODEL_LEN`; a prompt at the full context with its output tokens gets a
    length just above the context (the offline config declares the positions to match).
    """
    longest = max((r.prompt_tokens + r.max_tokens for r in trace.requests), default=1)
    return max(MIN_MODEL_LEN, -(-longest // block_size) * block_size)


# --- the offload tier -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TierSize:
    """The CPU offload tier a replay was asked for, resolved to blocks."""

    blocks: int
    gib: float
    cost: LoadCost

    def to_json(self, table: PrefillProfile, tier: TierTransfers) -> dict[str, Any]:
        """The settings' `kv_offloading` entry: size, copy figures and the traffic's totals."""
        return {
            "gib": self.gib,
            "blocks": self.blocks,
            "load_cost": self.cost.to_json(),
            "load_to_compute": self.cost.load_to_compute(table),
            **tier.counters.to_json(),
        }


def size_tier(table: PrefillProfile, block_size: int, gib: float | None, blocks: int | None,
              cost: LoadCost | None) -> TierSize | None:
    """The tier of `replay()`'s arguments (None: no tier); bad values raise
    `FairwayConfigError` before vLLM builds anything."""
    if gib is None and blocks is None:
        return None
    if gib is not None and blocks is not None:
        raise FairwayConfigError(
            f"give the offload tier's size once: kv_offloading_gib={gib!r} or "
            f"offload_blocks={blocks!r}, not both"
        )
    cost = cost if cost is not None else load_costs.for_profile(table)
    if blocks is None:
        assert gib is not None
        return TierSize(offload_sim.blocks_for_gib(gib, cost, block_size), float(gib), cost)
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
        raise FairwayConfigError(f"offload_blocks must be an integer >= 1, got {blocks!r}")
    return TierSize(blocks, offload_sim.gib_of_blocks(blocks, cost, block_size), cost)
