"""Options (`--additional-config` + FAIRWAY_* env) and the start-up refusals."""

from __future__ import annotations

import pytest

from fairway.errors import FairwayConfigError, FairwayError
from fairway.vllm.config import FairwayOptions

pytestmark = pytest.mark.integration


def test_defaults():
    options = FairwayOptions.resolve(None, {})
    assert options.policy == "fairway"
    assert options.policy_params == {}
    assert not options.protect_enabled and not options.reorder_preempted
    assert options.top_k(128) == 128
    assert FairwayOptions.resolve({"policy": "peek"}, {}).protect_enabled  # PEEK protects


def test_precedence_defaults_json_env():
    json_options = {"policy": "fairway", "fast_weight": 2, "protect": True}
    env = {"FAIRWAY_FAST_WEIGHT": "8", "FAIRWAY_PROTECT_TOP_K": "5", "OTHER": "x"}
    options = FairwayOptions.resolve(json_options, env)
    assert options.policy_params == {"fast_weight": 8}
    assert options.protect is True and options.protect_top_k == 5
    assert options.sources["fast_weight"] == "FAIRWAY_FAST_WEIGHT"
    assert options.sources["protect"] == "--additional-config fairway.protect"
    assert options.build_policy().fast_weight == 8


def test_env_selects_policy_and_its_params():
    env = {"FAIRWAY_POLICY": "klpm", "FAIRWAY_K": "4", "FAIRWAY_FAST_WEIGHT": "3"}
    options = FairwayOptions.resolve({"policy": "fairway"}, env)
    # fast_weight is not a klpm parameter; its env var is simply not read for klpm.
    assert options.policy == "klpm" and options.policy_params == {"k": 4}


@pytest.mark.parametrize(
    ("json_options", "env", "needles"),
    [
        ({"polcy": "lpm"}, {}, ["polcy", "--additional-config fairway.polcy", "policy, protect"]),
        ({"policy": "lpm", "fast_weight": 2}, {}, ["fast_weight", "policy 'lpm'"]),
        ({"policy": "nope"}, {}, ["'nope'", "fcfs", "fairway-nofair"]),
        ({}, {"FAIRWAY_POLICY": "nope"}, ["FAIRWAY_POLICY", "known policies"]),
        ({"fast_weight": -1}, {}, ["fast_weight=-1", "--additional-config fairway.fast_weight"]),
        ({}, {"FAIRWAY_FAST_WEIGHT": "abc"}, ["fast_weight='abc'", "FAIRWAY_FAST_WEIGHT"]),
        ({}, {"FAIRWAY_PROTECT": "maybe"}, ["protect='maybe'", "FAIRWAY_PROTECT", "true or false"]),
        ({"protect_top_k": 0}, {}, ["protect_top_k=0", "integer >= 1"]),
        ({"reorder_preempted": "x"}, {}, ["reorder_preempted", "true or false"]),
        ({"profile": "no-such-profile"}, {}, ["profile='no-such-profile'"]),
        ("fast", {}, ["must be a JSON object"]),
    ],
)
def test_bad_options_name_key_value_source_and_allowed(json_options, env, needles):
    with pytest.raises(FairwayConfigError) as info:
        FairwayOptions.resolve(json_options, env)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


def test_env_is_read_at_construction(offline, monkeypatch):
    monkeypatch.setenv("FAIRWAY_FAST_WEIGHT", "6")
    sched = offline.make_offline_scheduler("fairway", fairway_options={"fast_weight": 2})
    assert sched.fairway_policy.fast_weight == 6
    monkeypatch.setenv("FAIRWAY_FAST_WEIGHT", "0")
    with pytest.raises(FairwayConfigError, match="FAIRWAY_FAST_WEIGHT"):
        offline.make_offline_scheduler("fairway")


def test_priority_queue_is_refused(offline):
    with pytest.raises(FairwayConfigError, match="--scheduling-policy fcfs"):
        offline.make_offline_scheduler("fcfs", scheduling_policy="priority")


def test_cache_aware_policy_needs_prefix_caching(offline):
    with pytest.raises(FairwayConfigError, match="--enable-prefix-caching") as info:
        offline.make_offline_scheduler("lpm", enable_prefix_caching=False)
    assert "fcfs" in str(info.value)  # names the policies that work without it


def test_cache_agnostic_policy_runs_without_prefix_caching(offline, helpers):
    sched = offline.make_offline_scheduler("fcfs", enable_prefix_caching=False)
    sched.add_request(offline.make_request("a", helpers.tokens(1, 100), 1.0))
    offline.run_until_idle(sched)
    assert sched.fairway_totals.steps_ordered >= 1 and not sched.requests


def test_self_check_names_the_vllm_version(offline, monkeypatch):
    import vllm

    from fairway.vllm import probe

    monkeypatch.setattr(probe, "INTERNAL_NAMES", (*probe.INTERNAL_NAMES, "BlockPool.gone_in_0_99"))
    with pytest.raises(FairwayError) as info:
        offline.make_offline_scheduler("fcfs")
    message = str(info.value)
    assert vllm.__version__ in message and "BlockPool.gone_in_0_99" in message


def test_self_calibrate_option_wires_the_calibration(offline, helpers):
    sched = offline.make_offline_scheduler("fairway", fairway_options={"self_calibrate": True})
    assert sched.fairway_options.self_calibrate and sched._fairway_calibration is not None
    for i in range(3):
        sched.add_request(offline.make_request(f"c{i}", helpers.tokens(1_000 * i, 200), 1.0))
    offline.run_until_idle(sched)
    assert not sched.requests and sched.fairway_totals.policy_fallbacks == 0
    off = offline.make_offline_scheduler("fcfs")
    assert not off.fairway_options.self_calibrate and off._fairway_calibration is None
