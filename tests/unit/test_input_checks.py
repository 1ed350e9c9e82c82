"""Bad input that used to get through: each case gets a one-line reason and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairway.cli import main
from fairway.errors import FairwayConfigError, ProfileError
from fairway.profiling.table import MAX_PREFILL_S, check_plausible, from_json, from_points
from fairway.replay.bench import check_num_blocks, failed_replays
from fairway.replay.results import ReplayResult, RequestResult
from fairway.traces.format import Trace, TraceHeader, make_request

SHAPE = "backlog:1.3:5,flood:0.9:5,calm:0.3:5"


def _build(out: Path, *extra: str) -> int:
    return main(["trace", "build", "flood", "--shape", SHAPE, "-o", str(out), *extra])


def test_trace_stats_window_must_be_positive(tmp_path: Path, capsys) -> None:
    out = tmp_path / "t.jsonl"
    assert _build(out) == 0
    for bad in ("0", "-1", "nan", "x"):
        with pytest.raises(SystemExit) as exit_info:
            main(["trace", "stats", str(out), "--window-s", bad])
        assert exit_info.value.code == 2
        assert f"--window-s: must be a number > 0, got '{bad}'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ("calm:-1:10", "phase calm: load must be finite and >= 0, got -1.0"),
        ("calm:0.5:0", "phase calm: duration_s must be finite and > 0, got 0.0"),
        ("calm:x:10", "LOAD and DURATION_S must be numbers"),
    ],
)
def test_inline_shape_errors_say_what_is_wrong(tmp_path: Path, capsys, shape: str,
                                               message: str) -> None:
    rc = main(["trace", "build", "flood", "--shape", shape, "-o", str(tmp_path / "t.jsonl")])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fairway: error: shape '{shape}'") and message in err


def test_trace_build_refuses_to_overwrite_without_force(tmp_path: Path, capsys) -> None:
    out = tmp_path / "t.jsonl"
    assert _build(out) == 0
    out.write_text("keep me")
    assert _build(out, "--seed", "3") == 2
    assert f"--output {out} exists; pass --force to overwrite it" in capsys.readouterr().err
    assert out.read_text() == "keep me"
    assert _build(out, "--seed", "3", "--force") == 0
    assert out.read_text() != "keep me"


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ([(512, 0.05), (2048, 1e9)], "T(2048) = 1e+09 s is implausible (more than 3600 s"),
        ([(2048, 2e-6)], "T(2048) = 2e-06 s is implausible (1.02e+09 tokens/s"),
    ],
)
def test_profile_tables_need_plausible_times(points, message: str) -> None:
    with pytest.raises(ProfileError) as info:
        from_points(points)
    assert message in str(info.value)
    data = {"fairway_profile": 1, "metadata": {}, "points": [list(p) for p in points]}
    with pytest.raises(ProfileError) as info:
        from_json(data, "t.json")
    assert str(info.value).startswith("t.json: point ") and message in str(info.value)


def test_plausible_bounds_accept_real_tables() -> None:
    check_plausible([(1, 0.0139), (4095, 0.7), (131072, MAX_PREFILL_S)])  # no error


def test_profile_cli_reports_the_implausible_point(tmp_path: Path, capsys) -> None:
    table = tmp_path / "p.json"
    table.write_text(json.dumps({"fairway_profile": 1, "points": [[512, 0.1], [1024, 1e9]]}))
    out = tmp_path / "t.jsonl"
    assert _build(out) == 0
    rc = main(["bench", "--trace", str(out), "--policy", "fcfs", "--profile", str(table),
               "--workers", "0", "--no-progress", "--out", str(tmp_path / "b")])
    assert rc == 2
    assert "point 1: T(1024) = 1e+09 s is implausible" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def _trace(prompt_tokens: int) -> Trace:
    req = make_request("r0", 0.0, [("a", prompt_tokens)], max_tokens=1)
    return Trace(TraceHeader(family="test", seed=0, shape=None, params={}, num_requests=1),
                 (req,))


def test_num_blocks_must_hold_the_largest_request() -> None:
    check_num_blocks(3, [("small", _trace(31))])  # 32 tokens = 2 blocks = the 2 usable ones
    with pytest.raises(FairwayConfigError) as info:
        check_num_blocks(3, [("small", _trace(31)), ("big", _trace(1872))])
    text = str(info.value)
    assert "--num-blocks 3 leaves 2 usable KV blocks of 16 tokens" in text
    assert "trace 'big' has a request of 1873 prompt + output tokens (118 blocks)" in text
    assert "pass --num-blocks 119 or more, or drop --num-blocks" in text
    assert "gpu-memory" not in text and "max-model-len" not in text  # bench's own flags only


def test_bench_with_too_few_blocks_fails_before_running(tmp_path: Path, capsys) -> None:
    out = tmp_path / "t.jsonl"
    assert _build(out) == 0
    capsys.readouterr()
    rc = main(["bench", "--num-blocks", "3", "--trace", str(out), "--policy", "fcfs",
               "--workers", "0", "--no-progress", "--out", str(tmp_path / "b")])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("fairway: error: --num-blocks 3 leaves 2 usable KV blocks")
    assert not (tmp_path / "b").exists()


def test_a_replay_where_nothing_got_a_token_is_a_failed_replay() -> None:
    def result(errors: list[str | None]) -> ReplayResult:
        reqs = [RequestResult(f"r{i}", 0.0, None, 8, None, None if e else 0.1, None, e)
                for i, e in enumerate(errors)]
        return ReplayResult("fcfs", "t", {}, reqs, 1.0, 1.0)

    ok, partial, dead = result([None]), result([None, "x"]), result(["x", "y"])
    assert failed_replays([ok, partial, dead, result([])]) == [dead]
