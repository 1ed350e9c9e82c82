"""Live witness of the `tenants` preset: is the light tenant protected on a real `fairway serve`?

    fairway tiny-model /tmp/lt-tiny --max-len 8192 --hidden 512 --layers 4 --dtype float32
    # once: measure the served engine's prefill table (as benchmarks/fidelity.py --reprofile)
    python benchmarks/live_tenants.py --serve /tmp/lt-tiny --reprofile --runs 0 --out results/lt
    # then the live runs, priced and time-scaled by that table:
    python benchmarks/live_tenants.py --serve /tmp/lt-tiny --profile results/lt/profile.json \
        --out results/live-tenants [--runs 3] [--time-scale auto|X]

The trace is the quick `tenants` preset (`fairway replay --trace tenants --quick`: 200 requests
over 67.5 s, built for 4,510 tokens/s; heavy sends 3 x light's request rate, mostly cache hits
on 6k-token contexts; light sends 1k-3k-token misses, a quarter of the work, 1.5 x capacity in
the 37.5 s overload) and the same trace with only the light tenant's requests (its own
warm-ups included; the header's request count fixed), both written to OUT/traces/. Each run and
policy (fairway, then fcfs, runs interleaved) starts one `fairway serve` of the tiny model with
the option `tenants` = ["heavy", "light"] (both policies: the option only changes `fairway`'s
order), the engine settings of benchmarks/fidelity.py (32-token KV blocks, 2,048-token steps,
`--num-gpu-blocks-override` of 1.5 x the trace's reusable content, dummy weights, eager) and
the profile (`fairway`'s patience); it replays the mixed trace with `fairway replay --url`, then,
on the same server once that replay has finished (no request in flight), the light tenant alone;
before each replay the server's prefix cache is reset and warmed up (benchmarks/fidelity.py's
`prepare_server`), so the two replays start from the same state. Then the server is stopped;
one server runs at a time.

`--time-scale auto` (the default with a profile) stretches arrivals by the preset's capacity over
the served engine's (`capacity_tps` at the step budget of the table), so the overload is 1.5 x
the tiny model's capacity here as it is 1.5 x the A6000's in the virtual replay (E6); a number
sets it directly. With a profile, the virtual replay of both traces (vLLM's real Scheduler,
priced by the same table, same KV blocks and step budget) is reported beside the live runs.

Reported per run and policy (warm-ups excluded): the light tenant's TTFT p50 / p99 mixed and
alone and the mixed / alone ratio, the heavy tenant's p50 / p99 (mixed), failed requests (no
first token; must be 0); per policy the median over runs, and fairway's light p99 beside fcfs's.
E6's goal for the virtual replay is light p99 mixed <= 1.2 x alone under `fairway`; this script
measures, it does not tune. Writes live_tenants.md and live_tenants.json (every number, updated
after each run) and every replay, server log and trace under OUT.

On a 2-core CPU with the model above the table gives 7,826 tokens/s at 2,048-token steps (time
scale 0.576); one server run (start ~30 s, mixed replay ~140-170 s while the heavy backlog
drains, light alone ~37 s) takes ~4 min, so 3 runs x 2 policies take ~23 min (`--max-wall-s`
stops early instead of overrunning).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e6_tenants  # noqa: E402
import fidelity  # noqa: E402

from fairway import supervisor  # noqa: E402
from fairway.replay import results as results_io  # noqa: E402
from fairway.replay.bench import (  # noqa: E402
    environment_info,
    load_trace_spec,
    new_out_dir,
    write_json,
)
from fairway.replay.results import ReplayResult  # noqa: E402
from fairway.traces.format import Trace, write_trace  # noqa: E402

NAME = "live_tenants"
PRESET = "tenants"
TENANTS = ("heavy", "light")
POLICIES = ("fairway", "fcfs")
CACHE_FRACTION = 1.5
#: Used when no profile is given: a 2-core CPU and the tiny model above (see the report).
FALLBACK_TIME_SCALE = 1.0
#: E6's goal (virtual replay): the light tenant's p99 mixed <= this x its p99 alone.
GOAL_RATIO = 1.2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--serve", required=True, metavar="MODEL_DIR", help="the tiny model (8k)")
    p.add_argument("--runs", type=int, default=3,
                   help="runs per policy (0: profile and virtual replay only)")
    p.add_argument("--policy", action="append", default=None,
                   help=f"policies (repeatable; default {', '.join(POLICIES)})")
    p.add_argument("--profile", default=None, metavar="PATH",
                   help="the served engine's table (`fairway profile`; fairway's patience, the "
                   "auto time scale and the virtual replay's prices)")
    p.add_argument("--reprofile", action="store_true",
                   help="measure the table first (as benchmarks/fidelity.py --reprofile) into "
                   "OUT/profile.json")
    p.add_argument("--profile-lengths", default="128,256,512,1024,2048,4096,7232",
                   metavar="N,N,...", help="--reprofile's prompt lengths")
    p.add_argument("--profile-repeats", type=int, default=3)
    p.add_argument("--time-scale", default=None, metavar="auto|X",
                   help="multiply arrival times (default: auto with a profile: the preset's "
                   f"capacity over the engine's; {FALLBACK_TIME_SCALE} without)")
    p.add_argument("--out", default=None, metavar="DIR")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="extra `fairway serve` argument (repeatable); default "
                   "--gpu-memory-utilization=0.15 unless one is given")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--block-size", type=int, default=fidelity.BLOCK_SIZE)
    p.add_argument("--num-blocks", type=int, default=None,
                   help=f"KV blocks (default: {CACHE_FRACTION} x the trace's reusable content)")
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--warmup", type=int, default=8,
                   help="short prompts before each replay (between two prefix-cache resets)")
    p.add_argument("--server-cpus", default=None, metavar="LIST")
    p.add_argument("--engine-cpus", default=None, metavar="LIST")
    p.add_argument("--client-cpus", default=None, metavar="LIST")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    p.add_argument("--max-wall-s", type=float, default=None, metavar="S",
                   help="start no further run (all its policies) once the runs done so far "
                   "suggest it would end after S seconds of wall time (fewer runs, said so)")
    args = p.parse_args(argv)
    if args.reprofile and args.profile:
        p.error("--profile and --reprofile exclude each other")
    if args.runs < 0:
        p.error("--runs must be >= 0")
    if not any(a.lstrip("-").replace("_", "-").startswith("gpu-memory-utilization")
               for a in args.serve_arg):
        args.serve_arg = ["--gpu-memory-utilization=0.15", *args.serve_arg]
    # What benchmarks/fidelity.py's helpers read from their namespace.
    args.cache_fraction = CACHE_FRACTION
    args.step_log = False
    return args


def light_only(trace: Trace) -> Trace:
    """The trace's light-tenant requests (its warm-ups included), header count fixed."""
    return e6_tenants.only(trace, lambda r: r.tenant == "light")


