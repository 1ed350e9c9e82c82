"""Profile tables: interpolation, extrapolation, validation errors, patience, shipped table."""

from __future__ import annotations

import json

import pytest

from fairway.errors import ProfileError
from fairway.profiling.table import (
    DEFAULT_PROFILE,
    PrefillProfile,
    default_profile,
    from_points,
    load,
    shipped_names,
)

TABLE = from_points([(100, 0.1), (200, 0.3), (400, 0.5)], hardware="test")


@pytest.mark.parametrize(
    ("tokens", "seconds"),
    [
        (100, 0.1),
        (150, 0.2),  # halfway between the first two points
        (300, 0.4),
        (400, 0.5),
        (50, 0.1),  # below the table: clamped to the first point
        (600, 0.7),  # above: the line through the last two points (0.2 s per 200 tokens)
    ],
)
def test_interpolation_and_extrapolation(tokens: int, seconds: float) -> None:
    assert TABLE.prefill_s(tokens) == pytest.approx(seconds)


def test_single_point_extrapolates_proportionally() -> None:
    assert from_points([(1000, 0.5)]).prefill_s(3000) == pytest.approx(1.5)


def test_patience_has_a_floor() -> None:
    """The policies' one patience function reads the table: max(floor, multiplier x T(L))."""
    from fairway.policies import get

    assert get("fairway", profile=TABLE).patience_s(100) == pytest.approx(1.0)  # 3 x 0.1 < 1 s
    tripled = get("fairway", profile=TABLE, patience_multiplier=3)
    assert tripled.patience_s(400) == pytest.approx(1.5)
    floored = get("fairway", profile=TABLE, patience_multiplier=3, patience_floor_s=2.0)
    assert floored.patience_s(400) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("points", "needle"),
    [
        ([], "at least one"),
        ([(0, 0.1)], "positive integer"),
        ([(100, 0.0)], "positive finite"),
        ([(100, float("nan"))], "positive finite"),
        ([(200, 0.2), (100, 0.3)], "strictly increasing"),
        ([(100, 0.2), (100, 0.3)], "strictly increasing"),
        ([(100, 0.3), (200, 0.2)], "non-decreasing"),
        ([(100.5, 0.3)], "positive integer"),
    ],
)
def test_validation_errors_are_clear(points, needle) -> None:
    with pytest.raises(ProfileError, match=needle):
        PrefillProfile(tuple(points))


def test_save_and_load_round_trip(tmp_path) -> None:
    path = tmp_path / "sub" / "table.json"
    TABLE.save(path)
    loaded = load(path)
    assert loaded.points == TABLE.points
    assert loaded.metadata["hardware"] == "test"


def test_load_errors_name_the_file(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="bad.json.*invalid JSON"):
        load(bad)
    bad.write_text(json.dumps({"points": [[1, 1]]}))
    with pytest.raises(ProfileError, match="not a Fairway profile"):
        load(bad)
    bad.write_text(json.dumps({"fairway_profile": 1, "points": [[100, 1], [50, 2]]}))
    with pytest.raises(ProfileError, match="bad.json: point 1"):
        load(bad)
    with pytest.raises(ProfileError, match="cannot read profile table"):
        load(tmp_path / "missing.json")


def test_shipped_default_is_a_labelled_estimate() -> None:
    assert DEFAULT_PROFILE in shipped_names()
    profile = default_profile()
    assert profile.metadata["source"] == "estimate"
    assert "NOT a measurement" in profile.metadata["note"]
    assert "formula" in profile.metadata and "constants" in profile.metadata
    # Llama-3.1-8B on an A6000: a 2k prompt in a few tenths of a second, 8k in about 2 s.
    assert 0.2 < profile.prefill_s(2048) < 0.8
    assert 1.0 < profile.prefill_s(8192) < 4.0
    assert profile.capacity_tps() == pytest.approx(2048 / profile.prefill_s(2048))
