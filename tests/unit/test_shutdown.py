"""`fairway.supervisor.supervise`: a server ignoring its stop signal is killed after the grace.

The "server" is a Python child that ignores SIGTERM and SIGINT (as vLLM's API server in effect
does while it waits for streams its stopped engine will never answer), with a grandchild in its
process group; both must be gone within the grace period after one SIGTERM to the supervisor.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fairway.supervisor import DEFAULT_GRACE_S, shutdown_timeout_of

pytestmark = pytest.mark.timeout(60)

STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(str(child.pid))
print("ready", flush=True)
time.sleep(600)
"""

POLITE = """
import sys, time
print("ready", flush=True)
time.sleep(600)
"""


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _supervised(
    program: str, *args: str, grace_s: float, sigint_ignored: bool = False
) -> subprocess.Popen[str]:
    """`python -m fairway.supervisor` running `program`; `sigint_ignored`: the supervisor starts
    with SIGINT ignored, as a command started with `&` from a non-interactive shell does."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fairway.supervisor", "--grace-s", str(grace_s), "--",
         sys.executable, "-c", program, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=_ignore_sigint if sigint_ignored else None,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    proc = _supervised(STUBBORN, str(pid_file), grace_s=1.0)
    grandchild = int(pid_file.read_text())
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert time.monotonic() - started < 6
    assert proc.returncode == 128 + signal.SIGTERM
    assert "did not exit within 1 s of SIGTERM" in err and "FAIRWAY.md, Shutdown" in err
    deadline = time.monotonic() + 5
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(grandchild), "the server's process group was not killed"


@pytest.mark.parametrize("sigint_ignored", [False, True])
def test_a_server_that_exits_is_not_killed(sigint_ignored: bool) -> None:
    """SIGINT ends a server that does not ignore it, at once; also when the supervisor itself
    was started with SIGINT ignored (the server gets SIGINT's default back before exec)."""
    proc = _supervised(POLITE, grace_s=30.0, sigint_ignored=sigint_ignored)
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 128 + signal.SIGINT  # the child's own death by SIGINT
    assert "did not exit" not in err and time.monotonic() - started < 10


def test_grace_follows_vllms_shutdown_timeout() -> None:
    assert shutdown_timeout_of(["vllm", "serve", "m"]) == 0.0
    assert shutdown_timeout_of(["x", "--shutdown-timeout", "30"]) == 30.0
    assert shutdown_timeout_of(["x", "--shutdown-timeout=7"]) == 7.0
    assert DEFAULT_GRACE_S <= 15  # "stops within seconds"