def time_scale(args: argparse.Namespace, trace: Trace) -> tuple[float, str]:
    """(factor, how it was chosen)."""
    if args.time_scale not in (None, "auto"):
        return float(args.time_scale), "given"
    if args.profile is None:
        if args.time_scale == "auto":
            raise SystemExit("--time-scale auto needs --profile or --reprofile")
        return FALLBACK_TIME_SCALE, "fallback (no profile)"
    from fairway.profiling.table import load as load_profile

    engine = load_profile(args.profile).capacity_tps(args.max_num_batched_tokens)
    preset = float(trace.header.capacity_tps)
    return round(preset / engine, 4), (f"auto: preset capacity {preset:.0f} / engine capacity "
                                       f"{engine:.0f} tokens/s at {args.max_num_batched_tokens}")


def replay(args: argparse.Namespace, url: str, trace_path: Path, scale: float, label: str,
           out_dir: Path) -> ReplayResult:
    """`fairway replay --url` of a trace file; the saved result."""
    command = fidelity.taskset(args.client_cpus, [
        sys.executable, "-m", "fairway.cli", "replay", "--url", url, "--trace", str(trace_path),
        "--time-scale", str(scale), "--label", label, "--vocab-size", str(args.vocab_size),
        "--min-success", "0", "--no-progress", "--out", str(out_dir),
    ])
    with out_dir.with_suffix(".log").open("w") as log:
        rc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    found = sorted((out_dir / "replays").glob("*.json"))
    if rc != 0 or len(found) != 1:
        raise RuntimeError(f"fairway replay exited {rc} ({len(found)} results); see "
                           f"{out_dir.with_suffix('.log')}")
    return results_io.load(found[0])


