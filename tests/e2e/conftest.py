"""End-to-end fixtures: a tiny random-weight model and a live `fairway serve` on CPU.

The server is started once per module through the real console script (`fairway serve`), on a
free 127.0.0.1 port, by `fairway.supervisor` (the profiler's and the fidelity benchmark's too),
with settings that fit a small CPU box: a small share of host memory for the KV cache, a 512-token
step budget (so 1k-token prompts are chunked over several steps and the waiting queue really is
re-ordered), and eager mode (no compilation: a faster start).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from fairway import supervisor

#: Seconds to wait for /health (vLLM's CPU start-up takes ~40-60 s here; slower on a busy box).
STARTUP_TIMEOUT_S = float(os.environ.get("TEST_FAIRWAY_E2E_STARTUP_TIMEOUT_S", "240"))
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


def server_env() -> dict[str, str]:
    """Environment of the server: offline, no stray Fairway overrides from the caller's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRWAY_")}
    env["HF_HUB_OFFLINE"] = "1"
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # `fairway serve` makes a fresh one
    return env


@dataclass
class Server(supervisor.ServerProcess):
    """A running `fairway serve` process and the model it serves."""

    model: str = ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return super().log_tail(lines)


@pytest.fixture(scope="session")
def e2e() -> SimpleNamespace:
    """Helpers for the test modules (a conftest is not importable as a module)."""
    return SimpleNamespace(
        alive=supervisor.alive,
        cpu_server_args=CPU_SERVER_ARGS,
        fairway_command=fairway_command,
        log_tail=supervisor.log_tail,
        free_port=supervisor.free_port,
        process_tree=supervisor.process_tree,
        server_env=server_env,
        shutdown_timeout_s=supervisor.SHUTDOWN_TIMEOUT_S,
    )


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Llama with a byte-level tokenizer (built once per session)."""
    from fairway.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"), max_len=4096, seed=0)


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`fairway serve TINY_MODEL` (policy fairway) on a free port; stopped after the module."""
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    command = [*fairway_command(), "serve", str(tiny_model)]
    try:
        running = supervisor.running_server(
            command, ["--policy", "fairway", *CPU_SERVER_ARGS], log_path=log_path,
            env=server_env(), startup_timeout_s=STARTUP_TIMEOUT_S, name="fairway serve",
        )
        with running as process:
            yield Server(process.proc, process.url, process.log_path, process.argv,
                         model=str(tiny_model))
    except supervisor.ServerStartError as exc:
        pytest.fail(str(exc))
