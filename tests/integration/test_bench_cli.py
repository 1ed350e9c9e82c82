"""`fairway bench` end to end on a tiny trace: report files, and the same results on any workers."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

from fairway import cli
from fairway.traces.format import Trace, TraceHeader, TraceRequest, write_trace

pytestmark = pytest.mark.integration

POLICIES = ["fcfs", "lpm", "fairway"]


def tiny_trace(seed: int = 7) -> Trace:
    """~40 requests over 30 s: six shared documents, calm, burst and spike phases."""
    rng = random.Random(seed)
    requests, t = [], 0.0
    phases = [("calm", 10.0, 1.0), ("burst", 20.0, 2.0), ("spike", 30.0, 4.0)]
    i = 0
    for name, end, rate in phases:
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                t = end
                break
            doc = rng.randrange(6)
            blocks = (
                ("sys", 256),
                (f"doc{doc}", 1_024 + 512 * doc),
                (f"q{i}", rng.randrange(16, 300)),
            )
            requests.append(TraceRequest(f"r{i:03d}", round(t, 6), blocks, phase=name))
            i += 1
    header = TraceHeader(
        family="test", seed=seed, shape=None, params={}, num_requests=len(requests)
    )
    return Trace(header, tuple(requests))


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory) -> Path:
    return write_trace(tiny_trace(), tmp_path_factory.mktemp("traces") / "tiny.jsonl")


def bench(trace_file: Path, out: Path, *extra: str) -> int:
    argv = ["bench", "--quick", "--trace", str(trace_file), "--out", str(out), "--no-progress"]
    for policy in POLICIES:
        argv += ["--policy", policy]
    return cli.main([*argv, *extra])


def replays(out: Path) -> dict[str, dict]:
    """Per file: the requests and settings (wall times differ from run to run)."""
    found = {}
    for path in sorted((out / "replays").glob("*.json")):
        data = json.loads(path.read_text())
        found[path.name] = {"requests": data["requests"], "settings": data["settings"]}
    return found


@pytest.fixture(scope="module")
def one_worker(trace_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "w1"
    assert bench(trace_file, out, "--workers", "1") == 0
    return out


def test_bench_writes_the_report(one_worker, capsys):
    out = one_worker
    for name in (
        "report.md",
        "report.json",
        "bench.json",
        "ttft_over_time-tiny.png",
        "cdf-tiny.png",
    ):
        assert (out / name).is_file(), name
    assert sorted(replays(out)) == [f"tiny--{p}.json" for p in sorted(POLICIES)]
    markdown = (out / "report.md").read_text()
    assert "## Targets met" in markdown and "| fairway |" in markdown
    meta = json.loads((out / "bench.json").read_text())
    assert meta["environment"]["vllm"].startswith("vllm")
    assert {r["policy"] for r in meta["replays"]} == set(POLICIES)
    assert all(r["errors"] == 0 and r["simulated_s_per_wall_s"] > 0 for r in meta["replays"])


def test_two_workers_give_the_same_results_as_one(trace_file, one_worker, tmp_path):
    out = tmp_path / "w2"
    assert bench(trace_file, out, "--workers", "2") == 0
    assert replays(out) == replays(one_worker)
    assert (out / "report.json").read_text() == (one_worker / "report.json").read_text()


def test_an_existing_output_directory_is_never_overwritten(trace_file, one_worker, tmp_path):
    before = (one_worker / "report.md").read_text()
    out = tmp_path / "again"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert bench(trace_file, out, "--workers", "0", "--policy-arg", "fairway.fast_weight=2") == 0
    assert (out / "keep.txt").read_text() == "mine"
    sibling = tmp_path / "again-2"
    assert (sibling / "report.md").is_file()
    fairway = json.loads((sibling / "replays" / "tiny--fairway.json").read_text())
    assert fairway["settings"]["policy_params"]["fast_weight"] == 2
    assert (one_worker / "report.md").read_text() == before


def test_server_variables_do_not_change_a_replay(trace_file, one_worker, tmp_path, monkeypatch,
                                                 caplog):
    """`FAIRWAY_POLICY=lpm fairway bench --policy fcfs` replays FCFS (it once replayed LPM)."""
    monkeypatch.setenv("FAIRWAY_POLICY", "lpm")
    monkeypatch.setenv("FAIRWAY_FAST_WEIGHT", "0")
    out = tmp_path / "env"
    argv = ["bench", "--quick", "--trace", str(trace_file), "--out", str(out), "--no-progress",
            "--workers", "0", "--policy", "fcfs"]
    assert cli.main(argv) == 0
    assert "ignores FAIRWAY_FAST_WEIGHT, FAIRWAY_POLICY" in caplog.text
    (found,) = replays(out).values()
    assert found["settings"]["policy"] == "fcfs"
    assert found["settings"]["fairway_options"]["policy"] == "fcfs"
    assert found == replays(one_worker)["tiny--fcfs.json"]


def test_one_policy_arg_for_every_policy_that_has_it(trace_file, tmp_path):
    out = tmp_path / "args"
    assert bench(trace_file, out, "--workers", "0", "--policy-arg", "fast_weight=2") == 0
    found = replays(out)
    assert found["tiny--fairway.json"]["settings"]["policy_params"]["fast_weight"] == 2
    assert "fast_weight" not in found["tiny--lpm.json"]["settings"]["policy_params"]


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_ray_local_gives_the_same_results(trace_file, one_worker, tmp_path):
    out = tmp_path / "ray"
    assert bench(trace_file, out, "--ray", "local") == 0
    assert replays(out) == replays(one_worker)


def test_ray_missing_is_a_clear_error(trace_file, tmp_path, monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    assert bench(trace_file, tmp_path / "x", "--ray", "local") == 2
    assert "pip install 'vllm-fairway[ray]'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trace", "no-such-trace"], "neither a trace file nor a preset"),
        (["--policy", "nope"], "unknown policy 'nope'"),
        (["--policy", "fcfs", "--policy-arg", "fairway.fast_weight=2"], "not in this run"),
        (["--policy", "fairway", "--policy-arg", "fairway.speed=2"], "no parameter 'speed'"),
        (["--policy", "fcfs", "--policy", "lpm", "--policy-arg", "fast_weight=2"],
         "no policy of this run has a parameter 'fast_weight'"),
        (["--policy", "fairway", "--policy-arg", "fast_weight=0"],
         "fast_weight=0 (from --policy-arg fast_weight)"),
    ],
)
def test_bad_arguments_are_user_errors(tmp_path, capsys, args, message):
    assert cli.main(["bench", "--out", str(tmp_path / "o"), "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fairway: error:") and message in err


def test_default_traces_need_no_data(tmp_path, monkeypatch, capsys):
    # The default SEC presets ship with the package: an empty data directory is enough.
    monkeypatch.setenv("FAIRWAY_DATA", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    code = cli.main(["bench", "--quick", "--policy", "fcfs", "--workers", "0", "--out",
                     str(tmp_path / "o"), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    assert sorted(replays(tmp_path / "o")) == ["sec-a-quick--fcfs.json", "sec-b-quick--fcfs.json"]
    assert "| fcfs |" in (tmp_path / "o" / "report.md").read_text()
