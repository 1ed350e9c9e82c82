"""`fairway bench` (virtual-clock replay of traces x policies) and `fairway replay` (live, HTTP).

Thin shells: they parse flags into `fairway.replay.bench.BenchConfig` / `live.run_live` arguments
and print where the results went. Heavy modules (vLLM, aiohttp, matplotlib) load in the handlers.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from typing import Any

from fairway.cli.argtypes import positive_int

_BENCH_HELP = (
    "Replay traces under scheduling policies through vLLM's real scheduler on a virtual clock "
    "(no GPU, no model): per policy and phase TTFT median/p90/p99/max, the six targets and "
    "starvation flags, as Markdown, JSON and plots. With no arguments: the SEC spike traces "
    "sec-a and sec-b under every registered policy."
)


_OPEN_LOOP_HELP = (
    "keep the recorded arrivals of a trace whose requests have parents; default: closed loop "
    "(a session turn is released its think_s after its parent's first token, or after its "
    "parent's failure; requests without a parent always keep their arrival)"
)


def register(subparsers: Any) -> None:
    """Add the `bench` and `replay` subcommands to the `fairway` parser."""
    from fairway.cli import HelpFormatter
    from fairway.replay.sweep import DEFAULT_WORKERS

    bench = subparsers.add_parser("bench", help="virtual-clock replay of traces x policies",
                                  description=_BENCH_HELP, formatter_class=HelpFormatter,
                                  epilog=_policy_params_help)
    bench.add_argument("--trace", action="append", default=None, metavar="FILE|PRESET",
                       help="trace file or preset (repeatable; default: sec-a and sec-b); "
                       "see `fairway trace list`")
    bench.add_argument("--policy", action="append", default=None, metavar="NAME",
                       help="policy (repeatable; default: every registered policy)")
    bench.add_argument("--policy-arg", action="append", default=[],
                       metavar="[POLICY.]KEY=VALUE",
                       help="a policy parameter (repeatable): fast_weight=2 sets it for every "
                       "chosen policy that has it, fairway.fast_weight=2 for one; see below. "
                       "FAIRWAY_* variables are ignored (they configure a server)")
    bench.add_argument("--profile", default=None, metavar="PATH_OR_NAME",
                       help="prefill-time table of the simulated GPU (cost model and the "
                       "policies' patience); default: the shipped A6000 / Llama-3.1-8B estimate")
    bench.add_argument("--cache-fraction", type=float, default=None,
                       help="KV cache size as a share of each trace's reusable content "
                       "(default 0.3, engine_sizing.DEFAULT_CACHE_FRACTION; never below the "
                       "largest prompt plus a working set)")
    bench.add_argument("--num-blocks", type=int, default=None,
                       help="KV cache size in blocks of 16 tokens (overrides --cache-fraction; "
                       "must hold each trace's largest request)")
    bench.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                       metavar="N",
                       help="the engine's token budget per step (chunked prefill), as vLLM's "
                       "flag of that name (default 2048, engine_sizing.DEFAULT_BATCHED_TOKENS, "
                       "vLLM's on a GPU server; long-context servers run larger budgets: 8192 "
                       "for the -long presets)")
    bench.add_argument("--max-num-seqs", type=positive_int, default=None, metavar="N",
                       help="the engine's limit on running requests, as vLLM's flag of that "
                       "name (default 256, engine_sizing.DEFAULT_MAX_NUM_SEQS)")
    bench.add_argument("--kv-offloading-size", type=_positive_float, default=None,
                       metavar="GiB", dest="kv_offloading_size",
                       help="a CPU KV offload tier of this many GiB, as vLLM's flag of that "
                       "name: vLLM's OffloadingConnector with its own scheduler half (hits, "
                       "loads, stores, flushes), the worker's copies timed by the profile's "
                       "load cost (host-device rates and KV bytes per token: an estimate for "
                       "the profile's GPU class unless the profile has measured figures); "
                       "default: no tier")
    bench.add_argument("--open-loop", action="store_true", help=_OPEN_LOOP_HELP)
    fleet = bench.add_argument_group(
        "fleet replay", "many prefill nodes behind a router (each node: the engine above, its "
        "own KV cache, its own policy instance), on one virtual clock; writes fleet.md and "
        "fleet.json (per trace, router and policy)")
    fleet.add_argument("--nodes", type=positive_int, default=None, metavar="N",
                       help="replay on N nodes behind --router; each --trace preset is built at "
                       "N x one node's capacity x --load")
    fleet.add_argument("--router", action="append", default=None, metavar="NAME",
                       help="the router in front of the nodes (repeatable: every router x "
                       "policy x load is replayed); needs --nodes; one of: "
                       f"{', '.join(_router_names())}")
    fleet.add_argument("--load", action="append", type=_positive_float, default=None,
                       metavar="F", help="each node's load as a multiple of its capacity "
                       "(repeatable; default 1.0); needs --nodes")
    fleet.add_argument("--metrics-delay-s", type=_non_negative_float, default=None,
                       metavar="S", help="how old the load figures a router acts on are "
                       f"(default {_default_signals().metrics_delay_s:g}); needs --nodes")
    fleet.add_argument("--kv-event-delay-s", type=_non_negative_float, default=None,
                       metavar="S", help="how late the nodes' KV events reach the router "
                       f"(default {_default_signals().kv_event_delay_s:g}); needs --nodes")
    bench.add_argument("--out", default=None, metavar="DIR",
                       help="output directory (default results/bench-<timestamp>; an existing "
                       "non-empty one gets a -2, -3, ... suffix, never overwritten)")
    bench.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                       help="local worker processes (default %(default)s; 0 = in this process)")
    bench.add_argument("--ray", default=None, metavar="ADDRESS",
                       help="run the replays as Ray tasks: a cluster address (ray://host:10001, "
                       "auto) or `local` to start Ray here; needs pip install 'vllm-fairway[ray]'")
    bench.add_argument("--quick", action="store_true",
                       help="shorten preset traces to a quarter of their phases (smoke tests)")
    bench.add_argument("--trace-cache", default=None, metavar="DIR",
                       help="reuse preset traces built earlier in DIR (and save new ones there)")
    bench.add_argument("--fresh-processes", action="store_true",
                       help="a new worker process for every replay (slower; isolation checks)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bars")
    bench.set_defaults(handler=_bench)

    replay = subparsers.add_parser(
        "replay", help="live replay of a trace against an OpenAI-compatible server",
        description="Send a trace's requests at their timestamps to a running server "
        "(`fairway serve`, `vllm serve`, ...) and report TTFT like `fairway bench`; a session "
        "turn (a request whose tags name a parent and a think_s) is sent its think time after "
        "its parent's first streamed chunk (closed loop) unless --open-loop. Before "
        "sending, the server's model, max_model_len and (vLLM) vocabulary are checked against "
        "the trace; during the replay GET /health is probed every few seconds, and a server that "
        "stops answering ends the replay at once. Exit status: 0 when at least --min-success of "
        "the requests got a first token, 1 when fewer did or the server stopped answering (the "
        "report is still written; the first causes are printed), 2 for bad arguments or a "
        "server that cannot serve the trace.",
    )
    replay.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    replay.add_argument("--trace", required=True, metavar="FILE|PRESET",
                        help="trace file or preset")
    replay.add_argument("--time-scale", type=float, default=1.0,
                        help="multiply every arrival time (0.5 = twice the rate; default 1)")
    replay.add_argument("--model", default=None,
                        help="served model name (default: the first one the server lists)")
    replay.add_argument("--label", default="live",
                        help="policy label in the report (the server's policy is not visible "
                        "over HTTP; default: live)")
    replay.add_argument("--timeout-s", type=float, default=None,
                        help="per-request timeout in seconds (default: the live replay's, 600)")
    replay.add_argument("--vocab-size", type=int, default=None,
                        help="token ids are drawn below this; at most the model's vocabulary "
                        "(default: 32000, or the served model's vocabulary if smaller; the tiny "
                        "CPU model has 512)")
    replay.add_argument("--min-success", type=_share, default=None, metavar="SHARE",
                        help="fail (exit 1) when fewer than this share of the requests get a "
                        f"first token (default {_default_min_success():g})")
    replay.add_argument("--open-loop", action="store_true", help=_OPEN_LOOP_HELP)
    replay.add_argument("--quick", action="store_true", help="shorten a preset trace")
    replay.add_argument("--out", default=None, metavar="DIR",
                        help="output directory (default results/replay-<timestamp>)")
    replay.add_argument("--no-progress", action="store_true", help="no progress bar")
    replay.set_defaults(handler=_replay)


def _router_names() -> list[str]:
    from fairway.fleet.routers import router_names

    return router_names()


def _default_signals() -> Any:
    from fairway.fleet.routing import FleetSignals

    return FleetSignals()


def _policy_params_help() -> str:
    from fairway.options.help import policy_params_help

    return policy_params_help()


def _default_min_success() -> float:
    from fairway.replay.outcome import DEFAULT_MIN_SUCCESS

    return DEFAULT_MIN_SUCCESS


def _positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0.0):  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value >= 0.0):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def _share(text: str) -> float:
    """An argparse type: a number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1, got {text!r}")
    return value


