"""Run a server (`vllm serve`, `fairway serve`) on 127.0.0.1 for as long as a measurement needs it.

The one supervisor of the profiler (`fairway profile --model`), the fidelity benchmark and the
end-to-end test fixtures: start the command on 127.0.0.1 and a free port with its output in a log
file, wait until `GET /health` answers 200 (or fail with the log's tail when it exits or the time
is up), and always stop it: SIGINT (vLLM's clean shutdown), then SIGTERM, then SIGKILL to its
whole process tree. It launches processes and must not import vllm.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fairway import client
from fairway.errors import FairwayError

logger = logging.getLogger(__name__)

#: vLLM's start on a busy CPU box takes ~1.5 min; a large model on a GPU can take many minutes.
DEFAULT_STARTUP_TIMEOUT_S = 900.0
#: Seconds to wait for a clean exit after SIGINT (vLLM drains and stops its engine processes).
SHUTDOWN_TIMEOUT_S = 60.0
#: Seconds to wait after SIGTERM, and after SIGKILL.
_TERM_TIMEOUT_S = 10.0
#: Lines of the server log quoted in an error.
LOG_TAIL_LINES = 30
_POLL_S = 1.0


class ServerStartError(FairwayError):
    """The server exited or did not answer /health in time; the message quotes its log."""


@dataclass
class ServerProcess:
    """A server started by `start`.

    Attributes:
        proc: the process (leader of its own session, so its group is the server's tree).
        url: `http://127.0.0.1:PORT`.
        log_path: its stdout and stderr.
        argv: the command line it was started with.
    """

    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    argv: list[str]

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of the server's log (for error messages)."""
        return log_tail(self.log_path, lines)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file, or why there are none."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def start(
    command: Sequence[str],
    args: Sequence[str] = (),
    *,
    log_path: str | Path,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
) -> ServerProcess:
    """Start `COMMAND --host 127.0.0.1 --port PORT ARGS` with its output in `log_path`.

    Args:
        command: the program and its leading arguments, e.g. `["vllm", "serve", MODEL]`.
        args: arguments after host and port (the caller's server arguments).
        log_path: the server's stdout and stderr (created or truncated).
        port: None: a free port.
        env: the server's environment (None: this process's).
    """
    port = free_port() if port is None else port
    argv = [*command, "--host", "127.0.0.1", "--port", str(port), *args]
    path = Path(log_path)
    with open(path, "wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=None if env is None else dict(env),
            start_new_session=True,  # a Ctrl-C reaches it once, through `stop`
        )
    return ServerProcess(proc, f"http://127.0.0.1:{port}", path, argv)


def wait_healthy(server: ServerProcess, timeout_s: float, *, name: str = "the server") -> None:
    """Poll `GET /health` every second until it answers 200.

    Raises:
        ServerStartError: the process exited, or `timeout_s` passed (with the log's tail).
    """
    asyncio.run(_wait_healthy(server, timeout_s, name))


async def _wait_healthy(server: ServerProcess, timeout_s: float, name: str) -> None:
    deadline = time.monotonic() + timeout_s
    async with client.new_session() as session:
        while time.monotonic() < deadline:
            code = server.proc.poll()
            if code is not None:
                raise ServerStartError(
                    f"{name} ({server.url}) exited with code {code} before /health answered; "
                    f"log {server.log_path}:\n{server.log_tail()}"
                )
            if await client.is_healthy(session, server.url):
                return
            await asyncio.sleep(_POLL_S)
    raise ServerStartError(
        f"{name} did not answer {server.url}/health within {timeout_s:g} s; log "
        f"{server.log_path}:\n{server.log_tail()}"
    )


def stop(server: ServerProcess, shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S) -> int:
    """Stop the server; its exit code. SIGINT, then SIGTERM, then SIGKILL to its whole tree.

    SIGINT is vLLM's clean shutdown (it stops its API server and engine processes). Only a
    server that ignores it for `shutdown_timeout_s` gets SIGTERM, and then SIGKILL, sent to its
    process group and to every descendant (one may have left the group).
    """
    proc = server.proc
    if proc.poll() is not None:
        return proc.returncode
    tree = set(process_tree(proc.pid))
    proc.send_signal(signal.SIGINT)
    for sig, timeout_s in ((signal.SIGTERM, shutdown_timeout_s), (signal.SIGKILL, _TERM_TIMEOUT_S)):
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("server pid %d still runs %g s after the last signal; sending %s",
                           proc.pid, timeout_s, sig.name)
            _signal_tree(proc.pid, tree | set(process_tree(proc.pid)), sig)
    return proc.wait(timeout=_TERM_TIMEOUT_S)


def _signal_tree(leader: int, pids: set[int], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, sig)  # its own session: the group is the server's
    for pid in alive(pids):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@contextlib.contextmanager
def running_server(
    command: Sequence[str],
    args: Sequence[str] = (),
    *,
    log_path: str | Path | None = None,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S,
    name: str = "the server",
    say: Callable[[str], None] | None = None,
) -> Iterator[ServerProcess]:
    """`start`, `wait_healthy`, yield the server, and `stop` it in a finally.

    `log_path` None: a temporary file, deleted after a run without error (and quoted in the
    error otherwise). `say`: progress lines ("starting ...", "server ready at URL").

    Raises:
        ServerStartError: see `wait_healthy`.
    """
    keep_log = log_path is not None
    if log_path is None:
        fd, log_path = tempfile.mkstemp(prefix="fairway-server-", suffix=".log")
        os.close(fd)
    server = start(command, args, log_path=log_path, port=port, env=env)
    if say is not None:
        say(f"starting {shlex.join(server.argv)} (log: {server.log_path})")
    ok = False
    try:
        wait_healthy(server, startup_timeout_s, name=name)
        if say is not None:
            say(f"server ready at {server.url}")
        yield server
        ok = True
    finally:
        stop(server, shutdown_timeout_s)
        if ok and not keep_log:
            server.log_path.unlink(missing_ok=True)


# --- the process tree (Linux /proc) ---------------------------------------------------------------


def process_tree(root: int) -> dict[int, str]:
    """pid -> state letter of `root` and all its live descendants (empty without /proc)."""
    parents: dict[int, int] = {}
    states: dict[int, str] = {}
    with contextlib.suppress(OSError):
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
