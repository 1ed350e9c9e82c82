"""E2's scenarios (names, how each trace is built) and its C2 table (starvation, best of the rest,
the median column), on synthetic statistics: no replay."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import e2_p99_scenarios as e2  # noqa: E402

from fairway.replay.summary import ALL, STARVATION_FACTOR, PhaseStats, Starvation, Summary  # noqa: E402

ARGS = SimpleNamespace(quick=False, trace_cache=None)
TRACE = "t"


def test_names_are_unique_and_show_load_shape_and_steps() -> None:
    names = [s.name for s in e2.SCENARIOS]
    assert len(names) == len(set(names))
    assert "sec-b x2 cache0.3 overload" in names
    assert "musique x2 cache0.3 overload" in names
    long = [n for n in names if n.startswith("mooncake-long ")]
    assert long == [f"mooncake-long x{x} cache0.3 steps8192" for x in ("0.2", "0.4", "0.65")]
    agents = [n for n in names if n.startswith("agent-sessions")]
    assert agents == ["agent-sessions x1 cache0.3 steps8192",
                      "agent-sessions-busy x1 cache0.3 steps8192"]
    musique = [n for n in names if n.startswith("musique ")]
    assert musique == ["musique x1 cache0.3", "musique x1 cache0.3 open-loop",
                       "musique x2 cache0.3 overload"]
    assert len(names) == 20  # the docstring's count


def test_only_an_open_loop_scenario_passes_open_loop_to_the_replay() -> None:
    options = {s.name: s.replay_options() for s in e2.SCENARIOS}
    assert options["musique x1 cache0.3 open-loop"] == {"cache_fraction": 0.3, "open_loop": True}
    assert [n for n, o in options.items() if "open_loop" in o] == ["musique x1 cache0.3 open-loop"]
    assert options["agent-sessions-busy x1 cache0.3 steps8192"] == {
        "cache_fraction": 0.3, "max_num_batched_tokens": 8192}


def test_the_open_loop_flag_is_a_keyword_of_the_replay() -> None:
    import inspect

    from fairway.replay.sim import replay

    assert "open_loop" in inspect.signature(replay).parameters


def test_preset_load_parameters_match_the_name() -> None:
    for scenario in e2.SCENARIOS:
        if "load" in scenario.overrides:
            assert scenario.overrides["load"] == scenario.load, scenario.name


@pytest.mark.parametrize(
    ("scenario", "scaled"),
    [
        (e2.Scenario("sec-a"), False),
        (e2.Scenario("sec-a", load=1.3), True),
        (e2.Scenario("sec-b", load=2.0, overrides={"shape": "overload"}), True),
        (e2.Scenario("mooncake", load=1.3, overrides={"load": 1.3}), False),
        (e2.Scenario("mooncake-long", load=0.65, overrides={"load": 0.65}), False),
    ],
)
def test_build_scales_the_capacity_unless_the_preset_takes_the_load(
    scenario: e2.Scenario, scaled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(e2, "load_trace_spec", lambda spec, **kw: calls.append(kw))
    e2.build(scenario, ARGS)
    (call,) = calls
    expected = e2.default_capacity_tps() * scenario.load if scaled else None
    assert call["capacity_tps"] == expected
    assert {k: call[k] for k in scenario.overrides} == scenario.overrides


def summary(stats: dict[str, tuple[float, float, float]],
            errors: dict[str, int] | None = None) -> Summary:
    """A summary of one trace: per policy (median, p99, max) TTFT in seconds, and errors."""
    rows = [PhaseStats(TRACE, p, ALL, 100, (errors or {}).get(p, 0), m, m, p99,
                              worst)
            for p, (m, p99, worst) in stats.items()]
    starvation = [Starvation(TRACE, p, worst, p99,
                                    worst > STARVATION_FACTOR * p99)
                  for p, (_, p99, worst) in stats.items()]
    return Summary([TRACE], {TRACE: list(stats)}, {TRACE: [ALL]}, rows, starvation)


def stats(**overrides: tuple[float, float, float]) -> dict[str, tuple[float, float, float]]:
    base = {p: (2.0, 10.0, 11.0) for p in e2.POLICIES}
    return {**base, **{p.replace("_", "-"): v for p, v in overrides.items()}}


def test_best_of_the_rest_includes_fairway_step_and_skips_the_starving() -> None:
    row = e2.compare(summary(stats(lpm=(1.0, 5.0, 16.0), hrrn=(2.0, 8.0, 9.0),
                                   fairway_step=(2.0, 7.0, 8.0), fairway=(1.5, 7.7, 9.0))), TRACE)
    assert row["starved_baselines"] == ["lpm"]
    assert row["best_baseline"] == "hrrn" and row["ratio"] == pytest.approx(7.7 / 8.0)
    assert row["best_rest"] == "fairway-step"
    assert row["vs_rest"] == pytest.approx(7.7 / 7.0)
    # The starving LPM's 1.0 s median does not count; the others' is 2.0 s.
    assert row["best_median_s"] == 2.0 and row["median_ratio"] == pytest.approx(0.75)


def test_starved_policies_list_fairway_too() -> None:
    row = e2.compare(summary(stats(fairway=(2.0, 10.0, 40.0), fairway_step=(2.0, 9.0, 30.0))),
                     TRACE)
    assert row["starved_policies"] == ["fairway-step", "fairway"]
    assert row["starved_baselines"] == []
    assert row["fairway_starved"] is True
    assert row["best_rest"] == "fcfs"  # the first of the tied baselines


def test_table_has_the_new_columns_and_summary_lines() -> None:
    row = e2.compare(summary(stats(peek=(1.0, 5.0, 50.0), fairway=(2.1, 9.0, 10.0))), TRACE)
    row.update(requests=100, offered_load=1.0, kv_blocks=10)
    text = e2.table({TRACE: row})
    header, rule, line = text.splitlines()[:3]
    assert header.count("|") == rule.count("|") == line.count("|")
    assert "fairway / best of the rest" in header and "median: fairway / best baseline" in header
    assert "| 0.90 (fcfs) |" in line and "| 1.05 (fcfs) |" in line and line.endswith("| peek | — |")
    assert "Fairway / best of the rest (non-starving baselines and fairway-step): geometric mean " \
           "0.90, max 0.90" in text
    assert "median: max 1.05; at most 1.10 in 1 of 1 scenarios." in text
    assert f"{TRACE}: peek." in text


def test_errors_show_and_leave_fairways_ratios_out() -> None:
    row = e2.compare(summary(stats(fcfs=(1.0, 5.0, 6.0), fairway=(1.0, 4.0, 5.0)),
                             errors={"fcfs": 3, "fairway": 7}), TRACE)
    assert row["errored_policies"] == {"fcfs": 3, "fairway": 7}
    assert row["best_baseline"] == "lpm"  # fcfs has errors: no best
    assert row["ratio"] is row["vs_rest"] is row["median_ratio"] is row["vs_step"] is None
    row.update(requests=100, offered_load=1.0, kv_blocks=10)
    text = e2.table({TRACE: row})
    assert text.splitlines()[2].endswith("| fcfs 3, fairway 7 |")
    assert f"{TRACE}: fcfs 3, fairway 7." in text
    assert "Fairway / best non-starving baseline" not in text
