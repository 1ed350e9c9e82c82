"""The documented class follows vLLM's async-scheduling setting, through vLLM's own resolution.

EngineCore builds `vllm_config.scheduler_config.get_scheduler_cls()` with the resolved config. The
CPU platform forces async scheduling off, so the GPU case keeps what vLLM's generic rules decided
(`async_scheduling=None` -> on, with an executor that supports it) by undoing only that override.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

DOCUMENTED = "fairway.vllm.scheduler.FairwayScheduler"


@pytest.fixture()
def gpu_like_async_default(monkeypatch):
    """Let vLLM's default (async on) survive the CPU platform's `async_scheduling = False`."""
    from vllm.platforms import current_platform

    original = current_platform.check_and_update_config

    def keep_vllm_default(vllm_config):
        decided = vllm_config.scheduler_config.async_scheduling
        original(vllm_config)
        vllm_config.scheduler_config.async_scheduling = decided

    monkeypatch.setattr(current_platform, "check_and_update_config", keep_vllm_default)


def _engine_class(name: str):
    from vllm.config import SchedulerConfig

    return SchedulerConfig(max_model_len=4096, is_encoder_decoder=False, scheduler_cls=name)


@pytest.mark.parametrize("name", [DOCUMENTED, "fairway.vllm.FairwayScheduler"])
def test_vllm_resolves_the_documented_name_to_the_resolving_class(name):
    from fairway.vllm.scheduler import FairwayScheduler

    assert _engine_class(name).get_scheduler_cls() is FairwayScheduler


def test_async_default_gives_the_async_scheduler(offline, helpers, gpu_like_async_default):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from fairway.vllm.scheduler import FairwayAsyncScheduler, FairwayScheduler

    cls = _engine_class(DOCUMENTED).get_scheduler_cls()
    sched = offline.make_offline_scheduler("fairway", async_scheduling=None, scheduler_cls=cls)
    assert sched.vllm_config.scheduler_config.async_scheduling is True  # vLLM's own default
    assert type(sched) is FairwayAsyncScheduler
    assert isinstance(sched, AsyncScheduler) and isinstance(sched, FairwayScheduler)
    _serve_a_few(offline, helpers, sched)


@pytest.mark.parametrize("setting", [False, None])
def test_sync_setting_gives_the_sync_scheduler(offline, helpers, setting):
    """--no-async-scheduling, and the CPU platform's default."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from fairway.vllm.scheduler import FairwayScheduler

    cls = _engine_class(DOCUMENTED).get_scheduler_cls()
    sched = offline.make_offline_scheduler("fairway", async_scheduling=setting, scheduler_cls=cls)
    assert sched.vllm_config.scheduler_config.async_scheduling is False
    assert type(sched) is FairwayScheduler and not isinstance(sched, AsyncScheduler)
    _serve_a_few(offline, helpers, sched)


def test_explicit_async_setting_and_subclasses(offline, gpu_like_async_default):
    """--async-scheduling picks the async base; a subclass keeps the base it chose."""
    from fairway.vllm.scheduler import FairwayAsyncScheduler, FairwayScheduler

    sched = offline.make_offline_scheduler(
        "lpm", async_scheduling=True, scheduler_cls=FairwayScheduler
    )
    assert type(sched) is FairwayAsyncScheduler

    class Mine(FairwayScheduler):
        pass

    sched = offline.make_offline_scheduler("lpm", async_scheduling=True, scheduler_cls=Mine)
    assert type(sched) is Mine


def _serve_a_few(offline, helpers, sched) -> None:
    for i in range(6):
        prompt = helpers.tokens(1, 64) + helpers.tokens(1_000 * (i + 1), 20 + i)
        sched.add_request(offline.make_request(f"r{i}", prompt, float(i), max_tokens=3))
    offline.run_until_idle(sched, max_steps=200)
    assert not sched.has_requests()
    assert sched.fairway_totals.policy_fallbacks == 0
