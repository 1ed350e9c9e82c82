"""Run a vLLM server as a child and make sure a stop signal stops it within seconds.

Why this exists (vLLM 0.32, `vllm serve` and `python -m vllm.entrypoints.openai.api_server`):
on SIGTERM/SIGINT the API server first stops its engine, then uvicorn waits for the open HTTP
connections to close, with no time limit. With the default `--shutdown-timeout 0` the engine
process gets SIGTERM and, the timeout being 0, SIGKILL right after it (`vllm/v1/utils.py`,
`shutdown`). Whether the engine first sends the "aborted" outputs of its requests is a race: an
engine inside a model step cannot run its SIGTERM handler before the SIGKILL lands. When it loses,
the API server's output handler is cancelled without telling the requests, so every request still
waiting or running never gets a last output, its HTTP handler never returns, and the server logs
"Waiting for connections to close" until the clients give up (a live replay: its per-request
timeout, 600 s by default). When it wins (an idle or lightly loaded engine, e.g. a few streams
and nothing waiting), the server exits in under a second. With `--shutdown-timeout N` the engine
drains for N seconds, but whatever is unfinished then meets the same SIGKILL. A second signal is
ignored by vLLM's handler. Idle keep-alive connections are not the cause: uvicorn closes those
at once.

So the process that owns the server (`fairway serve`) forwards the first stop signal, gives the
server `grace_s` (plus vLLM's own `--shutdown-timeout`) to exit, then SIGKILLs its process group:
by then the engine is already gone, and only the stuck HTTP handlers are left to end. See
FAIRWAY.md, "Shutdown". Also runnable: `python -m fairway.shutdown [--grace-s S] -- COMMAND...`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)

#: Seconds a server gets after the forwarded stop signal (beyond its --shutdown-timeout).
DEFAULT_GRACE_S = 10.0
#: Signals forwarded to the server (the first one starts the grace period).
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_POLL_S = 0.2


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


class Supervisor:
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
                code = self.proc.wait(timeout=_POLL_S)
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
            "for requests its stopped engine will never answer; see FAIRWAY.md, Shutdown); "
            "killing it",
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
                            start_new_session=True, preexec_fn=preexec_fn)
    supervisor = Supervisor(proc, grace_s)
    previous = {s: signal.signal(s, supervisor.forward) for s in FORWARDED}
    try:
        return supervisor.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m fairway.shutdown [--grace-s S] -- COMMAND...`: `supervise` from a shell."""
    parser = argparse.ArgumentParser(
        prog="python -m fairway.shutdown",
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
