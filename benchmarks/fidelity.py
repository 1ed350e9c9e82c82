"""Fidelity check (skeleton): one scaled SEC trace, live against a server and on the virtual clock.

    fairway tiny-model /tmp/tiny --max-len 8192          # once: the tiny CPU model
    fairway profile --model /tmp/tiny -o tiny.json -- --max-model-len 8192 \
        --max-num-batched-tokens 2048 --gpu-memory-utilization 0.15   # its measured T(L)
    # let the script start `fairway serve` for each policy, replay live, then virtually:
    python benchmarks/fidelity.py --profile tiny.json --serve /tmp/tiny [--policy fcfs ...] \
        --serve-arg=--gpu-memory-utilization=0.15
    # or against a server already running (one policy: say which with --policy):
    python benchmarks/fidelity.py --profile tiny.json --url http://127.0.0.1:8000 --policy fairway
    # the virtual side only (no server), e.g. to check the set-up:
    python benchmarks/fidelity.py --profile tiny.json --virtual-only [--quick]

The trace is a SEC preset built against the profile's capacity (`capacity_tps` at the step
budget), so its loads mean the same stress on the profiled engine as on the GPU the paper's
traces target. Both sides use the same engine settings: KV blocks (`--num-gpu-blocks-override`
on the server; default sized from the trace as in `fairway bench`), block size (32: vLLM's CPU
attention refuses 16), step budget, `max_num_seqs`, the same table for the policies' patience,
and the same token-id blocks (ids below the model's vocabulary). Prints, per policy and phase,
the live and virtual TTFT median and p99 side by side with their ratios, and writes fidelity.md /
fidelity.json and every replay.

Status: a skeleton. The virtual side, the serve commands and the comparison table run here; a
full live run (a measured table, one server start per policy) is for the step that finishes it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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
        required=True,
        metavar="PATH_OR_NAME",
        help="T(L) table of the served engine (from `fairway profile`)",
    )
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
    parser.add_argument("--port", type=int, default=8011, help="port for --serve")
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
    return parser.parse_args(argv)


def scaled(trace: Trace, factor: float) -> Trace:
    """`trace` with every arrival time multiplied by `factor` (as the live replay's time scale)."""
    if factor == 1.0:
        return trace
    reqs = tuple(
        dataclasses.replace(r, arrival_s=round(r.arrival_s * factor, 6)) for r in trace.requests
    )
    return Trace(trace.header, reqs)


def serve_command(args: Any, policy: str, num_blocks: int) -> list[str]:
    """`fairway serve` with the engine settings the virtual replay uses."""
    import fairway.policies as policies

    cmd = [sys.executable, "-m", "fairway.cli", "serve", args.serve, "--policy", policy]
    if "profile" in policies.param_names(policy):
        cmd += ["--profile", args.profile]
    return cmd + [
        "--port",
        str(args.port),
        "--block-size",
        str(args.block_size),
        "--num-gpu-blocks-override",
        str(num_blocks),
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


def wait_ready(url: str, process: subprocess.Popen[Any], timeout_s: float) -> None:
    """Poll GET /v1/models until the server answers (or died, or the time is up)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode} at start-up")
        try:
            if httpx.get(f"{url}/v1/models", timeout=5.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2.0)
    raise TimeoutError(f"no answer from {url} within {timeout_s:.0f} s")


def stop(process: subprocess.Popen[Any]) -> None:
    """SIGINT (vLLM shuts down cleanly), then SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


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
    url = f"http://127.0.0.1:{args.port}"
    cmd = serve_command(args, policy, num_blocks)
    log = (raw_dir / f"serve-{policy}.log").open("w")
    process = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_LOGGING_LEVEL": "INFO"}
    )
    try:
        wait_ready(url, process, args.startup_timeout_s)
        return run_live(trace, url, **kwargs)
    finally:
        stop(process)
        log.close()


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
    from fairway.profile import load
    from fairway.replay.sim import replay, size_cache

    args = parse_args(argv)
    policies = args.policy or list(DEFAULT_POLICIES)
    if args.url and len(policies) != 1:
        raise FairwayConfigError("--url replays one server: give its policy with one --policy")
    started = time.perf_counter()
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
    out_dir = new_out_dir(args.out, NAME)
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
    if args.dry_run or args.virtual_only:
        if args.serve:
            for policy in policies:
                print(" ".join(serve_command(args, policy, sizing.num_blocks)))
    else:
        live = [live_replay(args, trace, name, p, sizing.num_blocks, raw_dir) for p in policies]
    if live:
        table, rows = comparison(live, virtual)
    else:
        table = report.to_markdown(report.summarize(virtual))
        rows = []
    header = (
        f"_fidelity: {name}, {len(trace)} requests, capacity {capacity:.0f} tokens/s, "
        f"{sizing.num_blocks} KV blocks, profile {args.profile}"
        f"{'' if live else ' — virtual side only'}._\n\n"
    )
    (out_dir / f"{NAME}.md").write_text(header + table, encoding="utf-8")
    write_json(
        out_dir / f"{NAME}.json",
        {
            "args": vars(args),
            "environment": environment_info(),
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
