"""benchmarks/e5_tradeoff.py and e3_flood.py: the points, the dominance check, miss sizes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import e3_flood  # noqa: E402
import e5_tradeoff as e5  # noqa: E402


def row(x: float | None, y: float | None) -> dict:
    return {"x_flood_hit_median_s": x, "y_worst_miss_s": y}


def test_points_cover_the_issue_grid() -> None:
    labels = [p.label for p in e5.points(["fairway", "fairway-step", "klpm", "hrrn"])]
    assert labels == [
        "fairway[fast_weight=1]", "fairway[fast_weight=2]", "fairway[fast_weight=4]",
        "fairway[fast_weight=8]", "fairway[fast_weight=16]", "fairway-step",
        "klpm[k=2]", "klpm[k=4]", "klpm[k=8]", "klpm[k=16]", "hrrn", "lpm", "fcfs",
    ]
    sides = {p.label: p.side for p in e5.points(["fairway-step"])}
    assert sides["fairway-step"] == sides["fairway[fast_weight=4]"] == e5.FAIRWAY
    assert sides["klpm[k=16]"] == sides["fcfs"] == e5.BASELINE
    # Before fairway-step is registered the figure simply has no such point.
    assert "fairway-step" not in [p.label for p in e5.points(["fairway"])]


def test_dominance_needs_both_coordinates_no_worse_and_one_better() -> None:
    rows = {
        "f1": row(10.0, 50.0), "f2": row(4.0, 120.0), "f3": row(None, 30.0),
        "fcfs": row(30.0, 30.0),    # better y than f1, worse x: no
        "lpm": row(4.0, 120.0),     # equal to f2 on both: no (needs one strict)
        "klpm": row(10.0, 40.0),    # equal x, better y than f1: dominates f1
        "hrrn": row(3.0, 119.0),    # better on both than f2
    }
    sides = {"f1": e5.FAIRWAY, "f2": e5.FAIRWAY, "f3": e5.FAIRWAY, "fcfs": e5.BASELINE,
             "lpm": e5.BASELINE, "klpm": e5.BASELINE, "hrrn": e5.BASELINE}
    assert e5.dominated(rows, sides) == {"f1": ["klpm"], "f2": ["hrrn"], "f3": []}


def test_dominance_treats_float_rounding_as_equal() -> None:
    # Same x up to the virtual clock's float rounding, shorter worst miss: dominated.
    rows = {"f": row(29.53372100000061, 60.5), "klpm": row(29.533721000000696, 42.7),
            "lpm": row(3.7, 60.5 + 0.0005), "far": row(3.7, 60.51)}
    sides = {"f": e5.FAIRWAY, "klpm": e5.BASELINE, "lpm": e5.BASELINE, "far": e5.BASELINE}
    assert e5.TOLERANCE_S == 0.001
    assert e5.dominated(rows, sides) == {"f": ["klpm", "lpm"]}


def test_table_says_none_for_an_undominated_fairway_point() -> None:
    rows = {"f": {**row(1.0, 2.0), "worst_miss_vs_fcfs": 1.0},
            "fcfs": {**row(3.0, 2.0), "worst_miss_vs_fcfs": 1.0}}
    beaten = e5.dominated(rows, {"f": e5.FAIRWAY, "fcfs": e5.BASELINE})
    table = e5.table(rows, beaten)
    assert "| f | 1.00 | 2.00 | 1.00 | none |" in table
    assert "| fcfs | 3.00 | 2.00 | 1.00 |  |" in table


def test_miss_sizes_argument() -> None:
    assert e3_flood.parse_sizes("4096,8192") == (4096, 8192)
    assert e3_flood.MISS_SIZES == (4096, 8192, 16384, 32000)
    for bad in ("", "8k", "0", "4096,4096"):
        with pytest.raises(argparse.ArgumentTypeError):
            e3_flood.parse_sizes(bad)
    args = e3_flood.parser().parse_args(["--miss-tokens", "16384", "--floor"])
    assert (args.miss_tokens, args.floor, args.policy) == ((16384,), True, None)
    args = e3_flood.parser().parse_args(["--policy", "fcfs", "--policy", "lpm"])
    assert args.policy == ["fcfs", "lpm"] and args.miss_tokens == e3_flood.MISS_SIZES
