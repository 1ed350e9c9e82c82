"""`fairway profile`: measure a server's prefill-time table T(L) and write it as a profile file.

Against a running server (`--url`), or a vLLM server this command starts on 127.0.0.1 and stops
afterwards (`--model DIR`, vLLM arguments after `--`; `fairway.supervisor`). The measuring is
`fairway.profiling.profiler` (the table: `measured_profile`; its text and plot: `profile_report`);
this module parses arguments and prints. `register(subparsers)` adds the verb to the `fairway`
parser. On a CUDA machine it also measures the offload tier's load cost
(`fairway.profiling.copy_rate`) into the table's `metadata["load_cost"]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fairway.cli.argtypes import positive_int
from fairway.errors import FairwayError, ProfileError
from fairway.profiling.profiler import (
    DEFAULT_REPEATS,
    DEFAULT_TIMEOUT_S,
    DEFAULT_VOCAB_SIZE,
    DEFAULT_WARMUP_ROUNDS,
    ProfileSettings,
)
from fairway.supervisor import DEFAULT_STARTUP_TIMEOUT_S

DEFAULT_OUTPUT = "fairway-profile.json"
#: vLLM flags this command sets itself for a local server.
_OWN_FLAGS = ("host", "port", "uds")
#: `--step-time` choices: what the replay prices steps with when given the written file.
STEP_TIME_CHOICES = ("table", "quadratic")


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
    where.add_argument("--from-step-log", action="append", metavar="PATH",
                       help="measure nothing: fit the step-time model o + b*tokens + "
                       "c*attention_pairs to step logs a Fairway server wrote under load "
                       "(serving option step_log; repeatable) and write it as the table")
    p.add_argument("--chunk-tokens", type=positive_int, default=None, metavar="N",
                   help="with --from-step-log: the server's step token budget "
                   "(--max-num-batched-tokens)")
    p.add_argument("--max-model-len", type=positive_int, default=None, metavar="N",
                   help="with --from-step-log: the longest prompt of the table")
    p.add_argument("--lengths", type=_lengths, default=None, metavar="N,N,...",
                   help="prompt lengths in tokens (default: 128, 256, ... doubling up to the "
                   "server's max model length, which is measured too)")
    p.add_argument("--repeats", type=positive_int, default=DEFAULT_REPEATS,
                   help=f"measured requests per length; the median is kept "
                   f"(default {DEFAULT_REPEATS})")
    p.add_argument("--warmup", type=_non_negative_int, default=DEFAULT_WARMUP_ROUNDS,
                   metavar="ROUNDS", help="unrecorded passes over all lengths first "
                   f"(default {DEFAULT_WARMUP_ROUNDS})")
    p.add_argument("-o", "--output", default=DEFAULT_OUTPUT, metavar="PATH",
                   help=f"the profile table to write (default {DEFAULT_OUTPUT})")
    p.add_argument("--force", action="store_true", help="overwrite an existing --output")
    p.add_argument("--step-time", choices=STEP_TIME_CHOICES, default="table",
                   help="the step-time model `fairway bench --profile` prices steps with when "
                   "given the written file: the measured table (default) or the fitted curve "
                   "T(L) = a + b*L + c*L^2 (saved with its coefficients)")
    p.add_argument("--plot", default=None, metavar="PATH",
                   help="PNG of the points and the fit (default: --output with .png)")
    p.add_argument("--no-plot", action="store_true", help="do not plot")
    p.add_argument("--hardware", default=None, metavar="TEXT",
                   help="what the server runs on, for the table's metadata (default: detected "
                   "with --model, 'unknown' with --url)")
    p.add_argument("--model-name", default=None, metavar="TEXT",
                   help="how the table names the model (default: the served model name)")
    p.add_argument("--note", default=None, metavar="TEXT", help="a note for the metadata")
    p.add_argument("--kv-bytes-per-token", type=positive_int, default=None, metavar="N",
                   help="the model's KV cache bytes per token, for the offload tier's load cost "
                   "(default: from the model's config.json; needed with --url when the served "
                   "model's config cannot be found). The copy rates are measured on this "
                   "machine's GPU; without CUDA no load cost is written")
    p.add_argument("--served-model", default=None, metavar="NAME",
                   help="model name to request (default: the first listed by /v1/models)")
    p.add_argument("--vocab-size", type=positive_int, default=DEFAULT_VOCAB_SIZE,
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


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


# --- the handler --------------------------------------------------------------------------------


def _profile(args: argparse.Namespace) -> int:
    from fairway import supervisor
    from fairway.profiling import measured_profile, profile_report, profiler
    from fairway.profiling.hardware import detect_local_hardware

    output = Path(args.output)
    if output.exists() and not args.force:
        raise FairwayError(f"--output {output} exists; pass --force to overwrite it")
    if args.from_step_log:
        return _from_step_log(args, output)
    vllm_args = _vllm_args(args)
    settings = ProfileSettings(
        lengths=args.lengths, repeats=args.repeats, warmup_rounds=args.warmup,
        vocab_size=args.vocab_size, seed=args.seed, timeout_s=args.timeout,
        stream=not args.no_stream, model=args.served_model,
    )
    extra: dict[str, Any] = {}
    if args.model is not None:
        detected = detect_local_hardware()
        hardware = args.hardware or detected or "unknown"
        hardware_detected = args.hardware is None and detected is not None
        extra["server"] = {"started_by": "fairway profile", "model_path": args.model,
                           "vllm_args": vllm_args,
                           # Other work on the machine slows a CPU server; say how much there was.
                           "load_average_1m_at_start": round(os.getloadavg()[0], 2)}
        from fairway.vllm_argv import check_vllm_cli, vllm_launcher  # imports no vLLM

        check_vllm_cli()

        # Plain vLLM, not Fairway's scheduler: with one request at a time the ordering has
        # nothing to do, and T(L) is a property of the GPU, the model and the engine settings.
        with supervisor.running_server(
            [*vllm_launcher(), "serve", args.model], vllm_args, log_path=args.server_log,
            startup_timeout_s=args.startup_timeout, name="the vLLM server", say=_say,
        ) as server:
            run = profiler.measure(server.url, settings, progress=_say)
    else:
        hardware, hardware_detected = args.hardware or "unknown", False
        extra["server"] = {"url": args.url}
        run = profiler.measure(args.url, settings, progress=_say)
    # After the server stopped, so that its KV cache does not hold the GPU's memory.
    no_load_cost = _measure_load_cost(args, vllm_args, run.server.model, extra)
    if args.model_name:
        extra["model"] = args.model_name
        extra["served_model_name"] = run.server.model
    if args.note:
        extra["note"] = args.note
    def build(step_time: str) -> Any:
        return measured_profile.build_profile(
            run, hardware=hardware, hardware_detected=hardware_detected,
            command=command_line(args, vllm_args), extra=extra, step_time=step_time,
        )

    try:
        outcome = build(args.step_time)
    except ProfileError as exc:  # the measurement is kept: fall back to the table
        print(f"fairway: warning: {exc}; the file keeps step_time 'table'", file=sys.stderr)
        outcome = build("table")
    outcome.profile.save(output)
    if no_load_cost is not None:
        from fairway.profiling.load_cost import estimate

        _say(f"no load_cost measured ({no_load_cost}): the offload tier's load cost will be "
             f"the estimate for the GPU class of {hardware!r} (load_cost.estimate: "
             f"{estimate(outcome.profile).note})")
    print(profile_report.format_report(outcome))
    print(f"wrote {output} ({len(outcome.profile.points)} points; hardware: {hardware})")
    if not args.no_plot:
        _plot(outcome, Path(args.plot) if args.plot else output.with_suffix(".png"))
    return 0


def _measure_load_cost(args: argparse.Namespace, vllm_args: Sequence[str], served_model: str,
                       extra: dict[str, Any]) -> str | None:
    """Measure the tier's load figures into `extra["load_cost"]`; the reason when none are."""
    from fairway.profiling import copy_rate
    from fairway.vllm_argv import flag_value  # imports no vLLM

    kv_dtype = flag_value(vllm_args, "kv-cache-dtype")
    if kv_dtype in (None, "auto"):
        kv_dtype = flag_value(vllm_args, "dtype")
    try:
        cost = copy_rate.measure_load_cost(
            model=args.model if args.model is not None else served_model,
            kv_bytes_per_token=args.kv_bytes_per_token, kv_dtype=kv_dtype,
        )
    except ProfileError as exc:
        return str(exc)
    extra["load_cost"] = cost.to_json()
    _say(f"load cost: {cost.kv_bytes_per_token} KV bytes per token, "
         f"h2d {cost.h2d_bytes_per_s / 1e9:.1f} GB/s, d2h {cost.d2h_bytes_per_s / 1e9:.1f} GB/s")
    return None


