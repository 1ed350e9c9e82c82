"""Fidelity check: one trace, live against `fairway serve` and on the virtual clock.

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

`--reprofile` (with `--serve`) first measures the table (`fairway profile --url`) against a
`fairway serve` started exactly as the live servers are (same engine arguments, same CPU pinning;
not the KV block count, which depends on the trace and so on the table), with the profiler pinned
as the live clients are; it writes `profile.json` into the output directory and uses it on both
sides.

Live runs (`--runs N`, default 3) reuse one server per policy: before each run its prefix cache is
reset (vLLM's dev endpoint, so the servers run with VLLM_SERVER_DEV_MODE=1), `--warmup` short
prompts are sent and the cache is reset again. `--client vllm-bench` also replays the trace with
vLLM's own client (`vllm bench serve --dataset-name timed_trace` of the trace exported with 16-token
chunks); `--client-cpus` / `--server-cpus` pin the two sides (taskset lists). `--step-log` makes
each server write its step log (option `step_log`) and adds a check of the step-time model against
every live engine step. `--live-from DIR` recomputes the comparison against the live runs an
earlier run saved (e.g. with another table).

The protocol of docs/results.md ("Fidelity: replay vs a live engine"): the two clients alternate
run by run on each policy's server, pinned to core 0 (`--client-cpus 0`). Without `--server-cpus`,
vLLM CPU's automatic OpenMP binding places the model worker on a core by itself and the API server
and engine core run on either core; `--server-cpus 0 --engine-cpus 1` leaves core 1 to the worker
alone. The table is measured under the same pinning (`--reprofile --profile-repeats 7`: median of
7). The servers run `--serve-arg=--dtype=float32`: on a CPU with AVX2 but no AVX-512 (the 2-core
AMD EPYC VM) vLLM's CPU kernels emulate bfloat16, and T(2,048) was 1.02 s in bfloat16 against
0.32 s in float32. With `--step-log` the report prices every live step with the replay's
step-time model; `--fit-live-steps` fits `o + b*tokens + c*attention_pairs` to those steps (as
`fairway profile --from-step-log` does) and replays the virtual side again with it. Failed
requests: see `SERVER_ENV` (idle connections) and `fairway.client.KEEPALIVE_S`.

The trace is a SEC preset built against the profile's capacity (`capacity_tps` at the step
budget), so its loads mean the same stress on the profiled engine as on the GPU the paper's
traces target. Both sides use the same engine settings: KV blocks (`--num-gpu-blocks-override`
on the server; default sized from the trace as in `fairway bench`), block size (32: vLLM's CPU
attention refuses 16), step budget, `max_num_seqs`, the same table for the policies' patience,
and the same token-id blocks (ids below the model's vocabulary). Prints, per policy and phase,
the live and virtual TTFT median and p99 side by side with their ratios, and writes fidelity.md /
fidelity.json and every replay (plus each server's log). This script runs the replays; the
statistics are `fairway.replay.fidelity`'s and the tables `fairway.replay.fidelity_markdown`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairway import supervisor  # noqa: E402
from fairway.errors import FairwayConfigError  # noqa: E402
from fairway.profiling.calibration import fit_step_log  # noqa: E402
from fairway.profiling.table import PrefillProfile  # noqa: E402
from fairway.profiling.table import load as load_profile  # noqa: E402
from fairway.replay import results as results_io  # noqa: E402
from fairway.replay.bench import (  # noqa: E402
    environment_info,
    load_trace_spec,
    new_out_dir,
    trace_label,
    write_json,
)
from fairway.replay.engine_sizing import CacheSizing, size_cache  # noqa: E402
from fairway.replay.fidelity import (  # noqa: E402
    ComparisonRow,
    LiveRuns,
    StepModelCheck,
    comparison_rows,
    marked_fitted,
    rankings,
    step_model_check,
    step_shapes,
)
from fairway.replay.fidelity_markdown import (  # noqa: E402
    comparison_table,
    fitted_section,
    ranking_table,
    step_check_table,
    step_shapes_table,
)
from fairway.replay.report import to_markdown  # noqa: E402
from fairway.replay.results import ReplayResult  # noqa: E402
from fairway.replay.summary import summarize  # noqa: E402
from fairway.traces.format import Trace  # noqa: E402

NAME = "fidelity"
DEFAULT_POLICIES = ("fcfs", "lpm", "fairway")
CLIENTS = ("fairway", "vllm-bench")
#: The live servers' environment: dev endpoints for the cache reset, and idle connections kept
#: for 5 min (vLLM closes them after 5 s, while `vllm bench serve` reuses them for 60 s: a request
#: sent on one the server is closing fails with "Cannot write to closing transport").
SERVER_ENV = {"VLLM_LOGGING_LEVEL": "INFO", "VLLM_SERVER_DEV_MODE": "1",
              "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "300"}
#: Tokens per hash id of the trace handed to `vllm bench serve` (<= the KV block size).
EXPORT_CHUNK_TOKENS = 16
#: vLLM's CPU attention needs blocks of a multiple of 32 tokens (16 is refused at start-up).
BLOCK_SIZE = 32


def parse_args(argv: list[str] | None) -> argparse.Namespace:
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
        default=None,
        metavar="N,N,...",
        help="prompt lengths of --reprofile (default 128 ... 4096 and 8000, those up to "
        "--max-model-len, and --max-model-len itself when below 8000)",
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
    where.add_argument("--live-from", metavar="DIR",
                       help="no new live runs: compare with the live runs (and step logs) an "
                       "earlier run wrote into DIR (e.g. after changing the profile)")
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
    parser.add_argument("--runs", type=int, default=None,
                        help="live runs per policy and client, on one server per policy whose "
                        "prefix cache is reset (and warmed up) before each run (default 3; 1 "
                        "with --url)")
    parser.add_argument("--client", action="append", default=None, choices=CLIENTS,
                        help="live client (repeatable): fairway (`fairway replay --url`) and/or "
                        "vllm-bench (`vllm bench serve --dataset-name timed_trace` of the "
                        "exported trace); default fairway")
    parser.add_argument("--server-cpus", default=None, metavar="LIST",
                        help="pin the server (all its processes) to these CPUs (taskset -c LIST)")
    parser.add_argument("--engine-cpus", default=None, metavar="LIST",
                        help="the CPUs of the model's compute (vLLM CPU's "
                        "VLLM_CPU_OMP_THREADS_BIND), e.g. --server-cpus 0 --engine-cpus 1 "
                        "--client-cpus 0: the worker alone on core 1, everything else on core 0")
    parser.add_argument("--client-cpus", default=None, metavar="LIST",
                        help="pin the live clients to these CPUs (e.g. --server-cpus 1 "
                        "--client-cpus 0 on a 2-core machine)")
    parser.add_argument("--step-log", action="store_true",
                        help="servers write a step log (option step_log) and the report checks "
                        "the step-time model against each live engine step")
    parser.add_argument("--fit-live-steps", action="store_true",
                        help="also fit the step-time model (o + b*tokens + c*pairs) to the live "
                        "servers' step logs and replay the virtual side again with it: the "
                        "replay's error once the engine's step costs under load are known")
    parser.add_argument("--warmup", type=int, default=8,
                        help="short requests sent before each live run (then the cache is reset)")
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
    if args.profile_lengths is None:
        top = min(8000, args.max_model_len)
        lengths = [n for n in (128, 256, 512, 1024, 2048, 4096) if n < top] + [top]
        args.profile_lengths = ",".join(map(str, lengths))
    if args.runs is None:
        args.runs = 1 if args.url else 3
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    if args.url and args.runs > 1:
        parser.error("--runs > 1 needs --serve (each run resets the server's prefix cache)")
    args.client = args.client or ["fairway"]
    return args


def scaled(trace: Trace, factor: float) -> Trace:
    """`trace` with every arrival time multiplied by `factor` (as the live replay's time scale)."""
    if factor == 1.0:
        return trace
    reqs = tuple(
        dataclasses.replace(r, arrival_s=round(r.arrival_s * factor, 6)) for r in trace.requests
    )
    return Trace(trace.header, reqs)


def engine_args(args: argparse.Namespace) -> list[str]:
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


def step_log_path(args: argparse.Namespace, policy: str) -> Path:
    """Where the server of `policy` writes its step log (--step-log), or wrote it (--live-from)."""
    return Path(args.live_from or args.out_dir) / "replays" / f"steps-{policy}.jsonl"


def run_stem(name: str, policy: str, client: str, run: int) -> str:
    """File stem of one live run's results (run counts from 1)."""
    return f"live--{results_io.safe_name(name)}--{policy}--{client}--run{run}"


def load_live_runs(args: argparse.Namespace, name: str, policies: list[str]) -> LiveRuns:
    """The live runs an earlier run saved in --live-from DIR, for these policies and clients."""
    raw = Path(args.live_from) / "replays"
    runs: LiveRuns = {}
    for policy in policies:
        for client in args.client:
            paths = sorted(raw.glob(f"{run_stem(name, policy, client, 0)[:-1]}*.json"))
            paths = [p for p in paths if not p.name.endswith(".vllm.json")]
            if not paths:
                raise FairwayConfigError(f"{raw}: no live runs of {policy} with client {client}")
            runs[(client, policy)] = [results_io.load(p) for p in paths]
    return runs


def serve_command(
    args: argparse.Namespace, policy: str, num_blocks: int
) -> tuple[list[str], list[str]]:
    """`fairway serve` with the engine settings the virtual replay uses: (command, arguments).

    The supervisor puts `--host 127.0.0.1 --port PORT` between the two.
    """
    import fairway.policies as policies

    command = [sys.executable, "-m", "fairway.cli", "serve", args.serve]
    rest = ["--policy", policy]
    if "profile" in policies.param_names(policy):
        rest += ["--profile", args.profile]
    if args.step_log:
        rest += ["--fairway-option", f"step_log={step_log_path(args, policy)}"]
    return command, [*rest, "--num-gpu-blocks-override", str(num_blocks), *engine_args(args)]


def profile_command(args: argparse.Namespace, out_dir: Path, url: str) -> list[str]:
    """`fairway profile --url` against a server started like the live ones; writes profile.json."""
    from fairway.profiling.hardware import detect_local_hardware

    return taskset(args.client_cpus, [
        sys.executable, "-m", "fairway.cli", "profile", "--url", url,
        "-o", str(out_dir / "profile.json"), "--repeats", str(args.profile_repeats),
        "--lengths", args.profile_lengths, "--vocab-size", str(args.vocab_size),
        "--hardware", detect_local_hardware() or "unknown",
        "--note", f"benchmarks/fidelity.py --reprofile: server CPUs {args.server_cpus or 'any'}, "
        f"engine CPUs {args.engine_cpus or 'auto'}, client CPUs {args.client_cpus or 'any'}; "
        f"vLLM arguments {shlex.join(engine_args(args))}",
    ])


def reprofile(args: argparse.Namespace, out_dir: Path) -> str:
    """Measure T(L) on a server started (and pinned) as the live ones, with the client pinned as
    the live clients are; the profiler's output goes to OUT/profile.log. Returns the table's path.
    """
    command = [sys.executable, "-m", "fairway.cli", "serve", args.serve]
    with supervisor.running_server(
        taskset(args.server_cpus, command), ["--policy", "fcfs", *engine_args(args)],
        log_path=out_dir / "profile-serve.log", port=args.port, env=server_env(args),
        startup_timeout_s=args.startup_timeout_s, name="fairway serve (profiling)",
        say=lambda line: print(line, file=sys.stderr, flush=True),
    ) as server:
        cmd = profile_command(args, out_dir, server.url)
        print("profiling:", " ".join(cmd), file=sys.stderr)
        with (out_dir / "profile.log").open("w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        raise RuntimeError(f"fairway profile failed (exit {rc}); see {out_dir / 'profile.log'}")
    return str(out_dir / "profile.json")


def server_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment of every server this script starts (profiling and live)."""
    env = {**os.environ, **SERVER_ENV}
    if args.engine_cpus is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = args.engine_cpus
    return env


def taskset(cpus: str | None, command: list[str]) -> list[str]:
    """`command` run on these CPUs only (all its child processes inherit the mask)."""
    return command if cpus is None else ["taskset", "-c", cpus, *command]


@contextlib.contextmanager
def client_cpus(cpus: str | None) -> Iterator[None]:
    """Pin this process (the live replay client) to `cpus` for the block, then restore."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpu_set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def cpu_set(cpus: str) -> set[int]:
    """`0,2-3` -> {0, 2, 3} (taskset's list syntax)."""
    result: set[int] = set()
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        result.update(range(int(lo), int(hi or lo) + 1))
    return result


def prepare_server(url: str, model: str, warmup: int, vocab_size: int) -> None:
    """Reset the prefix cache, send `warmup` short distinct prompts, reset again.

    Each run then starts from an empty cache on an engine whose first steps (allocation, lazy
    initialisation) are behind it. Needs the server's dev endpoints (VLLM_SERVER_DEV_MODE=1).
    """
    import httpx

    def reset() -> None:
        response = httpx.post(f"{url}/reset_prefix_cache", timeout=60.0)
        if response.status_code != 200:
            raise RuntimeError(
                f"POST {url}/reset_prefix_cache answered {response.status_code}: "
                f"{response.text[:200]} (start the server with VLLM_SERVER_DEV_MODE=1)"
            )

    reset()
    for i in range(warmup):
        prompt = [(7 * i + j) % (vocab_size - 4) + 4 for j in range(64 + 32 * i)]
        response = httpx.post(
            f"{url}/v1/completions",
            json={"model": model, "prompt": prompt, "max_tokens": 1},
            timeout=120.0,
        )
        response.raise_for_status()
    reset()


def served_model(url: str) -> str:
    import httpx

    return str(httpx.get(f"{url}/v1/models", timeout=30.0).json()["data"][0]["id"])


def fairway_client_run(
    args: argparse.Namespace, trace: Trace, name: str, policy: str, url: str, out_path: Path
) -> ReplayResult:
    """One open-loop replay with Fairway's own live client."""
    from fairway.replay.live import run_live

    with client_cpus(args.client_cpus):
        return run_live(
            trace, url, policy=policy, trace_name=name, vocab_size=args.vocab_size,
            out_path=out_path,  # the trace is already scaled by --time-scale
        )


def vllm_bench_run(
    args: argparse.Namespace, trace: Trace, name: str, policy: str, url: str, model: str,
    export: Path, out_path: Path,
) -> ReplayResult:
    """One replay of the exported trace with `vllm bench serve` (vLLM's own client).

    Its per-request lists are in the file's order, which is the trace's: phases and ids are
    attached by position (after checking that every prompt length matches).
    """
    from fairway.replay.vllm_result import load_vllm_result

    command = [
        str(Path(sys.executable).with_name("vllm")), "bench", "serve", "--backend", "vllm",
        "--base-url", url, "--model", model, "--tokenizer", args.serve or model,
        "--dataset-name", "timed_trace", "--dataset-path", str(export),
        "--timed-trace-chunk-hash-size", str(EXPORT_CHUNK_TOKENS),
        "--num-prompts", str(len(trace)), "--save-result", "--save-detailed",
        "--result-dir", str(out_path.parent), "--result-filename", out_path.name,
        "--label", policy, "--disable-tqdm",
    ]
    vllm_path = out_path.with_suffix(".vllm.json")
    command[command.index("--result-filename") + 1] = vllm_path.name
    with (out_path.with_suffix(".log")).open("w") as log:
        rc = subprocess.run(taskset(args.client_cpus, command), stdout=log,
                            stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        log_path = out_path.with_suffix(".log")
        raise RuntimeError(f"vllm bench serve failed (exit {rc}); see {log_path}")
    result = load_vllm_result(vllm_path, policy=policy, trace_name=name)
    lengths = [r.prompt_tokens for r in result.requests]
    expected = [r.prompt_tokens for r in trace.requests]
    if lengths != expected:
        raise RuntimeError(f"{vllm_path}: vllm bench serve sent other prompt lengths than the "
                           "trace")
    requests = [
        dataclasses.replace(got, request_id=req.request_id, phase=req.phase)
        for got, req in zip(result.requests, trace.requests, strict=True)
    ]
    result = dataclasses.replace(result, requests=requests)
    results_io.save(result, out_path)
    return result


def replay_virtual(
    args: argparse.Namespace, trace: Trace, name: str, policy: str, num_blocks: int,
    pricing: PrefillProfile | str,
) -> ReplayResult:
    """The virtual replay of `policy`, its steps priced by `pricing` (a table or its path); the
    policy's own table (patience) is always --profile's, as on the live servers."""
    import fairway.policies as policies
    from fairway.replay.sim import replay

    params = {"profile": args.profile} if "profile" in policies.param_names(policy) else None
    return replay(
        trace, policy, profile=pricing, policy_params=params, num_blocks=num_blocks,
        block_size=args.block_size, max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs, trace_name=name,
    )


def live_runs(
    args: argparse.Namespace, trace: Trace, name: str, policies: list[str], num_blocks: int,
    raw_dir: Path,
) -> tuple[LiveRuns, dict[str, float]]:
    """Every live run: {(client, policy): [result per run]}, and wall seconds per policy.

    One server per policy (or --url); before each run its prefix cache is reset and warmed up,
    so the runs of a policy are repetitions of one experiment; the clients alternate run by run.
    """
    from fairway.traces.export import export_trace

    export = raw_dir / "trace-vllm-timed.jsonl"
    if "vllm-bench" in args.client:
        export_trace(trace, export, "vllm-timed-trace", EXPORT_CHUNK_TOKENS)
    runs: LiveRuns = {}
    wall: dict[str, float] = {}

    def replay_all(policy: str, url: str) -> None:
        model = served_model(url)
        for run in range(args.runs):
            for client in args.client:
                if args.serve:
                    prepare_server(url, model, args.warmup, args.vocab_size)
                stem = run_stem(name, policy, client, run + 1)
                if client == "fairway":
                    result = fairway_client_run(args, trace, name, policy, url,
                                                raw_dir / f"{stem}.json")
                else:
                    result = vllm_bench_run(args, trace, name, policy, url, model, export,
                                            raw_dir / f"{stem}.json")
                failed = sum(r.error is not None for r in result.requests)
                print(f"{policy} {client} run {run + 1}: {len(result.requests)} requests, "
                      f"{failed} failed", file=sys.stderr, flush=True)
                runs.setdefault((client, policy), []).append(result)

    for policy in policies:
        t0 = time.perf_counter()
        if args.url:
            replay_all(policy, args.url)
        else:
            command, serve_args = serve_command(args, policy, num_blocks)
            with supervisor.running_server(
                taskset(args.server_cpus, command), serve_args,
                log_path=raw_dir / f"serve-{policy}.log", port=args.port,
                env=server_env(args),
                startup_timeout_s=args.startup_timeout_s,
                name=f"fairway serve --policy {policy}",
                say=lambda line: print(line, file=sys.stderr, flush=True),
            ) as server:
                replay_all(policy, server.url)
        wall[policy] = round(time.perf_counter() - t0, 3)
    return runs, wall


def kv_sizing(args: argparse.Namespace, trace: Trace) -> CacheSizing:
    """KV blocks of both sides: as `fairway bench` sizes them (or --num-blocks), but never fewer
    than one longest request needs, since vLLM refuses to start then (it keeps one block back)."""
    sizing = size_cache(
        trace,
        cache_fraction=args.cache_fraction,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    fit = -(-args.max_model_len // args.block_size) + 1
    if sizing.num_blocks < fit:
        print(f"fidelity: {sizing.num_blocks} KV blocks hold less than --max-model-len "
              f"{args.max_model_len}; using {fit}", file=sys.stderr)
        sizing = size_cache(trace, cache_fraction=args.cache_fraction, num_blocks=fit,
                            block_size=args.block_size,
                            max_num_batched_tokens=args.max_num_batched_tokens)
    return sizing


def live_side(
    args: argparse.Namespace, trace: Trace, name: str, policies: list[str], num_blocks: int,
    raw_dir: Path,
) -> tuple[LiveRuns, dict[str, float]]:
    """The live runs (new, or --live-from's) and wall seconds per policy; none with --dry-run or
    --virtual-only, which print the serve commands instead (with --serve)."""
    if args.dry_run or args.virtual_only:
        if args.serve:
            for policy in policies:
                command, serve_args = serve_command(args, policy, num_blocks)
                port = "PORT" if args.port is None else str(args.port)
                print(shlex.join([*taskset(args.server_cpus, command), "--host", "127.0.0.1",
                                  "--port", port, *serve_args]))
        return {}, {}
    if args.live_from:
        return load_live_runs(args, name, policies), {}
    return live_runs(args, trace, name, policies, num_blocks, raw_dir)


def replay_fitted(
    args: argparse.Namespace, trace: Trace, name: str, policies: list[str], num_blocks: int,
    out_dir: Path,
) -> tuple[PrefillProfile, list[ReplayResult]] | None:
    """--fit-live-steps: the step-time model fitted to the live step logs (written to
    OUT/profile-fitted-to-live-steps.json) and the virtual replays priced by it, or None when the
    logs are missing or too uniform to fit."""
    logs = [step_log_path(args, p) for p in policies]
    fitted = fit_step_log([p for p in logs if p.exists()],
                          args.max_num_batched_tokens, args.max_model_len)
    if fitted is None:
        return None
    fitted_path = out_dir / "profile-fitted-to-live-steps.json"
    fitted_path.write_text(json.dumps(fitted.to_json(), indent=1), encoding="utf-8")
    refit = [replay_virtual(args, trace, name, policy, num_blocks, fitted) for policy in policies]
    for result in refit:
        stem = f"virtual-fitted--{results_io.file_name(result)}"
        results_io.save(result, out_dir / "replays" / stem)
    return fitted, refit


def live_report(
    args: argparse.Namespace, trace: Trace, name: str, policies: list[str], num_blocks: int,
    profile: PrefillProfile, runs: LiveRuns, virtual: list[ReplayResult], out_dir: Path,
) -> tuple[str, list[ComparisonRow], dict[str, StepModelCheck | None]]:
    """fidelity.md's tables, the comparison rows and the step-model checks of a run with a live
    side (the step checks with --step-log or --live-from, the refit with --fit-live-steps)."""
    rows = comparison_rows(runs, virtual)
    table = comparison_table(rows) + "\n" + ranking_table(rankings(rows))
    steps: dict[str, StepModelCheck | None] = {}
    if args.step_log or args.live_from:
        logs = [step_log_path(args, p) for p in policies]
        steps = {p: step_model_check(log, profile) for p, log in zip(policies, logs, strict=True)}
        table += ("\n" + step_check_table(steps) + "\n"
                  + step_shapes_table(step_shapes(logs, profile)))
    if args.fit_live_steps:
        refit = replay_fitted(args, trace, name, policies, num_blocks, out_dir)
        if refit is None:
            table += "\nno step-time fit: the step logs are missing or too uniform\n"
        else:
            fitted, results = refit
            refit_rows = comparison_rows(runs, results)
            table += "\n" + fitted_section(fitted.step_time, rows, refit_rows)
            rows += marked_fitted(refit_rows)
    return table, rows, steps


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    policies = args.policy or list(DEFAULT_POLICIES)
    if args.url and len(policies) != 1:
        raise FairwayConfigError("--url replays one server: give its policy with one --policy")
    started = time.perf_counter()
    out_dir = new_out_dir(args.out, NAME)
    args.out_dir = str(out_dir)
    profile_wall_s = None
    if args.reprofile:
        t0 = time.perf_counter()
        args.profile = reprofile(args, out_dir)
        profile_wall_s = round(time.perf_counter() - t0, 3)
    profile = load_profile(args.profile)
    capacity = args.capacity_tps or profile.capacity_tps(args.max_num_batched_tokens)
    trace = scaled(
        load_trace_spec(args.trace, quick=args.quick, capacity_tps=capacity), args.time_scale
    )
    name = trace_label(args.trace, args.quick)
    sizing = kv_sizing(args, trace)
    raw_dir = out_dir / "replays"
    raw_dir.mkdir(parents=True, exist_ok=True)
    virtual = []
    for policy in policies:
        result = replay_virtual(args, trace, name, policy, sizing.num_blocks, args.profile)
        results_io.save(result, raw_dir / f"virtual--{results_io.file_name(result)}")
        virtual.append(result)
    runs, live_wall_s = live_side(args, trace, name, policies, sizing.num_blocks, raw_dir)
    steps: dict[str, StepModelCheck | None] = {}
    rows: list[ComparisonRow] = []
    if runs:
        table, rows, steps = live_report(args, trace, name, policies, sizing.num_blocks, profile,
                                         runs, virtual, out_dir)
    else:
        table = to_markdown(summarize(virtual))
    env = environment_info()
    header = (
        f"_fidelity: {env['date']}, {env['cpu_count']}-core {env['machine']} CPU "
        f"({env['processor']}), {env['vllm']}; {name}, {len(trace)} requests, capacity "
        f"{capacity:.0f} tokens/s, {sizing.num_blocks} KV blocks of {args.block_size} tokens, "
        f"profile {args.profile}{' (measured by --reprofile)' if args.reprofile else ''}"
        f"{'' if runs else ' — virtual side only'}; live: {args.runs} run(s) x "
        f"{', '.join(args.client)}, server CPUs {args.server_cpus or 'any'}, engine CPUs "
        f"{args.engine_cpus or 'auto'}, client CPUs {args.client_cpus or 'any'}; "
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
            "step_model_check": steps,
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
