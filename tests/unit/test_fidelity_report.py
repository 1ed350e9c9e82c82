"""The fidelity benchmark's report: live spread over runs, pairwise ranking with ties, and the
step-model check that fits a per-request term to live step logs (fairway.replay.fidelity), and
the driver's CPU lists and defaults (benchmarks/fidelity.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import fidelity as fidelity_script  # noqa: E402

from fairway.profiling.step_time import TableStepTime  # noqa: E402
from fairway.profiling.table import from_points  # noqa: E402
from fairway.replay import fidelity, fidelity_markdown  # noqa: E402
from fairway.replay.results import ReplayResult, RequestResult  # noqa: E402


def result(policy: str, ttfts: list[float], phase: str = "calm") -> ReplayResult:
    requests = [
        RequestResult(f"r{i}", float(i), phase, 100, None, float(i) + t, 0)
        for i, t in enumerate(ttfts)
    ]
    return ReplayResult(policy, "t", {}, requests, 1.0, None)


def test_spread_is_the_median_and_range_of_the_runs() -> None:
    s = fidelity.Spread.of([3.0, None, 1.0, 2.0])
    assert (s.median, s.lo, s.hi) == (2.0, 1.0, 3.0)
    assert fidelity.Spread.of([None]).median is None


def test_comparison_reports_the_median_of_runs_and_the_ratio() -> None:
    virtual = [result("fcfs", [1.0] * 9)]
    runs = {("fairway", "fcfs"): [result("fcfs", [v] * 9) for v in (2.0, 1.0, 4.0)]}
    rows = fidelity.comparison_rows(runs, virtual)
    table = fidelity_markdown.comparison_table(rows)
    row = next(r for r in rows if r["phase"] == "all")
    assert row["live_median_s"] == 2.0
    assert (row["live_median_min_s"], row["live_median_max_s"]) == (1.0, 4.0)
    assert row["runs"] == 3 and row["live_errors"] == 0
    assert "| 0.50 |" in table  # virtual / live = 1 / 2


def rows_for(virtual: dict[str, float], live: dict[str, float]) -> list[fidelity.ComparisonRow]:
    return [
        {"client": "fairway", "phase": "all", "policy": p, "virtual_median_s": virtual[p],
         "live_median_s": live[p], "virtual_p99_s": virtual[p], "live_p99_s": live[p]}
        for p in virtual
    ]


def test_ranking_counts_separated_pairs_and_ignores_ties() -> None:
    # a and b tie in the replay (2% apart): their live order is not judged.
    rows = rows_for({"a": 1.00, "b": 1.02, "c": 2.0}, {"a": 1.5, "b": 1.4, "c": 3.0})
    assert "| 2 of 2 |" in fidelity_markdown.ranking_table(fidelity.rankings(rows))
    rows = rows_for({"a": 1.0, "b": 2.0}, {"a": 3.0, "b": 2.0})  # swapped live
    assert "| 0 of 1 |" in fidelity_markdown.ranking_table(fidelity.rankings(rows))


def test_step_model_check_recovers_a_per_request_cost(tmp_path: Path) -> None:
    profile = from_points([(128, 0.03), (512, 0.08), (2048, 0.3)], constants={"overhead_s": 0.01})
    model = TableStepTime(profile)
    per_request = 0.004
    lines = []
    for k in (1, 2, 3, 5, 8, 1, 4, 6):
        chunks = [[64 + 16 * j, 32 * j] for j in range(k)]
        seconds = model.step_time_s([(b, b + n) for n, b in chunks]) + per_request * k
        lines.append(json.dumps({"t": 0.0, "s": seconds, "chunks": chunks}))
    lines.append(json.dumps({"t": 0.0, "s": 0.5, "chunks": [[1, 900]]}))  # a decode: skipped
    path = tmp_path / "steps.jsonl"
    path.write_text("\n".join(lines) + "\n")
    check = fidelity.step_model_check(path, profile)
    assert check is not None and check["steps"] == 8
    assert check["residual_fit_s"]["per_request"] == pytest.approx(per_request, abs=1e-6)
    assert check["residual_fit_s"]["per_step"] == pytest.approx(0.0, abs=1e-6)
    assert check["measured_over_model"] > 1.0
    assert fidelity.step_model_check(tmp_path / "missing.jsonl", profile) is None


def test_cpu_lists_parse_like_taskset() -> None:
    assert fidelity_script.cpu_set("0,2-3") == {0, 2, 3}
    assert fidelity_script.taskset("1", ["x"]) == ["taskset", "-c", "1", "x"]
    assert fidelity_script.taskset(None, ["x"]) == ["x"]


def test_reprofile_lengths_stay_within_the_model_length() -> None:
    args = fidelity_script.parse_args(["--reprofile", "--serve", "m", "--max-model-len", "4096"])
    assert args.profile_lengths == "128,256,512,1024,2048,4096"
    args = fidelity_script.parse_args(["--reprofile", "--serve", "m", "--max-model-len", "3000"])
    assert args.profile_lengths == "128,256,512,1024,2048,3000"
    args = fidelity_script.parse_args(["--reprofile", "--serve", "m"])
    assert args.profile_lengths.endswith(",8000")
    assert fidelity_script.parse_args(["--profile", "p", "--url", "http://x"]).runs == 1
    assert fidelity_script.parse_args(["--profile", "p", "--serve", "m"]).runs == 3


def test_agreement_counts_only_phases_with_enough_requests() -> None:
    def row(
        phase: str, n: int, virtual: float, live: float, **extra: object
    ) -> fidelity.ComparisonRow:
        return {"client": "fairway", "policy": "fcfs", "phase": phase, "n": n,
                "virtual_median_s": virtual, "live_median_s": live,
                "live_median_min_s": live * 0.5, "live_median_max_s": live * 1.5,
                "virtual_p99_s": virtual, "live_p99_s": live,
                "live_p99_min_s": live, "live_p99_max_s": live, **extra}

    idle = [row("all", 40, 2.0, 1.0), row("calm", 10, 1.0, 1.0)]
    fitted = [row("all", 40, 1.1, 1.0, virtual_model="fitted"), row("calm", 10, 1.0, 1.0)]
    text = fidelity_markdown.agreement_table(fidelity.agreement(idle, fitted))
    assert "| calm |" not in text  # 10 requests: below MIN_PHASE_REQUESTS
    # idle 2.0 vs 1.0: outside 15% and (p99) outside the range; fitted 1.1: within both times,
    # inside the median's range [0.5, 1.5] but not the p99's degenerate [1.0, 1.0].
    assert "idle table 0 of 2, fitted 2 of 2" in text
    assert "inside the live range: idle table 0, fitted 1 of 2" in text


def test_step_shapes_group_single_request_steps(tmp_path: Path) -> None:
    profile = from_points([(128, 0.03), (512, 0.08), (2048, 0.3)], constants={"overhead_s": 0.01})
    lines = [json.dumps({"t": 0.0, "s": 0.05, "chunks": [[100 + i, 4096 + i]]}) for i in range(5)]
    lines.append(json.dumps({"t": 0.0, "s": 9.0, "chunks": [[100, 0], [100, 0]]}))  # two requests
    lines.append(json.dumps({"t": 0.0, "s": 9.0, "chunks": [[300, 0]]}))  # one step: too few
    path = tmp_path / "steps.jsonl"
    path.write_text("\n".join(lines) + "\n")
    shapes = fidelity.step_shapes([path, tmp_path / "missing.jsonl"], profile)
    table = fidelity_markdown.step_shapes_table(shapes)
    rows = [line for line in table.splitlines() if line.startswith("| 100 ")]
    assert rows == [f"| 100 | 4096 | 5 | 50 | {rows[0].split('|')[5].strip()} |"]
    assert "| 300 |" not in table
