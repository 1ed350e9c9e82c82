"""Live: vLLM's router (`vllm-router`) in front of two `fairway serve` nodes, driven by vLLM's own
client (`vllm bench serve`).

    FAIRWAY_EXTRAS=router ./scripts/setup.sh        # once: the `router` extra (vllm-router)
    .venv/bin/fairway tiny-model /tmp/tiny-router --max-len 8192 --hidden 256 --layers 2 \
        --dtype float32
    .venv/bin/python benchmarks/live_router.py --serve /tmp/tiny-router --out results/live-router

Where a request runs is the router's choice, in which order the requests that landed on a node
start is Fairway's: this measures the two together. For each node policy (`fairway`, `fcfs`:
both nodes the same) two `fairway serve` nodes of the tiny model (served in float32) start
side by side, each with its model worker pinned to its
own core when the machine has two (`VLLM_CPU_OMP_THREADS_BIND`), and for each run and router
policy (`cache_aware`, `round_robin`, `kv_aware`; runs interleaved) a fresh
`vllm-router --worker-urls NODE_A NODE_B --policy P` is started in front of them
(its routing state starts empty, as the nodes' caches do: before each run both nodes' prefix
caches are reset, warmed up with short prompts and reset again: benchmarks/fidelity.py's
`prepare_server`), the trace is replayed through it by `vllm bench serve --dataset-name
timed_trace` (benchmarks/fidelity.py's `vllm_bench_run`, same prompts every run:
PYTHONHASHSEED=0), and each node's `/metrics` is read before and after: requests per node
(`vllm:request_success_total`), the cache hit share (`vllm:prefix_cache_hits_total` over
`..._queries_total`, both nodes) and `fairway:requests_placed_total` (the node's scheduler
ordered them).

The trace (`build`): hot documents, each first asked at t ~ 0 (a burst, so that a least-loaded
choice spreads them), then hits (a document + new tokens) at a steady rate, a random document
each, and misses (long prompts of their own) every few seconds. A cache-aware router sends a
document's hits to the node that computed it; round robin makes both nodes compute every
document and, with KV blocks for about half of the documents plus a miss per node (the default
`--num-blocks`), evicts them in turn.

With `kv_aware` among the router policies (the default) the nodes publish vLLM's KV events over
ZMQ (`--kv-events-config`, one endpoint per node, PYTHONHASHSEED=0; for every cell, so that the
cells differ only by the router) and that router subscribes to them (`--kv-event-source
NODE_URL=tcp://127.0.0.1:PORT`, `--kv-event-block-size 32`). After each run the router's own
series are read (`vllm_router_prefix_routing_decisions_total`,
`vllm_router_kv_placement_lookups_total`: whether its choices used the events).

Table (live_router.md, and every number in live_router.json): per router x node policy, TTFT
median / p90 / p99 over all requests (the median of the runs, with their range), hits' and
misses' p99, failed requests, requests per node (median of the runs) and the cache hit share.
The trace is 268 requests over 30 s: six 1,536-token documents, hits at 8/s (+64 tokens each),
4,096-token misses every second; 384 KV blocks of 32 tokens per node. One run is 53-95 s (the
client's start included), the whole grid (3 routers x 2 node policies x 3 runs, the nodes started
twice) took 1,459 s on the 2-core VM shared with other jobs (docs/deployment.md has the table).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fidelity  # noqa: E402

from fairway import supervisor  # noqa: E402
from fairway.inspection import SERIES  # noqa: E402
from fairway.inspection_scrape import Samples, delta, fetch_metrics, metrics_url, parse  # noqa: E402
from fairway.replay.bench import environment_info, new_out_dir, write_json  # noqa: E402
from fairway.replay.fidelity import Spread  # noqa: E402
from fairway.replay.results import ReplayResult  # noqa: E402
from fairway.replay.summary import ttft_stats  # noqa: E402
from fairway.traces.export import export_trace  # noqa: E402
from fairway.traces.format import Trace, TraceHeader, make_request  # noqa: E402

NAME = "live_router"
ROUTER_POLICIES = ("cache_aware", "round_robin", "kv_aware")
NODE_POLICIES = ("fairway", "fcfs")
#: The router's HTTP server starts in about a second; its first check of the workers is at once.
ROUTER_STARTUP_TIMEOUT_S = 60.0
#: Engine settings of every node (blocks of 32: vLLM's CPU attention; float32: its CPU kernels
#: emulate bfloat16 without AVX-512, ~3 x slower on the 2-core VM; dummy weights: the output is
#: noise either way, the prefill cost is real).
NODE_ARGS = ("--block-size", str(fidelity.BLOCK_SIZE), "--max-num-seqs", "64", "--dtype",
             "float32", "--load-format", "dummy", "--enforce-eager")
#: vLLM's default `--gpu-memory-utilization` (0.9 of host memory on CPU) is far too much twice.
DEFAULT_MEMORY_ARG = "--gpu-memory-utilization=0.15"


def build(docs: int = 6, doc_tokens: int = 1536, hit_tokens: int = 64, hits_per_s: float = 8.0,
          duration_s: float = 30.0, miss_tokens: int = 4096, miss_every_s: float = 1.0,
          seed: int = 0) -> Trace:
    """The routing trace (see the module docstring); phases `doc` (a document's first request),
    `hit` and `miss`."""
    rng = random.Random(seed)
    requests = [make_request(f"doc-{d}", 0.05 * d, [(f"lr-doc{d}", doc_tokens),
                                                    (f"lr-first{d}", hit_tokens)], phase="doc")
                for d in range(docs)]
    t, i = 1.0, 0
    while t < duration_s:
        d = rng.randrange(docs)
        requests.append(make_request(f"hit-{i:03d}", t, [(f"lr-doc{d}", doc_tokens),
                                                         (f"lr-h{i}", hit_tokens)], phase="hit"))
        i += 1
        t += 1.0 / hits_per_s
    k, at = 0, miss_every_s / 2
    while at < duration_s:
        requests.append(make_request(f"miss-{k:02d}", at + 0.001, [(f"lr-m{k}", miss_tokens)],
                                     phase="miss"))
        k += 1
        at += miss_every_s
    requests.sort(key=lambda r: (r.arrival_s, r.request_id))
    params = {"docs": docs, "doc_tokens": doc_tokens, "hit_tokens": hit_tokens,
              "hits_per_s": hits_per_s, "duration_s": duration_s, "miss_tokens": miss_tokens,
              "miss_every_s": miss_every_s}
    header = TraceHeader(family="live-router", seed=seed, shape=None, params=params,
                         num_requests=len(requests), duration_s=duration_s)
    return Trace(header, requests)


def router_binary() -> Path | None:
    """The `vllm-router` console script of this environment (the `router` extra), or None."""
    path = Path(sys.executable).with_name("vllm-router")
    return path if path.exists() else None


def engine_cpus(count: int) -> list[str | None]:
    """Per node, the core its model worker is bound to: one each while cores last (None: vLLM's
    automatic binding, which would put two nodes' workers on the same core)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < count:
        return [None] * count
    return [str(c) for c in cores[:count]]


def kv_events_arg(port: int) -> str:
    """`--kv-events-config` of a node publishing its KV events on `port` (ZMQ PUB, bound)."""
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"}
    return "--kv-events-config=" + json.dumps(config, separators=(",", ":"))


def node_env(cpu: str | None, kv_events: bool) -> dict[str, str]:
    """A node's environment: fidelity's (dev endpoints for the cache reset, long keep-alive),
    its worker's core, and what vLLM's KV events need to be computable by the router."""
    env = {**os.environ, **fidelity.SERVER_ENV, "HF_HUB_OFFLINE": "1"}
    env = {k: v for k, v in env.items() if not k.startswith("FAIRWAY_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # `fairway serve` makes a fresh one
    if cpu is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu
    if kv_events:
        env["PYTHONHASHSEED"] = "0"  # vLLM's block hashes start from a seed derived from it
    return env


@contextlib.contextmanager
def running_nodes(model: str, policy: str, serve_args: Sequence[str], log_dir: Path, *,
                  count: int = 2, kv_events: bool = False,
                  startup_timeout_s: float = 600.0) -> Iterator[list[dict[str, Any]]]:
    """`count` `fairway serve MODEL --policy POLICY` nodes started together (their start-ups
    overlap); yields [{"server", "kv_endpoint"}] once all answer /health, stops all after.

    Raises:
        supervisor.ServerStartError: a node exited or did not answer in time (with its log).
    """
    command = [sys.executable, "-m", "fairway.cli", "serve", model]
    nodes: list[dict[str, Any]] = []
    try:
        for i, cpu in enumerate(engine_cpus(count)):
            args = ["--policy", policy, *NODE_ARGS, *serve_args]
            kv_port = supervisor.free_port() if kv_events else None
            if kv_port is not None:
                args.append(kv_events_arg(kv_port))
            server = supervisor.start(command, args, log_path=log_dir / f"node{i}-{policy}.log",
                                      env=node_env(cpu, kv_events))
            nodes.append({"server": server, "cpu": cpu,
                          "kv_endpoint": kv_port and f"tcp://127.0.0.1:{kv_port}"})
        for i, node in enumerate(nodes):
            supervisor.wait_healthy(node["server"], startup_timeout_s,
                                    name=f"node {i} (fairway serve --policy {policy})")
        yield nodes
    finally:
        for node in nodes:
            supervisor.stop(node["server"])


#: The router's own series read after a run (summed by their label `outcome` / `result`).
ROUTER_SERIES = {"decisions": ("vllm_router_prefix_routing_decisions_total", "outcome"),
                 "kv_lookups": ("vllm_router_kv_placement_lookups_total", "result")}


def router_args(policy: str, nodes: Sequence[dict[str, Any]], model: str,
                prometheus_port: int) -> list[str]:
    """`vllm-router` arguments after `--host/--port`: the nodes, the policy and its inputs.

    The workers are checked every second at start-up (the default waits 30 s between checks).
    """
    urls = [n["server"].url for n in nodes]
    args = ["--worker-urls", *urls, "--policy", policy,
            "--prometheus-port", str(prometheus_port), "--worker-startup-check-interval", "1"]
    if policy == "kv_aware":
        for url, node in zip(urls, nodes, strict=True):
            args += ["--kv-event-source", f"{url}={node['kv_endpoint']}"]
        args += ["--kv-event-block-size", str(fidelity.BLOCK_SIZE), "--kv-event-model", model]
    return args


@contextlib.contextmanager
def running_router(policy: str, nodes: Sequence[dict[str, Any]], model: str,
                   log_path: Path) -> Iterator[tuple[supervisor.ServerProcess, str]]:
    """A `vllm-router` in front of `nodes`, ready (its /health answers), and the URL of its
    Prometheus series; stopped after."""
    binary = router_binary()
    if binary is None:
        raise RuntimeError("vllm-router is not installed: FAIRWAY_EXTRAS=router "
                           "./scripts/setup.sh (or pip install 'vllm-fairway[router]')")
    port = supervisor.free_port()
    with supervisor.running_server(
        [str(binary)], router_args(policy, nodes, model, port), log_path=log_path,
        startup_timeout_s=ROUTER_STARTUP_TIMEOUT_S, name=f"vllm-router --policy {policy}",
    ) as router:
        yield router, f"http://127.0.0.1:{port}/metrics"


def router_counts(metrics: str) -> dict[str, dict[str, float]]:
    """The router's routing decisions and KV lookups by outcome (`ROUTER_SERIES`)."""
    samples = parse(fetch_metrics(metrics))
    out: dict[str, dict[str, float]] = {}
    for key, (name, label) in ROUTER_SERIES.items():
        for labels, value in samples.get(name, ()):
            kind = labels.get(label, "?")
            out.setdefault(key, {})[kind] = out.get(key, {}).get(kind, 0.0) + value
    return out


def scrape(nodes: Sequence[dict[str, Any]]) -> list[Samples]:
    """Each node's /metrics, parsed."""
    return [parse(fetch_metrics(metrics_url(n["server"].url))) for n in nodes]


def node_counts(before: Samples, after: Samples) -> dict[str, float]:
    """What one node did between two scrapes: requests, cache tokens, Fairway's placements."""
    got = {"requests": delta(before, after, SERIES["success"]),
           "hit_tokens": delta(before, after, SERIES["hits"]),
           "query_tokens": delta(before, after, SERIES["queries"]),
           "fairway_placed": delta(before, after, SERIES["placed"])}
    return {k: (v or 0.0) for k, v in got.items()}


def ttfts(result: ReplayResult, phase: str | None = None) -> dict[str, float | None]:
    """TTFT median / p90 / p99 of the answered requests (of `phase`, or all)."""
    values = [r.ttft_s for r in result.requests
              if r.ttft_s is not None and (phase is None or r.phase == phase)]
    median, p90, p99, _ = ttft_stats(values)
    return {"median_s": median, "p90_s": p90, "p99_s": p99}


def measure(result: ReplayResult, counts: list[dict[str, float]]) -> dict[str, Any]:
    """One run's row: TTFTs (all, hits, misses), failures, per-node counts, the hit share."""
    hits = sum(c["hit_tokens"] for c in counts)
    queries = sum(c["query_tokens"] for c in counts)
    return {
        "requests": len(result.requests),
        "failed": sum(r.ttft_s is None for r in result.requests),
        "errors": sorted({r.error for r in result.requests if r.error})[:5],
        "ttft": {"all": ttfts(result), "hit": ttfts(result, "hit"),
                 "miss": ttfts(result, "miss")},
        "per_node": counts,
        "cache_hit_share": hits / queries if queries else None,
    }


def one_run(args: argparse.Namespace, router_policy: str, node_policy: str, run: int,
            nodes: list[dict[str, Any]], model: str, trace: Trace, export: Path,
            raw: Path) -> dict[str, Any]:
    """Reset and warm both nodes, start a router, replay through it with `vllm bench serve`."""
    t0 = time.perf_counter()
    for node in nodes:
        fidelity.prepare_server(node["server"].url, model, args.warmup, args.vocab_size)
    stem = f"{router_policy}--{node_policy}--run{run}"
    row: dict[str, Any] = {"router": router_policy, "node_policy": node_policy, "run": run}
    with running_router(router_policy, nodes, model,
                        raw / f"router-{stem}.log") as (router, router_metrics):
        before = scrape(nodes)
        label = f"{router_policy}+{node_policy}"
        result = fidelity.vllm_bench_run(args, trace, NAME, label, router.url, model, export,
                                         raw / f"{stem}.json")
        after = scrape(nodes)
        row["router_argv"] = router.argv
        row["router_series"] = router_counts(router_metrics)
    row |= measure(result, [node_counts(b, a) for b, a in zip(before, after, strict=True)])
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    print(f"{router_policy} x {node_policy} run {run}: {row['failed']} failed, requests per node "
          f"{[c['requests'] for c in row['per_node']]}, p99 {row['ttft']['all']['p99_s']}",
          file=sys.stderr, flush=True)
    return row


def cell(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One router x node policy over its runs: each statistic's median and range."""
    out: dict[str, Any] = {"runs": len(rows), "failed": sum(r["failed"] for r in rows)}
    for phase in ("all", "hit", "miss"):
        for stat in ("median_s", "p90_s", "p99_s"):
            s = Spread.of(r["ttft"][phase][stat] for r in rows)
            out[f"{phase}_{stat}"] = {"median": s.median, "lo": s.lo, "hi": s.hi}
    nodes = len(rows[0]["per_node"])
    out["requests_per_node"] = [Spread.of(r["per_node"][i]["requests"] for r in rows).median
                                for i in range(nodes)]
    out["cache_hit_share"] = Spread.of(r["cache_hit_share"] for r in rows).median
    out["router_series"] = {
        key: {kind: Spread.of(r["router_series"].get(key, {}).get(kind) for r in rows).median
              for kind in sorted({k for r in rows for k in r["router_series"].get(key, {})})}
        for key in ROUTER_SERIES}
    return out


def _spread(v: dict[str, float | None]) -> str:
    if v["median"] is None:
        return "-"
    return f"{v['median']:.2f} ({v['lo']:.2f}-{v['hi']:.2f})"


def markdown(cells: dict[str, dict[str, Any]], notes: Sequence[str]) -> str:
    """The table: one row per router x node policy."""
    lines = ["| router | nodes | runs | TTFT median s | p90 s | p99 s | hits p99 s | "
             "misses p99 s | failed | requests per node | cache hit share |",
             "|---" * 11 + "|"]
    for key, c in cells.items():
        router, nodes = key.split(" x ")
        per_node = " / ".join(f"{n:.0f}" if n is not None else "-"
                              for n in c["requests_per_node"])
        share = "-" if c["cache_hit_share"] is None else f"{c['cache_hit_share']:.2f}"
        lines.append(
            f"| {router} | {nodes} | {c['runs']} | {_spread(c['all_median_s'])} | "
            f"{_spread(c['all_p90_s'])} | {_spread(c['all_p99_s'])} | "
            f"{_spread(c['hit_p99_s'])} | {_spread(c['miss_p99_s'])} | {c['failed']} | "
            f"{per_node} | {share} |")
    lines.append("\nThe router's own series per run (median of the runs): routing decisions "
                 "(`vllm_router_prefix_routing_decisions_total` by outcome) and KV lookups "
                 "(`vllm_router_kv_placement_lookups_total` by result, kv_aware only):\n")
    for key, c in cells.items():
        series = "; ".join(f"{name}: " + ", ".join(f"{k} {v:.0f}" for k, v in kinds.items()
                                                    if v is not None)
                           for name, kinds in c["router_series"].items() if kinds)
        lines.append(f"- {key}: {series or 'none'}")
    return "\n".join(lines) + "\n" + "".join(f"\n{n}\n" for n in notes)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--serve", required=True, metavar="MODEL_DIR", help="the tiny model (8k)")
    p.add_argument("--runs", type=int, default=3, help="runs per router x node policy")
    p.add_argument("--router-policy", action="append", default=None,
                   help=f"repeatable; default {', '.join(ROUTER_POLICIES)}")
    p.add_argument("--node-policy", action="append", default=None,
                   help=f"repeatable; default {', '.join(NODE_POLICIES)}")
    p.add_argument("--out", default=None, metavar="DIR")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help=f"extra `fairway serve` argument (repeatable; default {DEFAULT_MEMORY_ARG} "
                   "unless one is given)")
    p.add_argument("--num-blocks", type=int, default=384,
                   help="KV blocks of 32 tokens per node (default 384: half the documents "
                   "and a miss)")
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply the trace's arrival times (0.5 = twice the rate)")
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--warmup", type=int, default=4, help="short prompts per node before a run")
    p.add_argument("--client-cpus", default=None, metavar="LIST",
                   help="pin `vllm bench serve` (taskset list)")
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    if not any(a.lstrip("-").replace("_", "-").startswith("gpu-memory-utilization")
               for a in args.serve_arg):
        args.serve_arg = [DEFAULT_MEMORY_ARG, *args.serve_arg]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if router_binary() is None:
        print("live_router: vllm-router is not installed (FAIRWAY_EXTRAS=router "
              "./scripts/setup.sh)", file=sys.stderr)
        return 2
    os.environ["PYTHONHASHSEED"] = "0"  # `vllm bench serve` draws a chunk's tokens by hash()
    # Started in the background (`cmd &`), Python inherits SIGINT ignored: restore Ctrl-C's
    # KeyboardInterrupt so that an interrupted run still stops its nodes and router.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    routers = args.router_policy or list(ROUTER_POLICIES)
    node_policies = args.node_policy or list(NODE_POLICIES)
    started = time.perf_counter()
    out_dir = new_out_dir(args.out, "live-router")
    raw = out_dir / "replays"
    raw.mkdir(parents=True, exist_ok=True)
    trace = fidelity.scaled(build(), args.time_scale)
    export = raw / "trace-vllm-timed.jsonl"
    export_trace(trace, export, "vllm-timed-trace", fidelity.EXPORT_CHUNK_TOKENS)
    serve_args = ["--num-gpu-blocks-override", str(args.num_blocks),
                  "--max-num-batched-tokens", str(args.max_num_batched_tokens),
                  "--max-model-len", str(args.max_model_len), *args.serve_arg]
    kv_events = "kv_aware" in routers
    report: dict[str, Any] = {
        "args": vars(args), "environment": environment_info(), "trace": dict(trace.header.params),
        "requests": len(trace), "node_args": [*NODE_ARGS, *serve_args],
        "kv_events": kv_events, "runs": [], "cells": {}, "failures": [],
    }

    def write() -> None:
        for router in routers:
            for policy in node_policies:
                rows = [r for r in report["runs"]
                        if r["router"] == router and r["node_policy"] == policy]
                if rows:
                    report["cells"][f"{router} x {policy}"] = cell(rows)
        report["wall_s"] = round(time.perf_counter() - started, 1)
        env = report["environment"]
        header = (f"_live_router: {env['date']}, {env['cpu_count']}-core {env['machine']} CPU, "
                  f"{env['vllm']}; two `fairway serve` nodes behind vllm-router, "
                  f"{len(trace)} requests over {trace.header.duration_s:g} s x time scale "
                  f"{args.time_scale:g}, {args.num_blocks} KV blocks of 32 tokens per node, "
                  f"steps of {args.max_num_batched_tokens} tokens; {report['wall_s']:.0f} s "
                  "wall._\n\n")
        notes = [f"{f['cell']}: {f['error']}" for f in report["failures"]]
        (out_dir / f"{NAME}.md").write_text(header + markdown(report["cells"], notes),
                                            encoding="utf-8")
        write_json(out_dir / f"{NAME}.json", report)

    for policy in node_policies:
        with running_nodes(args.serve, policy, serve_args, raw, kv_events=kv_events,
                           startup_timeout_s=args.startup_timeout_s) as nodes:
            report.setdefault("nodes", {})[policy] = [
                {"url": n["server"].url, "cpu": n["cpu"], "kv_endpoint": n["kv_endpoint"],
                 "argv": n["server"].argv} for n in nodes]
            for run in range(1, args.runs + 1):
                for router in routers:
                    try:
                        report["runs"].append(one_run(args, router, policy, run, nodes,
                                                      args.serve, trace, export, raw))
                    except (RuntimeError, supervisor.ServerStartError) as exc:
                        report["failures"].append({"cell": f"{router} x {policy}",
                                                   "run": run, "error": str(exc)[-2000:]})
                        print(f"live_router: {router} x {policy} run {run}: {exc}",
                              file=sys.stderr)
                    write()
    write()
    print((out_dir / f"{NAME}.md").read_text(encoding="utf-8"))
    print(f"wrote {out_dir}", file=sys.stderr)
    return 1 if report["failures"] or any(r["failed"] for r in report["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
