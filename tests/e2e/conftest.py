"""End-to-end fixtures: a tiny random-weight model and a live `fairway serve` on CPU.

The server is started once per module through the real console script (`fairway serve`), on a
free 127.0.0.1 port, with settings that fit a small CPU box: a small share of host memory for the
KV cache, a 512-token step budget (so 1k-token prompts are chunked over several steps and the
waiting queue really is re-ordered), and eager mode (no compilation: a faster start).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

#: Seconds to wait for /health (vLLM's CPU start-up takes ~40-60 s here; slower on a busy box).
STARTUP_TIMEOUT_S = float(os.environ.get("FAIRWAY_E2E_STARTUP_TIMEOUT_S", "240"))
#: Seconds to wait for a clean exit after SIGINT.
SHUTDOWN_TIMEOUT_S = 60.0
#: Lines of the server log quoted in a failure message.
LOG_TAIL_LINES = 60

#: vLLM arguments for a CPU run of the tiny model (everything Fairway-specific is added by
#: `fairway serve` itself).
CPU_SERVER_ARGS = (
    *("--gpu-memory-utilization", "0.2"),  # on CPU: the share of host memory vLLM may use
    *("--max-model-len", "2048"),
    *("--max-num-batched-tokens", "512"),  # forces chunked prefill of the 1k-token prompts
    *("--max-num-seqs", "16"),
    "--enforce-eager",
    *("--dtype", "bfloat16"),
)


def fairway_command() -> list[str]:
    """The `fairway` console script of this environment (or `python -m fairway.cli`)."""
    script = Path(sys.executable).parent / "fairway"
    return [str(script)] if script.exists() else [sys.executable, "-m", "fairway.cli"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_env() -> dict[str, str]:
    """Environment of the server: offline, no stray Fairway overrides from the caller's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRWAY_")}
    env["HF_HUB_OFFLINE"] = "1"
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # `fairway serve` makes a fresh one
    return env


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log file, for assertion messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def process_tree(root: int) -> dict[int, str]:
    """pid -> state letter of `root` and all its live descendants (from /proc)."""
    parents: dict[int, int] = {}
    states: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, ...
        states[int(entry.name)] = fields[0]
        parents[int(entry.name)] = int(fields[1])
    tree = {root} if root in states else set()
    grew = True
    while grew:
        new = {pid for pid, ppid in parents.items() if ppid in tree and pid not in tree}
        tree |= new
        grew = bool(new)
    return {pid: states[pid] for pid in tree}


def alive(pids: set[int]) -> list[int]:
    """The pids of `pids` that still exist and are not zombies."""
    out = []
    for pid in sorted(pids):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


@dataclass
class Server:
    """A running `fairway serve` process."""

    proc: subprocess.Popen[bytes]
    url: str
    model: str
    log_path: Path

    def log_tail(self) -> str:
        return log_tail(self.log_path)


@pytest.fixture(scope="session")
def e2e() -> SimpleNamespace:
    """Helpers for the test modules (a conftest is not importable as a module)."""
    return SimpleNamespace(
        alive=alive,
        cpu_server_args=CPU_SERVER_ARGS,
        fairway_command=fairway_command,
        log_tail=log_tail,
        free_port=free_port,
        process_tree=process_tree,
        server_env=server_env,
        shutdown_timeout_s=SHUTDOWN_TIMEOUT_S,
    )


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Llama with a byte-level tokenizer (built once per session)."""
    from fairway.vllm.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"), max_len=4096, seed=0)


def _wait_healthy(server: Server, timeout_s: float) -> None:
    """Poll /health until 200; fail with the log tail if the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            code = server.proc.poll()
            if code is not None:
                pytest.fail(
                    f"fairway serve exited with code {code} before /health answered; log tail:\n"
                    f"{server.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{server.url}/health").status_code == 200:
                    return
            time.sleep(1.0)
    pytest.fail(
        f"fairway serve did not answer /health within {timeout_s:.0f} s; log tail:\n"
        f"{server.log_tail()}"
    )


def _stop(server: Server) -> None:
    """Teardown safety net: SIGINT, then SIGKILL of the whole tree if it hangs."""
    if server.proc.poll() is not None:
        return
    tree = set(process_tree(server.proc.pid))
    server.proc.send_signal(signal.SIGINT)
    try:
        server.proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        for pid in alive(tree | set(process_tree(server.proc.pid))):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        server.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`fairway serve TINY_MODEL` (policy fairway) on a free port; stopped after the module."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    argv = [
        *fairway_command(),
        "serve",
        str(tiny_model),
        "--policy",
        "fairway",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *CPU_SERVER_ARGS,
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=server_env())
    srv = Server(proc, f"http://127.0.0.1:{port}", str(tiny_model), log_path)
    try:
        _wait_healthy(srv, STARTUP_TIMEOUT_S)
        yield srv
    finally:
        _stop(srv)
