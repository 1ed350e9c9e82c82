"""`fairway profile --model DIR` end to end on CPU: starts vLLM, measures, writes, stops vLLM."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from fairway.profiling.table import load

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

#: A small CPU server: little memory, short model length, eager mode (a faster start).
SERVER_ARGS = (
    "--gpu-memory-utilization", "0.2",
    "--max-model-len", "1024",
    "--max-num-seqs", "4",
    "--enforce-eager",
    "--dtype", "bfloat16",
)


def _alive_with_port(port: str) -> list[int]:
    """Pids whose command line holds `--port PORT` (the server we started, if it lingers)."""
    needle = f"--port\0{port}\0".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline + b"\0":
            pids.append(int(entry.name))
    return pids


def test_profile_starts_measures_and_stops_a_server(tiny_model, e2e, tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    argv = [
        *e2e.fairway_command(), "profile", "--model", str(tiny_model),
        "--lengths", "64,128,256", "--repeats", "2", "-o", str(out),
        "--startup-timeout", "400", "--", *SERVER_ARGS,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, env=e2e.server_env(),
                          timeout=560)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"

    table = load(out)  # validates: positive, strictly increasing lengths, monotone times
    assert [n for n, _ in table.points] == [64, 128, 256]
    meta = table.metadata
    assert meta["source"] == "measured" and meta["repetitions"] == 2
    assert meta["hardware_detected"] is True and meta["hardware"] != "unknown"
    assert str(meta["vllm_version"]).startswith("0.3")
    assert meta["max_model_len"] == 1024 and meta["overhead_s"] > 0
    assert meta["server"]["vllm_args"] == list(SERVER_ARGS)
    assert meta["generated_by"].startswith("fairway profile --model ")
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "fit: T(L) =" in done.stdout

    port = re.search(r"server ready at http://127\.0\.0\.1:(\d+)", done.stderr)
    assert port, done.stderr[-2000:]
    assert _alive_with_port(port.group(1)) == []  # the server was shut down
