"""`fairway trace build|stats|list` and `fairway data path` through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairway.cli import main
from fairway.traces.format import load_trace

SHAPE = "backlog:1.3:10,flood:0.9:10,calm:0.3:10"


def test_build_then_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "flood.jsonl"
    rc = main(["trace", "build", "flood", "--seed", "9", "--shape", SHAPE, "--capacity-tps",
               "3000", "--param", "miss_tokens=4096", "-o", str(out)])
    assert rc == 0
    trace = load_trace(out)
    assert trace.header.preset == "flood" and trace.header.seed == 9
    assert trace.header.params["miss_tokens"] == 4096
    assert trace.header.capacity_tps == 3000.0
    capsys.readouterr()

    assert main(["trace", "stats", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["num_requests"] == len(trace)
    assert {p["phase"] for p in stats["phases"]} == {"warmup", "backlog", "flood", "calm"}

    assert main(["trace", "stats", str(out), "--window-s", "5"]) == 0
    text = capsys.readouterr().out
    assert "ideal prefix-hit ratio" in text and "per 5 s window" in text


def test_same_command_same_bytes(tmp_path: Path) -> None:
    args = ["trace", "build", "flood", "--shape", SHAPE, "-o"]
    assert main([*args, str(tmp_path / "a.jsonl")]) == 0
    assert main([*args, str(tmp_path / "b.jsonl")]) == 0
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_user_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "x.jsonl")
    assert main(["trace", "build", "nosuch", "-o", out]) == 2
    assert "unknown trace family 'nosuch'" in capsys.readouterr().err
    assert main(["trace", "build", "flood", "--param", "bogus=1", "-o", out]) == 2
    assert "unknown parameter(s) bogus" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    assert main(["trace", "stats", str(bad)]) == 2
    assert f"{bad}:1:" in capsys.readouterr().err


def test_list_and_data_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", "list"]) == 0
    text = capsys.readouterr().out
    assert "sec-a" in text and "zipf_s" in text and "spike" in text
    monkeypatch.setenv("FAIRWAY_DATA", str(tmp_path))
    assert main(["data", "path"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path)