def _log_to_stderr() -> None:
    """INFO from fairway.* on stderr (vLLM configures only its own logger)."""
    root = logging.getLogger("fairway")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.WARNING)


def bench_config(args: argparse.Namespace) -> Any:
    """The `BenchConfig` of parsed `fairway bench` flags."""
    from fairway.replay.bench import DEFAULT_TRACES, BenchConfig

    given = {  # None: BenchConfig's default
        "cache_fraction": args.cache_fraction,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_num_seqs": args.max_num_seqs,
        "kv_offloading_gib": args.kv_offloading_size,
    }
    return BenchConfig(
        **{k: v for k, v in given.items() if v is not None},
        traces=tuple(args.trace or DEFAULT_TRACES),
        policies=tuple(args.policy or ()),
        policy_args=tuple(args.policy_arg),
        profile=args.profile,
        num_blocks=args.num_blocks,
        out=args.out,
        workers=args.workers,
        ray=args.ray,
        quick=args.quick,
        trace_cache=args.trace_cache,
        fresh_processes=args.fresh_processes,
        progress=not args.no_progress,
        open_loop=args.open_loop,
    )


def fleet_config(args: argparse.Namespace) -> Any:
    """The `FleetBenchConfig` of parsed `fairway bench --nodes` flags (None without --nodes).

    Raises:
        FairwayConfigError: a fleet flag without --nodes, or --nodes without --router.
    """
    from fairway.errors import FairwayConfigError
    from fairway.fleet.bench import FleetBenchConfig
    from fairway.fleet.routing import FleetSignals

    fleet_flags = {"--router": args.router, "--load": args.load,
                   "--metrics-delay-s": args.metrics_delay_s,
                   "--kv-event-delay-s": args.kv_event_delay_s}
    if args.nodes is None:
        given = [flag for flag, value in fleet_flags.items() if value is not None]
        if given:
            raise FairwayConfigError(f"{', '.join(given)} configure a fleet replay; add "
                                     "--nodes N (the number of nodes behind the router)")
        return None
    if not args.router:
        raise FairwayConfigError(f"--nodes {args.nodes} needs a router in front of the nodes: "
                                 f"--router NAME, one of {', '.join(_router_names())}")
    defaults = FleetSignals()
    signals = FleetSignals(
        metrics_delay_s=defaults.metrics_delay_s if args.metrics_delay_s is None
        else args.metrics_delay_s,
        kv_event_delay_s=defaults.kv_event_delay_s if args.kv_event_delay_s is None
        else args.kv_event_delay_s,
    )
    return FleetBenchConfig(bench=bench_config(args), num_nodes=args.nodes,
                            routers=tuple(args.router), loads=tuple(args.load or (1.0,)),
                            signals=signals)


