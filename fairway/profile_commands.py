"""`fairway profile`: measure a server's prefill-time table T(L) and write it as a profile file.

Against a running server (`--url`), or a vLLM server this command starts on 127.0.0.1 and stops
afterwards (`--model DIR`, vLLM arguments after `--`). The measuring itself is
`fairway.profiler`; this module parses arguments, runs the local server and prints.
"""

from __future__ import annotations

import argparse
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairway.errors import FairwayError
from fairway.profiler import (
    DEFAULT_REPEATS,
    DEFAULT_TIMEOUT_S,
    DEFAULT_VOCAB_SIZE,
    DEFAULT_WARMUP_ROUNDS,
    ProfilerError,
    ProfileSettings,
)

logger = logging.getLogger(__name__)

DEFAULT_OUTPUT = "fairway-profile.json"
#: vLLM's start on a busy CPU box takes ~1.5 min; a large model on a GPU can take many minutes.
DEFAULT_STARTUP_TIMEOUT_S = 900.0
#: Seconds to wait for a clean exit after SIGINT before killing the server's process group.
_SHUTDOWN_TIMEOUT_S = 60.0
_LOG_TAIL_LINES = 30
#: vLLM flags this command sets itself for a local server.
_OWN_FLAGS = ("host", "port", "uds")


def register(subparsers: Any) -> None:
    """Add the `profile` subcommand to the `fairway` parser."""
    p = subparsers.add_parser(
        "profile",
        help="measure the idle prefill time T(L) of a server and write a profile table",
        description="Measure T(L), the idle prefill time of an L-token prompt: token-id prompts "
        "that cannot hit the prefix cache, max_tokens=1, one request at a time, client-side time "
        "to the first token, median of --repeats. Writes the table (for `fairway serve --profile` "
        "and `fairway bench`), prints it with a fitted curve T(L) = a + b*L + c*L^2 and plots it. "
        "With --model, starts `vllm serve DIR` on 127.0.0.1 (arguments after `--` go to vLLM) "
        "and stops it afterwards.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running OpenAI-compatible server, e.g. "
                       "http://127.0.0.1:8000")
    where.add_argument("--model", metavar="DIR_OR_NAME",
                       help="start `vllm serve DIR_OR_NAME` here for the measurement")
    p.add_argument("--lengths", type=_lengths, default=None, metavar="N,N,...",
                   help="prompt lengths in tokens (default: 128, 256, ... doubling up to the "
                   "server's max model length, which is measured too)")
    p.add_argument("--repeats", type=_positive_int, default=DEFAULT_REPEATS,
                   help=f"measured requests per length; the median is kept "
                   f"(default {DEFAULT_REPEATS})")
    p.add_argument("--warmup", type=_non_negative_int, default=DEFAULT_WARMUP_ROUNDS,
                   metavar="ROUNDS", help="unrecorded passes over all lengths first "
                   f"(default {DEFAULT_WARMUP_ROUNDS})")
    p.add_argument("-o", "--output", default=DEFAULT_OUTPUT, metavar="PATH",
                   help=f"the profile table to write (default {DEFAULT_OUTPUT})")
    p.add_argument("--force", action="store_true", help="overwrite an existing --output")
    p.add_argument("--plot", default=None, metavar="PATH",
                   help="PNG of the points and the fit (default: --output with .png)")
    p.add_argument("--no-plot", action="store_true", help="do not plot")
    p.add_argument("--hardware", default=None, metavar="TEXT",
                   help="what the server runs on, for the table's metadata (default: detected "
                   "with --model, 'unknown' with --url)")
    p.add_argument("--model-name", default=None, metavar="TEXT",
                   help="how the table names the model (default: the served model name)")
    p.add_argument("--note", default=None, metavar="TEXT", help="a note for the metadata")
    p.add_argument("--served-model", default=None, metavar="NAME",
                   help="model name to request (default: the first listed by /v1/models)")
    p.add_argument("--vocab-size", type=_positive_int, default=DEFAULT_VOCAB_SIZE,
                   help="token ids are drawn below this; must not exceed the model's "
                   f"vocabulary (default {DEFAULT_VOCAB_SIZE})")
    p.add_argument("--no-stream", action="store_true",
                   help="time the whole (1-token) answer instead of the first streamed chunk")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"limit for one request (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT_S,
                   metavar="SECONDS", help="with --model: limit for the server to come up "
                   f"(default {DEFAULT_STARTUP_TIMEOUT_S:g})")
    p.add_argument("--server-log", default=None, metavar="PATH",
                   help="with --model: keep the server's log here (default: a temporary file, "
                   "quoted on failure)")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER,
                   help="with --model: `-- ARGS...` passed to `vllm serve` unchanged")
    p.set_defaults(handler=_profile)


def _lengths(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N,N,... (integers), got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"lengths must be positive integers, got {text!r}")
    return values


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


# --- the handler --------------------------------------------------------------------------------