def tenant_stats(result: ReplayResult, tenant: str) -> dict[str, Any]:
    """Count, failures, TTFT p50 / p99 / max of one tenant's requests (warm-ups excluded)."""
    mine = [r for r in result.requests if r.tenant == tenant and r.phase != "warmup"]
    ttfts = np.array([r.ttft_s for r in mine if r.ttft_s is not None])
    return {
        "requests": len(mine),
        "failed": sum(r.ttft_s is None for r in mine),
        "p50_s": round(e6_tenants.pct(ttfts, 50), 4),
        "p99_s": round(e6_tenants.pct(ttfts, 99), 4),
        "max_s": round(float(ttfts.max()), 4) if len(ttfts) else None,
    }


def measure(mixed: ReplayResult, alone: ReplayResult) -> dict[str, Any]:
    """One run's numbers: light mixed / alone, heavy mixed, failures of both replays."""
    light_mixed, light_alone = tenant_stats(mixed, "light"), tenant_stats(alone, "light")
    return {
        "light_mixed": light_mixed,
        "light_alone": light_alone,
        "heavy_mixed": tenant_stats(mixed, "heavy"),
        "light_p50_ratio": round(light_mixed["p50_s"] / light_alone["p50_s"], 4),
        "light_p99_ratio": round(light_mixed["p99_s"] / light_alone["p99_s"], 4),
        "failed_mixed": mixed.n_errors,
        "failed_alone": alone.n_errors,
        "wall_s": {"mixed": round(mixed.wall_s, 1), "alone": round(alone.wall_s, 1)},
    }