def _bench(args: argparse.Namespace) -> int:
    from fairway.replay.bench import failed_replays, run_bench
    from fairway.replay.outcome import group_errors

    _log_to_stderr()
    fleet = fleet_config(args)
    if fleet is not None:
        return _fleet_bench(fleet)
    outcome = run_bench(bench_config(args))
    print(outcome.markdown)
    print(f"wrote {len(outcome.results)} replays and the report to {outcome.out_dir} "
          f"in {outcome.wall_s:.0f} s", file=sys.stderr)
    failed = failed_replays(outcome.results)
    for r in failed:
        cause = group_errors([q.error or "no first token" for q in r.requests], limit=1)[0]
        print(f"fairway: error: {r.trace_name} @ {r.policy}: none of {len(r.requests)} requests "
              f"got a first token ({cause.count} x {cause.example})", file=sys.stderr)
    return 1 if failed else 0


def _fleet_bench(config: Any) -> int:
    from fairway.fleet.bench import run_fleet_bench

    outcome = run_fleet_bench(config)
    print(outcome.markdown)
    print(f"wrote {len(outcome.results)} fleet replays and the table to {outcome.out_dir} "
          f"in {outcome.wall_s:.0f} s", file=sys.stderr)
    failed = [r for r in outcome.results
              if r.replay.requests and r.replay.n_errors == len(r.replay.requests)]
    for r in failed:
        print(f"fairway: error: {r.replay.trace_name} @ {r.label}: none of "
              f"{len(r.replay.requests)} requests got a first token", file=sys.stderr)
    return 1 if failed else 0


