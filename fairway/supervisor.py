"""Run a server (`vllm serve`, `fairway serve`) on 127.0.0.1 for as long as a measurement needs it.

The one supervisor of the profiler (`fairway profile --model`), the fidelity benchmark and the
end-to-end test fixtures: start the command on 127.0.0.1 and a free port with its output in a log
file, wait until `GET /health` answers 200 (or fail with the log's tail when it exits or the time
is up), and always stop it: SIGINT (vLLM's clean shutdown), then SIGTERM, then SIGKILL to its
whole process tree. It launches processes and must not import vllm.

It also runs `fairway serve`'s server in the foreground (`supervise`, and `python -m
fairway.supervisor [--grace-s S] -- COMMAND...` for a plain vLLM server): stop signals are
forwarded, and after a grace period the server's process group is killed. Why that is needed
(vLLM 0.32): on SIGTERM/SIGINT the API server stops its engine, then uvicorn waits for the open
HTTP connections with no time limit. With the default `--shutdown-timeout 0` the engine gets
SIGTERM and SIGKILL right after it; an engine inside a model step loses that race before it can
send the "aborted" outputs of its requests, so every request still waiting or running never ends,
and the server logs "Waiting for connections to close" until the clients give up. A second
signal is ignored by vLLM. With `--shutdown-timeout N` the engine drains for N seconds, and what
is unfinished then meets the same SIGKILL. See FAIRWAY.md, "Shutdown and failures".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
            preexec_fn=default_sigint,
        )
    return ServerProcess(proc, f"http://127.0.0.1:{port}", path, argv)


def default_sigint() -> None:
    """In a server's child process before exec: SIGINT back to its default disposition.

    A process started with SIGINT ignored (`cmd &` from a non-interactive shell) passes that on
    through fork and exec, and a Python server then ignores the SIGINT that `stop` and
    `supervise` send for its clean shutdown (it ends only by SIGTERM, after the grace period).
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _then(first: Callable[[], None], second: Callable[[], None] | None) -> Callable[[], None]:
    """One `preexec_fn` that runs `first`, then `second` (if any)."""
    if second is None:
        return first

    def both() -> None:
        first()
        second()

    return both


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


# --- a server in the foreground (`fairway serve`) -----------------------------------------------


#: Seconds a server gets after the forwarded stop signal (beyond its --shutdown-timeout).
DEFAULT_GRACE_S = 10.0
#: Signals forwarded to the server (the first one starts the grace period).
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_RELAY_POLL_S = 0.2


def shutdown_timeout_of(argv: Sequence[str]) -> float:
    """vLLM's `--shutdown-timeout` in a server command line (0, its default, when absent)."""
    for i, arg in enumerate(argv):
        value = None
        if arg == "--shutdown-timeout" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--shutdown-timeout="):
            value = arg.split("=", 1)[1]
        if value is not None:
            with contextlib.suppress(ValueError):
                return max(0.0, float(value))
    return 0.0


class SignalRelay:
    """A running server child: forwards stop signals and kills it when the grace period ends.

    The child must lead its own process group (`start_new_session=True`), so that the kill also
    reaches anything it started that is still alive.
    """

    def __init__(self, proc: subprocess.Popen[Any], grace_s: float) -> None:
        self.proc = proc
        self.grace_s = grace_s
        self.deadline: float | None = None
        self.signal: int | None = None
        self.killed = False

    def forward(self, signum: int, _frame: Any = None) -> None:
        """Signal handler: pass the signal on; the first one starts the grace period."""
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signum)
        if self.deadline is None:
            self.deadline = time.monotonic() + self.grace_s
            self.signal = signum

    def wait(self) -> int:
        """Until the child exits (killed after the grace period); its shell-style exit code."""
        while True:
            try:
                code = self.proc.wait(timeout=_RELAY_POLL_S)
                break
            except subprocess.TimeoutExpired:
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    self.kill()
        if self.killed and self.signal is not None:
            return 128 + self.signal  # stopped by the user's signal, not by a crash
        return 128 - code if code < 0 else code

    def kill(self) -> None:
        """SIGKILL the child's process group (once), saying why on stderr."""
        if self.killed:
            return
        self.killed = True
        name = signal.Signals(self.signal).name if self.signal else "the stop signal"
        print(
            f"fairway: the server did not exit within {self.grace_s:g} s of {name} (vLLM waits "
            "for requests its stopped engine will never answer; see FAIRWAY.md, Shutdown and "
            "failures); killing it",
            file=sys.stderr,
        )
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()


def supervise(
    argv: Sequence[str], env: Mapping[str, str] | None = None, *,
    grace_s: float | None = None, preexec_fn: Callable[[], None] | None = None,
) -> int:
    """Run `argv` until it exits, forwarding SIGINT/SIGTERM/SIGHUP; its exit code.

    After the first forwarded signal the server has `grace_s` seconds (default `DEFAULT_GRACE_S`
    plus the command's `--shutdown-timeout`) before its process group is killed. The child gets
    its own session, so a terminal's Ctrl-C reaches it once (forwarded here), not twice.
    """
    if grace_s is None:
        grace_s = DEFAULT_GRACE_S + shutdown_timeout_of(argv)
    proc = subprocess.Popen(list(argv), env=None if env is None else dict(env),
                            start_new_session=True, preexec_fn=_then(default_sigint, preexec_fn))
    relay = SignalRelay(proc, grace_s)
    previous = {s: signal.signal(s, relay.forward) for s in FORWARDED}
    try:
        return relay.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m fairway.supervisor [--grace-s S] -- COMMAND...`: `supervise` from a shell."""
    parser = argparse.ArgumentParser(
        prog="python -m fairway.supervisor",
        description="Run a server command; after SIGINT/SIGTERM give it --grace-s seconds, then "
        "kill its process group (vLLM can otherwise wait forever for open streams).",
    )
    parser.add_argument("--grace-s", type=float, default=None,
                        help=f"seconds after the stop signal (default {DEFAULT_GRACE_S:g} + the "
                        "command's --shutdown-timeout)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the server command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    return supervise(command, grace_s=args.grace_s)


if __name__ == "__main__":
    sys.exit(main())
