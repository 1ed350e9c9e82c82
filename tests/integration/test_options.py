"""Options (`fairway.options`: `--additional-config` + FAIRWAY_* env) and the start-up refusals."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from fairway.errors import FairwayConfigError, FairwayError
from fairway.options import (
    FairwayOptions,
    Setting,
    parse_policy_args,
    policy_arg_settings,
)

pytestmark = pytest.mark.integration


def test_defaults():
    options = FairwayOptions.resolve(None, {})
    assert options.policy == "fairway"
    assert options.policy_params == {}
    assert options.protect_enabled and not options.reorder_preempted  # fairway: its cache half
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
    env = {"FAIRWAY_POLICY": "klpm", "FAIRWAY_K": "4", "FAIRWAY_DATA": "/data"}
    options = FairwayOptions.resolve({"policy": "fairway"}, env)
    assert options.policy == "klpm" and options.policy_params == {"k": 4}
    assert options.sources == {"policy": "FAIRWAY_POLICY", "k": "FAIRWAY_K"}


def test_env_parameter_of_another_policy_is_an_error():
    """As the same key in the JSON would be: a server never ignores a FAIRWAY_ variable."""
    env = {"FAIRWAY_POLICY": "klpm", "FAIRWAY_FAST_WEIGHT": "3"}
    with pytest.raises(FairwayConfigError) as info:
        FairwayOptions.resolve(None, env)
    message = str(info.value)
    assert "fast_weight=3 (from FAIRWAY_FAST_WEIGHT)" in message
    assert "a parameter of fairway" in message and "parameters of policy 'klpm': k" in message


def test_unknown_env_variable_lists_the_known_names():
    with pytest.raises(FairwayConfigError) as info:
        FairwayOptions.resolve(None, {"FAIRWAY_FASTWEIGHT": "3"})
    message = str(info.value)
    for needle in ("FAIRWAY_FASTWEIGHT='3'", "did you mean FAIRWAY_FAST_WEIGHT?",
                   "FAIRWAY_PROTECT_TOP_K", "FAIRWAY_K", "FAIRWAY_DATA", "FAIRWAY_TARGET"):
        assert needle in message, (needle, message)


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
        ({"protect_top_k": True}, {}, ["protect_top_k=True", "integer >= 1"]),
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


def test_a_server_reads_the_environment_at_construction(offline, monkeypatch):
    """Built as vLLM builds it (no options object): JSON from the config, then FAIRWAY_*."""
    from fairway.vllm.scheduler import FairwayScheduler

    monkeypatch.setenv("FAIRWAY_FAST_WEIGHT", "6")
    sched = offline.make_offline_scheduler(None, scheduler_cls=FairwayScheduler)
    assert sched.fairway_options.sources == {"fast_weight": "FAIRWAY_FAST_WEIGHT"}
    assert sched.fairway_policy.fast_weight == 6
    config = SimpleNamespace(additional_config={"fairway": {"fast_weight": 2, "protect": True}})
    options = FairwayOptions.from_vllm_config(config)
    assert options.policy_params == {"fast_weight": 6} and options.protect is True
    monkeypatch.setenv("FAIRWAY_FAST_WEIGHT", "0")
    with pytest.raises(FairwayConfigError, match="FAIRWAY_FAST_WEIGHT"):
        offline.make_offline_scheduler(None, scheduler_cls=FairwayScheduler)


def test_in_process_schedulers_never_read_the_environment(offline, monkeypatch):
    """The replay's engine: `FAIRWAY_*` belongs to a server, so it cannot change a replay."""
    monkeypatch.setenv("FAIRWAY_POLICY", "lpm")
    monkeypatch.setenv("FAIRWAY_FAST_WEIGHT", "0")
    monkeypatch.setenv("FAIRWAY_FASTWEIGHT", "1")
    sched = offline.make_offline_scheduler("fairway", fairway_options={"fast_weight": 2})
    assert sched.fairway_options.policy == "fairway" and sched.fairway_policy.fast_weight == 2
    fcfs = offline.make_offline_scheduler(FairwayOptions.for_replay("fcfs"))
    assert type(fcfs.fairway_policy).__name__ == "FCFSPolicy"


def test_the_options_object_is_frozen_and_pickles():
    options = FairwayOptions.for_replay("fairway", {"fast_weight": 2}, {"protect": True})
    with pytest.raises(AttributeError):
        options.policy = "lpm"
    assert pickle.loads(pickle.dumps(options)) == options
    assert options.to_json() == {"policy": "fairway", "fast_weight": 2, "protect": True}
    assert options.sources["fast_weight"] == "the replay fast_weight"


@pytest.mark.parametrize(
    ("items", "selected", "expected"),
    [
        (["fast_weight=2"], ["fcfs", "fairway", "fairway-abswait"],
         {"fcfs": [], "fairway": [2], "fairway-abswait": [2]}),
        (["fairway.fast_weight=2"], ["fairway", "fairway-abswait"],
         {"fairway": [2], "fairway-abswait": []}),
        (["k=3", "klpm-4.k=5"], ["klpm", "klpm-4"], {"klpm": [3], "klpm-4": [3, 5]}),
    ],
)
def test_one_policy_arg_grammar(items, selected, expected):
    found = policy_arg_settings(parse_policy_args(items), selected)
    assert {p: [s.value for s in found[p]] for p in found} == expected
    assert all(s.source.startswith("--policy-arg ") for p in found for s in found[p])


