"""Fairway's scheduler (or vLLM's own) built and driven offline: no model, no GPU, no download.

Used by the integration tests, the scheduler-overhead benchmark and the virtual-clock replay
(`fairway.replay.sim`). The engine is built as `fairway.vllm.offline_vllm` builds vLLM's own (a
tiny local `config.json`, a fake one-group KV cache sized in blocks; `make_request` and
`fake_model_output` come from there too); this module adds Fairway's scheduler class and options,
and the step loop the tests and benchmarks drive it with.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

# huggingface_hub reads this at import time: set before vLLM is imported (as in offline_vllm).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402  (after HF_HUB_OFFLINE)
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.engine import EngineCoreOutputs  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from fairway.options import FairwayOptions  # noqa: E402
from fairway.vllm.offline_vllm import (  # noqa: E402
    build_scheduler,
    engine_configs,
    fake_model_output,
    make_request,
)
from fairway.vllm.scheduler import (  # noqa: E402
    FairwayAsyncScheduler,
    FairwayScheduler,
    FairwaySchedulerMixin,
)

__all__ = [
    "add_requests", "fake_model_output", "finished_ids", "make_offline_scheduler", "make_request",
    "run_until_idle", "step",
]


def make_offline_scheduler(
    policy: str | FairwayOptions | None = "fairway",
    *,
    async_scheduling: bool = False,
    block_size: int = 16,
    fairway_options: Mapping[str, Any] | None = None,
    scheduler_cls: type[Scheduler] | None = None,
    log_stats: bool = True,
    **engine: Any,
) -> Scheduler:
    """Construct a vLLM V1 scheduler (Fairway's by default) over a fake KV cache.

    Args:
        policy: Fairway registry name (`fairway`, `fcfs`, `lpm`, ...) or a `FairwayOptions`, or
            None for vLLM's own `Scheduler`/`AsyncScheduler` (the overhead benchmark's baseline).
        async_scheduling: use the AsyncScheduler variant (output placeholders, overlap).
        block_size: tokens per KV block (also the prefix-cache hash granularity).
        fairway_options: more options (policy parameters, serving options) added to `policy`.
            The scheduler gets one `FairwayOptions` object and never reads `FAIRWAY_*`: that
            is a server's environment, not the replay's.
        scheduler_cls: the class to build (default: FairwayScheduler / FairwayAsyncScheduler,
            or vLLM's classes when `policy` is None); tests pass subclasses.
        log_stats: vLLM's `log_stats` (prefix-cache stats, Fairway's Prometheus metrics).
        **engine: the engine's size and limits, `fairway.vllm.offline_vllm.engine_configs`'s
            arguments (`num_blocks`, `max_num_batched_tokens`, `max_num_seqs`, `max_model_len`,
            `enable_prefix_caching`, `model_dir`, `kv_transfer_config`, and any other
            `SchedulerConfig` or `CacheConfig` field). Unknown names raise TypeError.

    Returns:
        The scheduler, ready for `add_request` / `schedule` / `update_from_output`.
    """
    vllm_config, kv_cache_config = engine_configs(
        async_scheduling=async_scheduling, block_size=block_size, **engine
    )
    options = None if policy is None else FairwayOptions.for_replay(policy, serving=fairway_options)
    cls = scheduler_cls or _default_class(options is not None, async_scheduling)
    if options is None:
        return build_scheduler(
            cls, vllm_config, kv_cache_config, block_size=block_size, log_stats=log_stats
        )
    if not issubclass(cls, FairwaySchedulerMixin):
        raise TypeError(f"a Fairway policy needs a Fairway scheduler class, not {cls.__name__}")
    scheduler = build_scheduler(
        cls, vllm_config, kv_cache_config, block_size=block_size, log_stats=log_stats,
        fairway_options=options,  # the mixin's __init__ takes the options
    )
    assert isinstance(scheduler, Scheduler)
    return scheduler


def _default_class(fairway: bool, async_scheduling: bool) -> type[Scheduler]:
    if not fairway:
        return AsyncScheduler if async_scheduling else Scheduler
    return FairwayAsyncScheduler if async_scheduling else FairwayScheduler


def step(
    scheduler: Scheduler, token: int = 7
) -> tuple[SchedulerOutput, dict[int, EngineCoreOutputs]]:
    """One engine step: `schedule()`, fake model output, `update_from_output()`.

    Works for both scheduler classes (an AsyncScheduler answered at once is a valid pipeline of
    depth one). Returns the scheduler output and the engine-core outputs per client.
    """
    scheduler_output = scheduler.schedule()
    model_output = fake_model_output(scheduler, scheduler_output, token)
    return scheduler_output, scheduler.update_from_output(scheduler_output, model_output)


def finished_ids(engine_outputs: Mapping[int, EngineCoreOutputs]) -> list[str]:
    """Ids of requests that finished in these engine outputs (any reason)."""
    return [
        out.request_id
        for outputs in engine_outputs.values()
        for out in outputs.outputs
        if out.finish_reason is not None
    ]


def run_until_idle(
    scheduler: Scheduler, max_steps: int = 10_000, token: int = 7
) -> list[SchedulerOutput]:
    """Step until no request is left (or `max_steps`); returns the scheduler outputs."""
    outputs: list[SchedulerOutput] = []
    while scheduler.has_requests() and len(outputs) < max_steps:
        outputs.append(step(scheduler, token)[0])
    return outputs


def add_requests(scheduler: Scheduler, requests: Iterable[Request]) -> None:
    """`scheduler.add_request` for each request, in order."""
    for request in requests:
        scheduler.add_request(request)