def _replay(args: argparse.Namespace) -> int:
    from fairway.replay import live
    from fairway.replay import results as results_io
    from fairway.replay.bench import load_trace_spec, new_out_dir, trace_label, write_bench_report
    from fairway.replay.outcome import verdict

    _log_to_stderr()
    trace = load_trace_spec(args.trace, quick=args.quick)
    kwargs: dict[str, Any] = {"time_scale": args.time_scale, "progress": not args.no_progress,
                              "open_loop": args.open_loop}
    if args.timeout_s is not None:
        kwargs["timeout_s"] = args.timeout_s
    if args.vocab_size is not None:
        kwargs["vocab_size"] = args.vocab_size
    out_dir = new_out_dir(args.out, "replay")
    name = trace_label(args.trace, args.quick)
    result = live.run_live(
        trace, args.url, args.model, policy=args.label, trace_name=name,
        out_path=out_dir / "replays" / f"{results_io.safe_name(name)}--"
        f"{results_io.safe_name(args.label)}.json", **kwargs,
    )
    outcome = write_bench_report([result], out_dir, None, result.wall_s)
    vllm_path = _save_vllm_shape(result, trace, out_dir)  # also as `vllm bench serve` writes it
    print(outcome.markdown)
    min_success = _default_min_success() if args.min_success is None else args.min_success
    found = verdict(result, min_success)
    for line in found.lines():
        print(f"fairway: {line}", file=sys.stderr)
    print(f"wrote the live replay ({result.n_errors} of {len(result.requests)} requests without "
          f"a first token) and its report to {out_dir} (in `vllm bench serve --save-result "
          f"--save-detailed`'s shape: {vllm_path})", file=sys.stderr)
    if result.settings.get("interrupted"):
        return 130
    return 0 if found.ok else 1


def _save_vllm_shape(result: Any, trace: Any, out_dir: Any) -> Any:
    """`<out>/vllm-bench/<trace>--<label>.json`; output_lens are the requested max_tokens."""
    from fairway.replay.results import file_name
    from fairway.replay.vllm_result import save_vllm_result

    return save_vllm_result(result, out_dir / "vllm-bench" / file_name(result),
                            output_lens=[r.max_tokens for r in trace.requests])