def live_run(args: argparse.Namespace, policy: str, run: int, traces: dict[str, Path],
             scale: float, num_blocks: int, raw: Path) -> dict[str, Any]:
    """One server of `policy`: the mixed replay, then the light tenant alone on it."""
    command, serve_args = fidelity.serve_command(args, policy, num_blocks)
    serve_args += ["--fairway-option", f"tenants={json.dumps(list(TENANTS))}",
                   # the replay client names each request's tenant (fairway.trust)
                   "--fairway-option", "tenant_source=client"]
    stem = f"run{run}-{policy}"
    t0 = time.perf_counter()
    load_before = [round(x, 2) for x in os.getloadavg()]
    with supervisor.running_server(
        fidelity.taskset(args.server_cpus, command), serve_args,
        log_path=raw / f"serve-{stem}.log", port=args.port, env=fidelity.server_env(args),
        startup_timeout_s=args.startup_timeout_s, name=f"fairway serve --policy {policy}",
        say=lambda line: print(line, file=sys.stderr, flush=True),
    ) as server:
        startup_s = time.perf_counter() - t0
        model = fidelity.served_model(server.url)
        results = {}
        for kind in ("mixed", "alone"):
            fidelity.prepare_server(server.url, model, args.warmup, args.vocab_size)
            results[kind] = replay(args, server.url, traces[kind], scale, policy,
                                   raw / f"{stem}-{kind}")
            print(f"run {run} {policy} {kind}: {len(results[kind].requests)} requests, "
                  f"{results[kind].n_errors} failed, {results[kind].wall_s:.0f} s",
                  file=sys.stderr, flush=True)
    out = measure(results["mixed"], results["alone"])
    out |= {"run": run, "policy": policy, "startup_s": round(startup_s, 1),
            "server_wall_s": round(time.perf_counter() - t0, 1),
            "loadavg_before": load_before, "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    return out


def virtual_rows(args: argparse.Namespace, traces: dict[str, Trace], policies: list[str],
                 num_blocks: int) -> list[dict[str, Any]]:
    """The virtual replay of both (scaled) traces per policy, as the live servers are set up."""
    from fairway.policies import param_names
    from fairway.replay.sim import replay as sim_replay

    rows = []
    for policy in policies:
        params = {"profile": args.profile} if "profile" in param_names(policy) else None
        got = {
            kind: sim_replay(
                trace, policy, profile=args.profile, policy_params=params,
                num_blocks=num_blocks, block_size=args.block_size,
                max_num_batched_tokens=args.max_num_batched_tokens,
                max_num_seqs=args.max_num_seqs, fairway_options={"tenants": list(TENANTS)},
                trace_name=f"{PRESET}-quick-{kind}",
            )
            for kind, trace in traces.items()
        }
        rows.append({"policy": policy, **measure(got["mixed"], got["alone"])})
    return rows


def med(rows: list[dict[str, Any]], *path: str) -> float | None:
    values = []
    for row in rows:
        value: Any = row
        for key in path:
            value = value[key]
        values.append(value)
    return round(statistics.median(values), 4) if values else None


def summary(runs: list[dict[str, Any]], policies: list[str]) -> dict[str, Any]:
    """Per policy the medians over runs; fairway's light p99 (mixed, ratio) over fcfs's."""
    out: dict[str, Any] = {}
    for policy in policies:
        rows = [r for r in runs if r["policy"] == policy]
        if not rows:
            continue
        out[policy] = {
            "runs": len(rows),
            "light_p50_mixed_s": med(rows, "light_mixed", "p50_s"),
            "light_p50_alone_s": med(rows, "light_alone", "p50_s"),
            "light_p99_mixed_s": med(rows, "light_mixed", "p99_s"),
            "light_p99_alone_s": med(rows, "light_alone", "p99_s"),
            "light_p99_ratio": med(rows, "light_p99_ratio"),
            "light_p99_ratio_range": [min(r["light_p99_ratio"] for r in rows),
                                      max(r["light_p99_ratio"] for r in rows)],
            "heavy_p50_s": med(rows, "heavy_mixed", "p50_s"),
            "heavy_p99_s": med(rows, "heavy_mixed", "p99_s"),
            "failed": sum(r["failed_mixed"] + r["failed_alone"] for r in rows),
        }
    if "fairway" in out and "fcfs" in out:
        fw, fc = out["fairway"], out["fcfs"]
        out["fairway_vs_fcfs"] = {
            "light_p99_mixed": round(fw["light_p99_mixed_s"] / fc["light_p99_mixed_s"], 4),
            "light_p99_ratio": round(fw["light_p99_ratio"] / fc["light_p99_ratio"], 4),
            "heavy_p99": round(fw["heavy_p99_s"] / fc["heavy_p99_s"], 4),
            "heavy_p50": round(fw["heavy_p50_s"] / fc["heavy_p50_s"], 4),
        }
    return out


def _row(label: str, policy: str, r: dict[str, Any]) -> str:
    lm, la, hm = r["light_mixed"], r["light_alone"], r["heavy_mixed"]
    return (f"| {label} | {policy} | {lm['p50_s']:.2f} | {la['p50_s']:.2f} | "
            f"{r['light_p50_ratio']:.2f} | {lm['p99_s']:.2f} | {la['p99_s']:.2f} | "
            f"**{r['light_p99_ratio']:.2f}** | {hm['p50_s']:.2f} | {hm['p99_s']:.2f} | "
            f"{r['failed_mixed']} + {r['failed_alone']} |")


def markdown(report: dict[str, Any]) -> str:
    head = ("| run | policy | light p50 mixed (s) | light p50 alone (s) | p50 ratio | "
            "light p99 mixed (s) | light p99 alone (s) | p99 ratio | heavy p50 (s) | "
            "heavy p99 (s) | failed (mixed + alone) |\n" + "|---" * 11 + "|\n")
    lines = [head.rstrip("\n")]
    lines += [_row(str(r["run"]), r["policy"], r) for r in report["runs"]]
    lines += [_row("virtual", r["policy"], r) for r in report["virtual"]]
    text = "\n".join(lines) + "\n\n"
    s = report["summary"]
    if any(p in s for p in report["policies"]):
        text += ("| policy | runs | light p99 mixed (s) | light p99 alone (s) | p99 ratio "
                 "(median; range) | heavy p50 (s) | heavy p99 (s) | failed |\n"
                 "|---|---|---|---|---|---|---|---|\n")
        for p in report["policies"]:
            if p not in s:
                continue
            v = s[p]
            lo, hi = v["light_p99_ratio_range"]
            text += (f"| {p} | {v['runs']} | {v['light_p99_mixed_s']:.2f} | "
                     f"{v['light_p99_alone_s']:.2f} | {v['light_p99_ratio']:.2f} ({lo:.2f}-"
                     f"{hi:.2f}) | {v['heavy_p50_s']:.2f} | {v['heavy_p99_s']:.2f} | "
                     f"{v['failed']} |\n")
        if "fairway_vs_fcfs" in s:
            c = s["fairway_vs_fcfs"]
            text += (f"\nfairway / fcfs (medians over runs): light p99 mixed "
                     f"{c['light_p99_mixed']:.2f}, light p99 ratio {c['light_p99_ratio']:.2f}, "
                     f"heavy p50 {c['heavy_p50']:.2f}, heavy p99 {c['heavy_p99']:.2f}. "
                     f"E6's goal (virtual): fairway's light p99 ratio <= {GOAL_RATIO}: live "
                     f"{s['fairway']['light_p99_ratio']:.2f}.\n")
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    policies = args.policy or list(POLICIES)
    started = time.perf_counter()
    out_dir = new_out_dir(args.out, "live-tenants")
    args.out_dir = str(out_dir)
    raw = out_dir / "replays"
    raw.mkdir(parents=True, exist_ok=True)
    mixed = load_trace_spec(PRESET, quick=True)
    trace_dir = out_dir / "traces"
    trace_dir.mkdir(exist_ok=True)
    plain = {"mixed": mixed, "alone": light_only(mixed)}
    paths = {k: trace_dir / f"{PRESET}-quick-{k}.jsonl" for k in plain}
    for kind, trace in plain.items():
        write_trace(trace, paths[kind])
    if args.reprofile:
        t0 = time.perf_counter()
        args.profile = fidelity.reprofile(args, out_dir)
        print(f"profiled in {time.perf_counter() - t0:.0f} s: {args.profile}", file=sys.stderr)
    scale, how = time_scale(args, mixed)
    scaled = {k: fidelity.scaled(t, scale) for k, t in plain.items()}
    sizing = fidelity.kv_sizing(args, scaled["mixed"])
    num_blocks = sizing.num_blocks
    virtual = virtual_rows(args, scaled, policies, num_blocks) if args.profile else []
    report: dict[str, Any] = {
        "args": vars(args), "environment": environment_info(),
        "policies": policies, "time_scale": scale, "time_scale_how": how,
        "kv_cache": sizing.to_json(), "traces": {k: str(p) for k, p in paths.items()},
        "requests": {k: len(t) for k, t in plain.items()},
        "alone_on": "the same server as the mixed replay, after it finished (prefix cache reset "
        "and warmed up before each replay)",
        "virtual": virtual, "runs": [], "summary": {},
    }

    def write() -> None:
        report["summary"] = summary(report["runs"], policies)
        report["wall_s"] = round(time.perf_counter() - started, 1)
        env = report["environment"]
        header = (f"_live_tenants: {env['date']}, {env['cpu_count']}-core {env['machine']} CPU, "
                  f"{env['vllm']}; quick `{PRESET}` preset ({len(plain['mixed'])} requests; "
                  f"light alone: {len(plain['alone'])}), time scale {scale} ({how}), "
                  f"{num_blocks} KV blocks of {args.block_size}, steps of "
                  f"{args.max_num_batched_tokens} tokens, profile {args.profile or 'none'}; "
                  f"tenants {list(TENANTS)} on every server; light alone on {report['alone_on']}; "
                  f"{len(report['runs'])} server run(s)"
                  f"{' (stopped ' + report['stopped'] + ')' if 'stopped' in report else ''}; "
                  f"{report['wall_s']:.0f} s wall. "
                  "TTFT over non-warm-up requests._\n\n")
        (out_dir / f"{NAME}.md").write_text(header + markdown(report), encoding="utf-8")
        write_json(out_dir / f"{NAME}.json", report)

    write()
    for run in range(1, args.runs + 1):
        done = report["runs"]
        if args.max_wall_s is not None and done:
            per_run = max(r["server_wall_s"] for r in done) * len(policies)
            if time.perf_counter() - started + per_run > args.max_wall_s:
                report["stopped"] = (f"after {run - 1} of {args.runs} runs: another run "
                                     f"(~{per_run:.0f} s) would pass --max-wall-s "
                                     f"{args.max_wall_s:.0f}")
                print(f"live_tenants: stopped {report['stopped']}", file=sys.stderr)
                break
        for policy in policies:
            report["runs"].append(live_run(args, policy, run, paths, scale, num_blocks, raw))
            write()
    write()
    print((out_dir / f"{NAME}.md").read_text(encoding="utf-8"))
    print(f"wrote {out_dir}", file=sys.stderr)
    failed = sum(r["failed_mixed"] + r["failed_alone"] for r in report["runs"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
