"""Fidelity check: one scaled SEC trace, live against `fairway serve` and on the virtual clock.

    fairway tiny-model /tmp/tiny --max-len 8192          # once: the tiny CPU model
    # profile the served engine, then for each policy start `fairway serve`, replay live, stop
    # it; then the virtual replay with the same table and engine settings:
    python benchmarks/fidelity.py --reprofile --serve /tmp/tiny --quick \
        --serve-arg=--gpu-memory-utilization=0.15 --out results/fidelity
    # with a table measured earlier (`fairway profile --model /tmp/tiny -o tiny.json -- ARGS`):
    python benchmarks/fidelity.py --profile tiny.json --serve /tmp/tiny [--policy fcfs ...]
    # or against a server already running (one policy: say which with --policy):
    python benchmarks/fidelity.py --profile tiny.json --url http://127.0.0.1:8000 --policy fairway
    # the virtual side only (no server), e.g. to check the set-up:
    python benchmarks/fidelity.py --profile tiny.json --virtual-only [--quick]

`--reprofile` (with `--serve`) first runs `fairway profile --model MODEL_DIR` with the engine
arguments the servers get (block size, step budget, `max_num_seqs`, model length, dummy weights,
eager mode, `--serve-arg`s; not the KV block count, which depends on the trace and so on the
table), writes `profile.json` (and its plot) into the output directory and uses it on both sides.

The trace is a SEC preset built against the profile's capacity (`capacity_tps` at the step
budget), so its loads mean the same stress on the profiled engine as on the GPU the paper's
traces target. Both sides use the same engine settings: KV blocks (`--num-gpu-blocks-override`
on the server; default sized from the trace as in `fairway bench`), block size (32: vLLM's CPU
attention refuses 16), step budget, `max_num_seqs`, the same table for the policies' patience,
and the same token-id blocks (ids below the model's vocabulary). Prints, per policy and phase,
the live and virtual TTFT median and p99 side by side with their ratios, and writes fidelity.md /
fidelity.json and every replay (plus each server's log).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairway import supervisor  # noqa: E402
from fairway.errors import FairwayConfigError  # noqa: E402
from fairway.replay import report  # noqa: E402
from fairway.replay import results as results_io  # noqa: E402
from fairway.replay.bench import (  # noqa: E402
    environment_info,
    load_trace_spec,
    new_out_dir,
    trace_label,
    write_json,
)
from fairway.replay.results import ReplayResult  # noqa: E402
from fairway.traces.format import Trace  # noqa: E402

NAME = "fidelity"
DEFAULT_POLICIES = ("fcfs", "lpm", "fairway")
#: vLLM's CPU attention needs blocks of a multiple of 32 tokens (16 is refused at start-up).
BLOCK_SIZE = 32


def parse_args(argv: list[str] | None) -> Any:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--profile",
        default=None,
        metavar="PATH_OR_NAME",
        help="T(L) table of the served engine (from `fairway profile`); required unless "
        "--reprofile",
    )
    parser.add_argument(
        "--reprofile",
        action="store_true",
        help="with --serve: measure the table first (`fairway profile --model`, same engine "
        "arguments) into OUT/profile.json and use it",
    )
    parser.add_argument(
        "--profile-lengths",
        default="128,256,512,1024,2048,4096,8000",
        metavar="N,N,...",
        help="prompt lengths of --reprofile (default 128 ... 4096, 8000)",
    )
    parser.add_argument("--profile-repeats", type=int, default=3, help="--reprofile repeats")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server (one policy: give it with --policy)")
    where.add_argument(
        "--serve",
        metavar="MODEL_DIR",
        help="start `fairway serve MODEL_DIR` for each policy in turn",
    )
    where.add_argument("--virtual-only", action="store_true", help="no live side")
    parser.add_argument(
        "--policy",
        action="append",
        default=None,
        help=f"policies (repeatable; default {', '.join(DEFAULT_POLICIES)})",
    )
    parser.add_argument("--trace", default="sec-a", help="preset or trace file (default sec-a)")
    parser.add_argument("--quick", action="store_true", help="shorter preset (a quarter)")
    parser.add_argument(
        "--capacity-tps",
        type=float,
        default=None,
        help="capacity the preset's loads are relative to (default: the "
        "profile's at the step budget)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiply arrival times on both sides (0.5 = twice the rate)",
    )
    parser.add_argument(
        "--num-blocks",
        type=int,
        default=None,
        help="KV blocks on both sides (default: as `fairway bench` sizes them)",
    )
    parser.add_argument("--cache-fraction", type=float, default=0.3)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=512,
        help="token ids stay below this (the tiny model's vocabulary)",
    )
    parser.add_argument("--block-size", type=int, default=BLOCK_SIZE,
                        help=f"KV block size on both sides (default {BLOCK_SIZE}: CPU attention)")
    parser.add_argument("--port", type=int, default=None,
                        help="port for --serve (default: a free one)")
    parser.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                        help="extra argument for `fairway serve` (repeatable), e.g. "
                        "--serve-arg=--gpu-memory-utilization=0.15 on a small CPU machine")
    parser.add_argument("--startup-timeout-s", type=float, default=600.0)
    parser.add_argument("--out", default=None, metavar="DIR")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the serve commands and run the virtual side only",
    )
    args = parser.parse_args(argv)
    if args.reprofile and not args.serve:
        parser.error("--reprofile needs --serve MODEL_DIR (the profiler starts the engine)")
    if args.profile is None and not args.reprofile:
        parser.error("give --profile PATH_OR_NAME, or --reprofile with --serve")
    if args.profile is not None and args.reprofile:
        parser.error("--profile and --reprofile exclude each other")
    return args


def scaled(trace: Trace, factor: float) -> Trace:
    """`trace` with every arrival time multiplied by `factor` (as the live replay's time scale)."""
    if factor == 1.0:
        return trace
    reqs = tuple(
        dataclasses.replace(r, arrival_s=round(r.arrival_s * factor, 6)) for r in trace.requests
    )
    return Trace(trace.header, reqs)


def engine_args(args: Any) -> list[str]:
    """vLLM arguments shared by the profiler's server and every policy's server."""
    return [
        "--block-size",
        str(args.block_size),
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--max-model-len",
        str(args.max_model_len),
        "--load-format",
        "dummy",
        "--enforce-eager",
        *args.serve_arg,
    ]


def serve_command(args: Any, policy: str, num_blocks: int) -> tuple[list[str], list[str]]:
    """`fairway serve` with the engine settings the virtual replay uses: (command, arguments).

    The supervisor puts `--host 127.0.0.1 --port PORT` between the two.
    """
    import fairway.policies as policies

    command = [sys.executable, "-m", "fairway.cli", "serve", args.serve]
    rest = ["--policy", policy]
    if "profile" in policies.param_names(policy):
        rest += ["--profile", args.profile]
    return command, [*rest, "--num-gpu-blocks-override", str(num_blocks), *engine_args(args)]


def profile_command(args: Any, out_dir: Path) -> list[str]:
    """`fairway profile --model` with the servers' engine arguments, writing OUT/profile.json."""
    return [
        sys.executable,
        "-m",
        "fairway.cli",
        "profile",
        "--model",
        args.serve,
        "-o",
        str(out_dir / "profile.json"),
        "--repeats",
        str(args.profile_repeats),
        "--lengths",
        args.profile_lengths,
        "--vocab-size",
        str(args.vocab_size),
        "--server-log",
        str(out_dir / "profile-serve.log"),
        "--startup-timeout",
        str(args.startup_timeout_s),
        "--",
        *engine_args(args),
    ]


def reprofile(args: Any, out_dir: Path) -> str:
    """Run the profiler (its output goes to OUT/profile.log); the table's path."""
    cmd = profile_command(args, out_dir)
    print("profiling:", " ".join(cmd), file=sys.stderr)
    with (out_dir / "profile.log").open("w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        raise RuntimeError(f"fairway profile failed (exit {rc}); see {out_dir / 'profile.log'}")
    return str(out_dir / "profile.json")


def live_replay(
    args: Any, trace: Trace, name: str, policy: str, num_blocks: int, raw_dir: Path
) -> ReplayResult:
    """One live replay: against --url, or a `fairway serve` started for this policy."""
    from fairway.replay.live import run_live

    kwargs = {
        "policy": policy,
        "trace_name": name,
        "vocab_size": args.vocab_size,
        "time_scale": args.time_scale,
        "out_path": raw_dir / f"live--{results_io.safe_name(name)}--{policy}.json",
    }
    if args.url:
        return run_live(trace, args.url, **kwargs)
    command, serve_args = serve_command(args, policy, num_blocks)
    with supervisor.running_server(
        command, serve_args, log_path=raw_dir / f"serve-{policy}.log", port=args.port,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "INFO"}, startup_timeout_s=args.startup_timeout_s,
        name=f"fairway serve --policy {policy}",
        say=lambda line: print(line, file=sys.stderr, flush=True),
    ) as server:
        return run_live(trace, server.url, **kwargs)


def comparison(live: list[ReplayResult], virtual: list[ReplayResult]) -> tuple[str, list[dict]]:
    """Per policy x phase: live and virtual median / p99 and virtual / live."""
    rows = []
    lines = [
        "| policy | phase | n | live median | virtual median | v/l | live p99 | "
        "virtual p99 | v/l |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    s_live, s_virt = report.summarize(live), report.summarize(virtual)
    for result in live:
        t, policy = result.trace_name, result.policy
        for phase in s_live.phases[t]:
            a, b = s_live.row(t, policy, phase), s_virt.row(t, policy, phase)
            if a is None or b is None:
                continue
            row = {
                "policy": policy,
                "phase": phase,
                "n": a.n,
                "live_errors": a.n_errors,
                "live_median_s": a.median_s,
                "virtual_median_s": b.median_s,
                "live_p99_s": a.p99_s,
                "virtual_p99_s": b.p99_s,
            }
            rows.append(row)
            lines.append(
                f"| {policy} | {phase} | {a.n} | {_f(a.median_s)} | {_f(b.median_s)} | "
                f"{_ratio(b.median_s, a.median_s)} | {_f(a.p99_s)} | {_f(b.p99_s)} | "
                f"{_ratio(b.p99_s, a.p99_s)} |"
            )
    return "\n".join(lines) + "\n", rows


def _f(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or not b else f"{a / b:.2f}"


def main(argv: list[str] | None = None) -> int:
    from fairway.profiling.table import load
    from fairway.replay.sim import replay, size_cache

    args = parse_args(argv)
    policies = args.policy or list(DEFAULT_POLICIES)
    if args.url and len(policies) != 1:
        raise FairwayConfigError("--url replays one server: give its policy with one --policy")
    started = time.perf_counter()
    out_dir = new_out_dir(args.out, NAME)
    profile_wall_s = None
    if args.reprofile:
        t0 = time.perf_counter()
        args.profile = reprofile(args, out_dir)
        profile_wall_s = round(time.perf_counter() - t0, 3)
    profile = load(args.profile)
    capacity = args.capacity_tps or profile.capacity_tps(args.max_num_batched_tokens)
    trace = scaled(
        load_trace_spec(args.trace, quick=args.quick, capacity_tps=capacity), args.time_scale
    )
    name = trace_label(args.trace, args.quick)
    sizing = size_cache(
        trace,
        cache_fraction=args.cache_fraction,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    raw_dir = out_dir / "replays"
    raw_dir.mkdir(parents=True, exist_ok=True)
    virtual = []
    for policy in policies:
        result = replay(
            trace,
            policy,
            profile=args.profile,
            num_blocks=sizing.num_blocks,
            block_size=args.block_size,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            trace_name=name,
        )
        results_io.save(result, raw_dir / f"virtual--{results_io.file_name(result)}")
        virtual.append(result)
    live: list[ReplayResult] = []
    live_wall_s: dict[str, float] = {}
    if args.dry_run or args.virtual_only:
        if args.serve:
            for policy in policies:
                command, serve_args = serve_command(args, policy, sizing.num_blocks)
                port = "PORT" if args.port is None else str(args.port)
                print(shlex.join([*command, "--host", "127.0.0.1", "--port", port, *serve_args]))
    else:
        for policy in policies:
            t0 = time.perf_counter()
            live.append(live_replay(args, trace, name, policy, sizing.num_blocks, raw_dir))
            live_wall_s[policy] = round(time.perf_counter() - t0, 3)
    if live:
        table, rows = comparison(live, virtual)
    else:
        table = report.to_markdown(report.summarize(virtual))
        rows = []
    env = environment_info()
    header = (
        f"_fidelity: {env['date']}, {env['cpu_count']}-core {env['machine']} CPU "
        f"({env['processor']}), {env['vllm']}; {name}, {len(trace)} requests, capacity "
        f"{capacity:.0f} tokens/s, {sizing.num_blocks} KV blocks of {args.block_size} tokens, "
        f"profile {args.profile}{' (measured by --reprofile)' if args.reprofile else ''}"
        f"{'' if live else ' — virtual side only'}; "
        f"{time.perf_counter() - started:.0f} s wall._\n\n"
    )
    (out_dir / f"{NAME}.md").write_text(header + table, encoding="utf-8")
    write_json(
        out_dir / f"{NAME}.json",
        {
            "args": vars(args),
            "environment": env,
            "profile_wall_s": profile_wall_s,
            "live_wall_s": live_wall_s,
            "profile_table": profile.to_json(),
            "rows": rows,
            "kv_cache": sizing.to_json(),
            "capacity_tps": capacity,
            "trace": virtual[0].settings["trace"] if virtual else None,
            "wall_s": round(time.perf_counter() - started, 3),
        },
    )
    print(header + table)
    print(f"wrote {out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