def _from_step_log(args: argparse.Namespace, output: Path) -> int:
    """`--from-step-log`: the engine's average step cost under the logged load, as a table."""
    from fairway.profiling.calibration import fit_step_log

    if args.chunk_tokens is None or args.max_model_len is None:
        raise FairwayError("--from-step-log needs --chunk-tokens (the server's "
                           "--max-num-batched-tokens) and --max-model-len")
    table = fit_step_log(args.from_step_log, args.chunk_tokens, args.max_model_len)
    if table is None:
        raise ProfileError(
            f"the step logs {', '.join(args.from_step_log)} hold too few or too alike steps to "
            "fit o, b and c (log more traffic of mixed prompt lengths)"
        )
    if args.note:
        table = dataclasses.replace(table, metadata={**table.metadata, "note": args.note})
    table.save(output)
    coefficients = table.metadata["coefficients"]
    print(f"step_s = {coefficients['o_s']:.4g} + {coefficients['b_s_per_token']:.4g}*tokens + "
          f"{coefficients['c_s_per_pair']:.4g}*pairs over {table.metadata['steps_used']} steps; "
          f"T(2048) = {table.prefill_s(2048):.4g} s")
    print(f"wrote {output} ({len(table.points)} points; step_time calibrated)")
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
    from fairway.vllm_argv import flag_value  # vLLM's flag spellings; imports no vLLM

    for name in _OWN_FLAGS:
        if flag_value(rest, name) is not None:
            raise FairwayError(
                f"--{name} after `--`: fairway profile runs its server on 127.0.0.1 and a free "
                "port; to profile a server of your own, start it and use --url"
            )
    return rest


def _plot(outcome: Any, path: Path) -> None:
    from fairway.profiling import profile_report

    try:
        profile_report.plot_profile(outcome, path)
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
    if args.step_time != "table":
        parts += ["--step-time", args.step_time]
    if args.kv_bytes_per_token is not None:
        parts += ["--kv-bytes-per-token", str(args.kv_bytes_per_token)]
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
