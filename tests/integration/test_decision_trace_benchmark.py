"""`benchmarks/decision_trace_cost.py` at a tiny size: every arm runs, the hooks are timed and the
tracing arms write records (a smoke test, not a timing: it once broke on a hook's signature)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "decision_trace_cost.py"


def test_every_arm_is_timed_and_the_tracing_arms_write_records(capsys):
    spec = importlib.util.spec_from_file_location("decision_trace_cost", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    result = bench.main(["--sizes", "20", "--steps", "3", "--rounds", "1", "--running", "2"])
    rows = {row["arm"]: row for row in result["rows"]}
    assert set(rows) == set(bench.ARMS)
    assert all(row["hooks_median_ms"] >= 0 and row["median_step_ms"] > 0 for row in rows.values())
    assert rows["every 1"]["records"] >= 3 and rows["off"]["records"] == 0
    assert "| 20 | every 1 |" in capsys.readouterr().out