def _profile(args: argparse.Namespace) -> int:
    from fairway import profiler

    vllm_args = _vllm_args(args)
    output = Path(args.output)
    if output.exists() and not args.force:
        raise FairwayError(f"--output {output} exists; pass --force to overwrite it")
    settings = ProfileSettings(
        lengths=args.lengths, repeats=args.repeats, warmup_rounds=args.warmup,
        vocab_size=args.vocab_size, seed=args.seed, timeout_s=args.timeout,
        stream=not args.no_stream, model=args.served_model,
    )
    extra: dict[str, Any] = {}
    if args.model is not None:
        detected = profiler.detect_local_hardware()
        hardware = args.hardware or detected or "unknown"
        hardware_detected = args.hardware is None and detected is not None
        extra["server"] = {"started_by": "fairway profile", "model_path": args.model,
                           "vllm_args": vllm_args,
                           # Other work on the machine slows a CPU server; say how much there was.
                           "load_average_1m_at_start": round(os.getloadavg()[0], 2)}
        with local_server(args.model, vllm_args, args.startup_timeout, args.server_log) as url:
            run = profiler.measure(url, settings, progress=_say)
    else:
        hardware, hardware_detected = args.hardware or "unknown", False
        extra["server"] = {"url": args.url}
        run = profiler.measure(args.url, settings, progress=_say)
    if args.model_name:
        extra["model"] = args.model_name
        extra["served_model_name"] = run.server.model
    if args.note:
        extra["note"] = args.note
    outcome = profiler.build_profile(
        run, hardware=hardware, hardware_detected=hardware_detected,
        command=command_line(args, vllm_args), extra=extra,
    )
    outcome.profile.save(output)
    print(profiler.format_report(outcome))
    print(f"wrote {output} ({len(outcome.profile.points)} points; hardware: {hardware})")
    if not args.no_plot:
        _plot(outcome, Path(args.plot) if args.plot else output.with_suffix(".png"))
    return 0


def _vllm_args(args: argparse.Namespace) -> list[str]:
    """The arguments after `--` (for `vllm serve`); only valid with --model."""
    rest = list(args.vllm_args)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if rest and args.model is None:
        raise FairwayError(
            f"arguments for vLLM ({shlex.join(rest)}) need --model: with --url the server "
            "is already running"
        )
    from fairway.cli.vllm_argv import flag_value  # vLLM's flag spellings; imports no vLLM

    for name in _OWN_FLAGS:
        if flag_value(rest, name) is not None:
            raise FairwayError(
                f"--{name} after `--`: fairway profile runs its server on 127.0.0.1 and a free "
                "port; to profile a server of your own, start it and use --url"
            )
    return rest


def _plot(outcome: Any, path: Path) -> None:
    from fairway import profiler

    try:
        profiler.plot_profile(outcome, path)
    except ImportError as exc:  # e.g. the vLLM container image has no matplotlib
        print(f"fairway: warning: no plot ({exc}); the table is written", file=sys.stderr)
        return
    print(f"wrote {path}")


def _say(message: str) -> None:
    print(f"fairway profile: {message}", file=sys.stderr, flush=True)


def command_line(args: argparse.Namespace, vllm_args: Sequence[str]) -> str:
    """The command that reproduces this measurement (for the table's metadata)."""
    parts = ["fairway", "profile"]
    parts += ["--model", args.model] if args.model is not None else ["--url", args.url]
    if args.lengths is not None:
        parts += ["--lengths", ",".join(map(str, args.lengths))]
    parts += ["--repeats", str(args.repeats), "--warmup", str(args.warmup)]
    optional = (
        ("--hardware", args.hardware), ("--model-name", args.model_name),
        ("--served-model", args.served_model), ("--note", args.note),
    )
    parts += [item for flag, value in optional if value is not None for item in (flag, value)]
    if args.vocab_size != DEFAULT_VOCAB_SIZE:
        parts += ["--vocab-size", str(args.vocab_size)]
    if args.no_stream:
        parts.append("--no-stream")
    if args.seed:
        parts += ["--seed", str(args.seed)]
    parts += ["-o", args.output]
    if vllm_args:
        parts += ["--", *vllm_args]
    return shlex.join(parts)


# --- a local server -----------------------------------------------------------------------------


@dataclass
class _Server:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def local_server(
    model: str,
    vllm_args: Sequence[str],
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    log_path: str | None = None,
) -> Iterator[str]:
    """Run `vllm serve MODEL ARGS` on 127.0.0.1 and a free port; yield its URL; stop it.

    Plain vLLM, not Fairway's scheduler: with one request at a time the ordering has nothing to
    do, and T(L) is a property of the GPU, the model and the engine settings.

    Raises:
        ProfilerError: the server exits or does not answer /health in time (with its log tail).
    """
    from fairway.cli.vllm_argv import check_vllm_cli, vllm_launcher

    check_vllm_cli()
    port = free_port()
    argv = [*vllm_launcher(), "serve", model, "--host", "127.0.0.1", "--port", str(port),
            *vllm_args]
    keep_log = log_path is not None
    if log_path is None:
        fd, log_path = tempfile.mkstemp(prefix="fairway-profile-server-", suffix=".log")
        os.close(fd)
    path = Path(log_path)
    _say(f"starting {shlex.join(argv)} (log: {path})")
    with open(path, "wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches it once, through `_stop`
        )
    server = _Server(proc, f"http://127.0.0.1:{port}", path)
    ok = False
    try:
        _wait_ready(server, startup_timeout_s)
        _say(f"server ready at {server.url}")
        yield server.url
        ok = True
    finally:
        _stop(server)
        if ok and not keep_log:
            path.unlink(missing_ok=True)


def _wait_ready(server: _Server, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            code = server.proc.poll()
            if code is not None:
                raise ProfilerError(
                    f"the vLLM server for {server.url} exited with code {code} before it was "
                    f"ready; log {server.log_path}:\n{_tail(server.log_path)}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{server.url}/health").status_code == 200:
                    return
            time.sleep(1.0)
    raise ProfilerError(
        f"the vLLM server for {server.url} did not answer /health within {timeout_s:g} s "
        f"(--startup-timeout); log {server.log_path}:\n{_tail(server.log_path)}"
    )


def _stop(server: _Server) -> None:
    """SIGINT (vLLM's clean shutdown), then SIGKILL of its process group if it hangs."""
    proc = server.proc
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=_SHUTDOWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        logger.warning("vLLM server pid %d did not stop in %s s; killing it", proc.pid,
                       _SHUTDOWN_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group is the server's
        proc.wait(timeout=10)


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"
