"""The one step-time model interface: every implementation prices steps the same way.

`TableStepTime` (a T(L) table), `QuadraticFit` (the profiler's curve) and `CalibratedFit` (the
self-calibrated fit) all satisfy `StepTimeModel`; a table file names which one the replay uses.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairway.errors import ProfileError
from fairway.profiling import step_time
from fairway.profiling.calibration import chunk_features
from fairway.profiling.step_time import (
    CalibratedFit,
    QuadraticFit,
    StepTimeModel,
    TableStepTime,
)
from fairway.profiling.table import PrefillProfile, default_profile, from_json, from_points

QUADRATIC = QuadraticFit(0.01, 2e-5, 3e-9)
CALIBRATED = CalibratedFit(overhead_s=0.004, per_token_s=3e-5, per_pair_s=2e-9)
TABLE = TableStepTime(default_profile())
MODELS = {"table": TABLE, "quadratic": QUADRATIC, "calibrated": CALIBRATED}

spans_strategy = st.lists(
    st.tuples(st.integers(0, 20_000), st.integers(0, 4_096)).map(lambda p: (p[0], p[0] + p[1])),
    max_size=8,
)


@pytest.mark.parametrize("name", MODELS)
def test_every_model_satisfies_the_protocol(name: str) -> None:
    model = MODELS[name]
    assert isinstance(model, StepTimeModel)
    assert model.step_time_s([]) == 0.0
    assert model.step_time_s([(0, 512), (4_000, 4_100)]) > 0
    assert isinstance(model.describe(), dict)
    with pytest.raises(ValueError):
        model.step_time_s([(10, 5)])
    with pytest.raises(ValueError):
        model.step_time_s([(-3, 5)])


@pytest.mark.parametrize("name", MODELS)
@given(spans=spans_strategy)
def test_a_step_costs_the_fixed_time_once_plus_each_spans_work(name: str, spans) -> None:
    model = MODELS[name]
    if not spans:
        return
    fixed = model.step_time_s([(0, 0)])
    alone = sum(model.step_time_s([span]) - fixed for span in spans)
    assert model.step_time_s(spans) == pytest.approx(fixed + alone, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("name", MODELS)
def test_later_positions_cost_more(name: str) -> None:
    model = MODELS[name]
    times = [model.step_time_s([(start, start + 256)]) for start in (0, 1_000, 8_000, 30_000)]
    assert times == sorted(times)


def test_quadratic_fit_prices_one_idle_prompt_at_its_curve() -> None:
    for n in (1, 128, 5_000):
        assert QUADRATIC.step_time_s([(0, n)]) == pytest.approx(QUADRATIC(n), rel=1e-12)


def test_calibrated_fit_prices_spans_as_its_features() -> None:
    chunks = [(300, 6_000), (548, 0), (1, 900)]  # (new tokens, computed before)
    spans = [(p, p + n) for n, p in chunks]
    assert CALIBRATED.step_time_s(spans) == pytest.approx(
        CALIBRATED.step_s(*chunk_features(chunks)), rel=1e-12
    )
    assert CALIBRATED.step_time_s([(0, 2_048)]) == pytest.approx(
        CALIBRATED.prefill_s(2_048, chunk_tokens=2_048), rel=1e-12
    )


@pytest.mark.parametrize("fit", [QUADRATIC, CALIBRATED])
def test_a_table_file_saves_and_restores_its_fit(fit) -> None:
    table = from_points([(100, 0.05), (1_000, 0.2)], hardware="h")
    saved = PrefillProfile(table.points, table.metadata, step_time=fit.to_spec())
    data = saved.to_json()
    assert data["step_time"]["kind"] == fit.KIND
    assert step_time.for_profile(from_json(data)) == fit
    assert isinstance(step_time.for_profile(table), TableStepTime)  # no entry: the table


def test_table_kind_is_the_table_and_keeps_its_overhead_option() -> None:
    profile = from_json({"fairway_profile": 1, "points": [[100, 0.05], [1000, 0.2]],
                         "step_time": {"kind": "table"}})
    model = step_time.for_profile(profile, step_overhead_s=0.01)
    assert isinstance(model, TableStepTime) and model.overhead_s == 0.01


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"kind": "cubic"}, "unknown step_time kind 'cubic'; known: table, quadratic"),
        ({"kind": "quadratic", "a_s": 0.1}, "needs exactly the fields a_s, b_s_per_token"),
        ({"kind": "calibrated", "overhead_s": 0.1, "per_token_s": -1.0, "per_pair_s": 0.0},
         "per_token_s must be a finite number >= 0"),
        ({"kind": "table", "a_s": 1.0}, "takes no parameters"),
        (["quadratic"], "must be an object"),
    ],
)
def test_bad_step_time_entries_are_clear_errors(spec, message: str) -> None:
    data = {"fairway_profile": 1, "points": [[100, 0.05]], "step_time": spec}
    with pytest.raises(ProfileError, match=message):
        from_json(data, "f.json")


def test_overhead_option_is_refused_for_a_fit() -> None:
    saved = PrefillProfile(((100, 0.05),), step_time=QUADRATIC.to_spec())
    with pytest.raises(ProfileError, match="applies to a table model"):
        step_time.for_profile(saved, step_overhead_s=0.01)