@pytest.mark.parametrize(
    ("items", "selected", "message"),
    [
        (["speed=2"], ["fcfs", "lpm"], "no policy of this run has a parameter 'speed'"),
        (["speed=2"], ["fairway"], "policy 'fairway' has no parameter 'speed'; its parameters"),
        (["lpm.k=2"], ["fairway"], "policy 'lpm' is not in this run"),
        (["fairway.k=2"], ["fairway"], "policy 'fairway' has no parameter 'k'"),
        (["fast_weight"], ["fairway"], "must be KEY=VALUE or POLICY.KEY=VALUE"),
        ([".k=1"], ["klpm"], "must be KEY=VALUE or POLICY.KEY=VALUE"),
    ],
)
def test_bad_policy_args(items, selected, message):
    with pytest.raises(FairwayConfigError, match=message):
        policy_arg_settings(parse_policy_args(items), selected)


def test_later_settings_win_and_keep_their_source():
    options = FairwayOptions.from_settings([
        Setting("fast_weight", 2, "--policy-arg fast_weight"),
        Setting("fast_weight", 3, "FAIRWAY_FAST_WEIGHT"),
    ])
    assert options.policy_params == {"fast_weight": 3}
    assert options.sources == {"fast_weight": "FAIRWAY_FAST_WEIGHT"}
    assert options.to_json(skip_env=True) == {}


def test_plugin_stops_a_bad_vllm_serve_command():
    from fairway.vllm import plugin

    argv = ["vllm", "serve", "m", "--scheduler-cls", "fairway.vllm.FairwayScheduler",
            "--additional-config", '{"fairway": {"protect_top_k": 0}}']
    with pytest.raises(SystemExit) as info:
        plugin.check_serve_command(argv, {})
    assert str(info.value).startswith("fairway: error: Fairway option protect_top_k=0")
    plugin.check_serve_command(argv[:3], {"FAIRWAY_FASTWEIGHT": "1"})  # not Fairway's: no check


def test_priority_scheduling_orders_levels_first(offline, helpers):
    """Under --scheduling-policy priority the waiting heap is vLLM's FCFS deque, ordered with
    the priority levels first (lower first, as vLLM), so a later request of a higher level
    starts first; the scheduler still preempts by priority (`scheduler.policy` is vLLM's)."""
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue, SchedulingPolicy

    sched = offline.make_offline_scheduler(
        "fcfs", scheduling_policy="priority", max_num_batched_tokens=64, max_num_seqs=1
    )
    assert isinstance(sched.waiting, FCFSRequestQueue)
    assert sched.policy == SchedulingPolicy.PRIORITY
    sched.add_request(offline.make_request("late-low", helpers.tokens(1, 40), 1.0, priority=1))
    sched.add_request(offline.make_request("later-high", helpers.tokens(9, 40), 2.0, priority=0))
    out, _ = offline.step(sched)
    assert list(out.num_scheduled_tokens) == ["later-high"]


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

    from fairway.vllm import internals

    monkeypatch.setattr(
        internals, "INTERNAL_NAMES", (*internals.INTERNAL_NAMES, "BlockPool.gone_in_0_99")
    )
    with pytest.raises(FairwayError) as info:
        offline.make_offline_scheduler("fcfs")
    message = str(info.value)
    assert vllm.__version__ in message and "BlockPool.gone_in_0_99" in message


def test_self_calibrate_option_wires_the_calibration(offline, helpers):
    sched = offline.make_offline_scheduler("fairway", fairway_options={"self_calibrate": True})
    assert sched.fairway_options.self_calibrate and sched.fairway_calibration is not None
    for i in range(3):
        sched.add_request(offline.make_request(f"c{i}", helpers.tokens(1_000 * i, 200), 1.0))
    offline.run_until_idle(sched)
    assert not sched.requests and sched.fairway_totals.policy_fallbacks == 0
    off = offline.make_offline_scheduler("fcfs")
    assert not off.fairway_options.self_calibrate and off.fairway_calibration is None


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"tier": "foo"}, "tier='foo' (from --additional-config fairway.tier) must be one of "
                          "priced, equal, fixed, blind"),
        ({"tier": "fixed", "tier_weight": 1.5}, "tier_weight=1.5 (from --additional-config "
                                                "fairway.tier_weight) must be a number > 0.0 "
                                                "and <= 1.0"),
    ],
)
def test_tier_options_say_what_they_accept(given, message):
    with pytest.raises(FairwayConfigError) as caught:
        FairwayOptions.resolve(given, {})
    assert message in str(caught.value)


def test_tier_options_from_the_environment():
    options = FairwayOptions.resolve(None, {"FAIRWAY_TIER": "fixed", "FAIRWAY_TIER_WEIGHT": "0.5"})
    assert (options.tier, options.tier_weight) == ("fixed", 0.5)
    assert options.describe()["tier"] == "fixed"  # shown when not the default
    assert "tier" not in FairwayOptions.resolve(None, {}).describe()  # result files unchanged
