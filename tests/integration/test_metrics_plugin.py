"""Metrics (in-process and across processes, as vLLM's /metrics collects them) and the plugin."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess

from fairway.vllm.metrics import MULTIPROC_ENV, FairwayStats, prepare_server_env

pytestmark = pytest.mark.integration


def _labels(sched) -> dict[str, str]:
    return dict(sched.fairway_metrics.labels)


def test_series_follow_the_steps(offline, helpers):
    if os.environ.get(MULTIPROC_ENV):
        pytest.skip("in-process registry check; the suite runs in multiprocess mode")
    sched = offline.make_offline_scheduler("fairway-nofair", max_num_batched_tokens=64)
    labels = _labels(sched)
    assert labels["policy"] == "fairway-nofair" and labels["engine"] == "0"

    def value(name, **extra):
        return REGISTRY.get_sample_value(name, {**labels, **extra}) or 0.0

    before = {
        n: value(n) for n in ("fairway:steps_ordered_total", "fairway:policy_fallbacks_total")
    }
    fast_before = value("fairway:requests_placed_total", lane="fast")
    count_before = value("fairway:prepass_seconds_count")
    for i in range(4):
        sched.add_request(offline.make_request(f"r{i}", helpers.tokens(1_000 * i, 100), 1.0))
    offline.run_until_idle(sched)
    steps = sched.fairway_totals.steps_ordered
    assert steps >= 4
    assert value("fairway:steps_ordered_total") - before["fairway:steps_ordered_total"] == steps
    assert value("fairway:requests_placed_total", lane="fast") - fast_before == 4
    assert value("fairway:prepass_seconds_count") - count_before == steps
    assert value("fairway:policy_fallbacks_total") == before["fairway:policy_fallbacks_total"]
    assert value("fairway:queue_work_max_tokens") >= value("fairway:queue_work_min_tokens") >= 1


def test_share_series_count_lane_tokens_and_oldest_age(offline, helpers):
    """`fairway:lane_prefill_tokens_total{lane}` adds up what vLLM scheduled for each lane;
    `fairway:oldest_waiting_age_seconds` is the oldest waiting request's age at the last step."""
    if os.environ.get(MULTIPROC_ENV):
        pytest.skip("in-process registry check; the suite runs in multiprocess mode")
    sched = offline.make_offline_scheduler("fairway", max_num_batched_tokens=64)
    labels = _labels(sched)

    def value(name, **extra):
        return REGISTRY.get_sample_value(name, {**labels, **extra}) or 0.0

    before = {
        lane: value("fairway:lane_prefill_tokens_total", lane=lane) for lane in ("fair", "fast")
    }
    sched.fairway_clock = lambda: 5.0
    sched.add_request(offline.make_request("old", helpers.tokens(1, 300), 1.0))
    sched.add_request(offline.make_request("new", helpers.tokens(5_000, 100), 2.0))
    offline.step(sched)
    assert value("fairway:oldest_waiting_age_seconds") == 4.0  # "old" waited 5.0 - 1.0
    offline.run_until_idle(sched)
    assert value("fairway:oldest_waiting_age_seconds") == 0.0  # nobody waits
    got = {
        lane: value("fairway:lane_prefill_tokens_total", lane=lane) - before[lane]
        for lane in before
    }
    # "old" is the front while it prefills (all its 300 tokens are fair), then "new" is alone and
    # the front; how much "new" gets meanwhile (fast) depends on the two Fast scores.
    assert got["fair"] + got["fast"] == 400
    assert got["fair"] >= 300


def test_no_metrics_without_log_stats(offline, helpers):
    sched = offline.make_offline_scheduler("fcfs", log_stats=False)
    sched.add_request(offline.make_request("a", helpers.tokens(1, 50), 1.0))
    offline.run_until_idle(sched)
    assert sched.fairway_metrics is None
    assert sched.fairway_totals.steps_ordered == 1  # the totals are still kept


def test_stats_get_and_reset():
    stats = FairwayStats()
    stats.steps_ordered += 2
    stats.placed["fair"] += 1
    stats.prepass_s.append(0.5)
    taken = stats.take()
    assert taken.steps_ordered == 2 and taken.placed["fair"] == 1 and taken.prepass_s == [0.5]
    assert stats.steps_ordered == 0 and stats.placed["fair"] == 0 and stats.prepass_s == []
    totals = FairwayStats()
    totals.add(taken)
    totals.add(taken)
    assert totals.steps_ordered == 4 and totals.prepass_count == 2 and totals.prepass_s == []
    # reset(): the scheduler's per-step path, in place; what `taken` holds is not touched
    stats.steps_ordered, stats.oldest_waiting_age_s = 3, 1.5
    stats.lane_prefill_tokens["fast"] += 7
    stats.prepass_s.append(0.25)
    placed = stats.placed
    stats.reset()
    assert stats.steps_ordered == 0 and stats.oldest_waiting_age_s is None
    assert stats.lane_prefill_tokens["fast"] == 0 and stats.prepass_s == []
    assert stats.placed is placed and set(placed.values()) == {0}
    assert taken.prepass_s == [0.5] and taken.placed["fair"] == 1


def test_prepare_server_env(tmp_path):
    env = prepare_server_env({"PATH": "/bin"})
    assert os.path.isdir(env[MULTIPROC_ENV]) and not os.listdir(env[MULTIPROC_ENV])
    assert env["PATH"] == "/bin"
    keep = prepare_server_env({MULTIPROC_ENV: str(tmp_path)})
    assert keep[MULTIPROC_ENV] == str(tmp_path)
    os.rmdir(env[MULTIPROC_ENV])


def test_series_cross_processes_in_multiprocess_mode(tmp_path):
    """What vLLM's API server does: collect the EngineCore's files from PROMETHEUS_MULTIPROC_DIR."""
    child = textwrap.dedent(
        """
        from fairway.vllm.metrics import FairwayMetrics, FairwayStats
        metrics = FairwayMetrics(model_name="tiny", engine="0", policy="fairway")
        stats = FairwayStats(steps_ordered=3, policy_fallbacks=1)
        stats.placed["fast"] = 2
        stats.prepass_s = [0.0004, 0.002]
        stats.queue_work_max_tokens, stats.queue_work_min_tokens = 6000, 300
        stats.lane_prefill_tokens["fair"] = 409
        stats.oldest_waiting_age_s = 12.5
        metrics.record(stats)
        """
    )
    env = prepare_server_env(dict(os.environ), multiproc_dir=str(tmp_path))
    subprocess.run([sys.executable, "-c", child], env=env, check=True, timeout=120)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    text = generate_latest(registry).decode()
    labels = 'engine="0",model_name="tiny",policy="fairway"'
    for line in (
        f"fairway:steps_ordered_total{{{labels}}} 3.0",
        f"fairway:policy_fallbacks_total{{{labels}}} 1.0",
        'fairway:requests_placed_total{engine="0",lane="fast",model_name="tiny",'
        'policy="fairway"} 2.0',
        f"fairway:prepass_seconds_count{{{labels}}} 2.0",
        f"fairway:queue_work_max_tokens{{{labels}}} 6000.0",
        f"fairway:queue_work_min_tokens{{{labels}}} 300.0",
        'fairway:lane_prefill_tokens_total{engine="0",lane="fair",model_name="tiny",'
        'policy="fairway"} 409.0',
        f"fairway:oldest_waiting_age_seconds{{{labels}}} 12.5",
    ):
        assert line in text, (line, text)


@pytest.fixture()
def restore_fairway_logger():
    logger = logging.getLogger("fairway")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield logger
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def test_plugin_register(restore_fairway_logger, monkeypatch):
    from fairway.vllm import plugin

    monkeypatch.setattr(plugin, "_registered", False)
    vllm_logger = logging.getLogger("vllm")
    seen: list[logging.LogRecord] = []

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append(record)

    plugin.register()
    plugin.register()  # idempotent
    fairway_logger = restore_fairway_logger
    ours = [h for h in fairway_logger.handlers if type(h).__module__ == plugin.__name__]
    assert len(ours) == 1
    assert fairway_logger.propagate is False
    # vLLM configures its logger later (the API server does so after loading plugins).
    catch = Catch(logging.INFO)
    vllm_logger.addHandler(catch)
    try:
        logging.getLogger("fairway.vllm.scheduler").info("start-up line %s", 1)
    finally:
        vllm_logger.removeHandler(catch)
    assert [r.getMessage() for r in seen] == ["start-up line 1"]


def test_plugin_never_raises(restore_fairway_logger, monkeypatch):
    from fairway.vllm import plugin

    calls: list[str] = []
    seen: list[logging.LogRecord] = []

    def broken():
        calls.append("attach")
        raise RuntimeError("boom")

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append(record)

    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(plugin, "attach_vllm_logging", broken)
    catch = Catch(logging.DEBUG)
    plugin.logger.addHandler(catch)
    try:
        plugin.register()  # must log the failure, not raise it
        plugin.register()  # and not try again
    finally:
        plugin.logger.removeHandler(catch)
    assert calls == ["attach"]
    errors = [r for r in seen if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == ["Fairway plugin registration failed"]
    assert errors[0].exc_info is not None and str(errors[0].exc_info[1]) == "boom"


@pytest.mark.parametrize(
    ("version", "ok"),
    [("0.32.0", True), ("0.32.0+cpu", True), ("0.33.1", True), ("0.34.0", True),
     ("0.34.0+cpu", True), ("0.35.0", False), ("0.31.2", False), ("dev", False)],
)  # fmt: skip
def test_version_range(version, ok):
    from fairway.vllm.plugin import version_problem

    assert (version_problem(version) is None) == ok
