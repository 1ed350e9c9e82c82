"""`fairway trace build|stats|list|export|import` and `fairway data download|path`: thin shells."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``trace`` and ``data`` subcommands to the `fairway` parser."""
    trace = subparsers.add_parser("trace", help="build and inspect workload traces")
    tsub = trace.add_subparsers(dest="trace_command", metavar="ACTION", required=True)

    build = tsub.add_parser(
        "build", help="build a trace from a preset or a family",
        description="Build a trace file. FAMILY_OR_PRESET is a preset (see `fairway trace "
        "list`), whose seed, shape and parameters the options override, or a family (seed 0 "
        "unless given). A name that is both (sec-long, musique, mooncake, flood) is the preset. "
        "Traces are built from the source data (`fairway data path`); a preset as registered "
        "is also shipped with the package and is copied from there when the data is absent. "
        "--all-presets --into DIR rebuilds every shipped preset file from the source data.",
    )
    build.add_argument("name", metavar="FAMILY_OR_PRESET", nargs="?")
    build.add_argument("--seed", type=int, default=None,
                       help="random seed (default: the preset's, or 0)")
    build.add_argument("--shape", default=None,
                       help="load shape: a name (spike, steady, calm, overload, flood) or inline "
                       "NAME:LOAD:DURATION_S[,...]; default: the preset's or family's")
    build.add_argument("--capacity-tps", type=float, default=None,
                       help="capacity in prefill tokens/s that loads are relative to "
                       "(default: the shipped profile's)")
    build.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                       help="family parameter (repeatable); see `fairway trace list`")
    build.add_argument("-o", "--output", help="output file (.jsonl or .jsonl.gz)")
    build.add_argument("--force", action="store_true", help="overwrite an existing --output")
    build.add_argument("--all-presets", action="store_true",
                       help="build every preset and its --quick variant from the source data "
                       "into --into (the files shipped in fairway/traces/presets)")
    build.add_argument("--into", metavar="DIR", help="output directory of --all-presets")
    build.set_defaults(handler=_build)

    stats = tsub.add_parser("stats", help="summarize a trace file")
    stats.add_argument("file")
    stats.add_argument("--json", action="store_true", help="print JSON instead of a table")
    stats.add_argument("--window-s", type=positive_float, default=10.0,
                       help="arrival window in seconds (> 0) of requests queued together, for "
                       "the work spread (default 10)")
    stats.set_defaults(handler=_stats)

    export = tsub.add_parser(
        "export", help="write a trace for another client (vLLM's `vllm bench serve`)",
        description="Write FILE in another format. vllm-timed-trace: the JSONL that `vllm bench "
        "serve --dataset-name timed_trace` replays; every prompt is cut into chunks of "
        "--chunk-tokens tokens, equal content gets equal hash ids, so shared prefixes stay "
        "shared (see fairway/traces/export.py).",
    )
    export.add_argument("file")
    export.add_argument("--format", dest="fmt", default="vllm-timed-trace",
                        choices=["vllm-timed-trace"], help="output format")
    export.add_argument("--chunk-tokens", type=int, default=16,
                        help="tokens per hash id (pass the same value to vLLM's "
                        "--timed-trace-chunk-hash-size; at most the server's KV block size)")
    export.add_argument("-o", "--output", required=True, help="output file (.jsonl)")
    export.add_argument("--force", action="store_true", help="overwrite an existing output")
    export.set_defaults(handler=_export)

    imp = tsub.add_parser(
        "import", help="read a timed trace (vLLM's timed_trace / Mooncake JSONL) as a trace",
        description="Write FILE, a timed trace that `vllm bench serve --dataset-name "
        "timed_trace` replays (timestamp, input_length, output_length, hash_ids per line), as "
        "a Fairway trace with the prompts vLLM's loader expands: one block per hash id, request "
        "i = line i, arrivals from the first line (see fairway/traces/timed_import.py).",
    )
    imp.add_argument("file")
    imp.add_argument("--chunk-tokens", type=int, required=True,
                     help="tokens per hash id: the --timed-trace-chunk-hash-size vLLM replays "
                     "the file with (512 for Mooncake's traces, 16 for `fairway trace export`)")
    imp.add_argument("--sec-multiplier", type=positive_float, default=1.0,
                     help="seconds per timestamp unit, vLLM's --timed-trace-sec-multiplier "
                     "(0.001 for milliseconds; default 1)")
    imp.add_argument("--name", default=None,
                     help="name replays and reports give the trace (default: timed-trace)")
    imp.add_argument("-o", "--output", required=True, help="output file (.jsonl or .jsonl.gz)")
    imp.add_argument("--force", action="store_true", help="overwrite an existing output")
    imp.set_defaults(handler=_import)

    lst = tsub.add_parser("list", help="families with their parameters, presets and shapes")
    lst.set_defaults(handler=_list)

    data = subparsers.add_parser("data", help="locate or download the workload data")
    dsub = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    dl = dsub.add_parser("download", help="fetch the public data files (sha256-checked)")
    dl.add_argument("--dest", default=None,
                    help="target directory (default: $FAIRWAY_DATA or the user cache directory)")
    dl.add_argument("--force", action="store_true", help="download even if present and valid")
    dl.set_defaults(handler=_download)
    path = dsub.add_parser("path", help="print the data directory in use")
    path.set_defaults(handler=_path)


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (argparse turns the error into exit 2)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def refuse_overwrite(path: str | Path, force: bool, flag: str = "--output") -> None:
    """One rule for every writer: an existing output is overwritten only with --force.

    Raises:
        FairwayError: the file exists and `force` is False.
    """
    from fairway.errors import FairwayError

    if Path(path).exists() and not force:
        raise FairwayError(f"{flag} {path} exists; pass --force to overwrite it")


def _build(args: argparse.Namespace) -> int:
    from fairway.errors import TraceError
    from fairway.traces.build import FAMILIES, PRESETS, build_trace, get_family, parse_param_strings
    from fairway.traces.data import MissingDataError
    from fairway.traces.format import write_trace
    from fairway.traces.shipped import build_from_sources, shipped_trace

    if args.all_presets:
        return _build_all(args)
    if args.name is None or args.output is None or args.into is not None:
        raise TraceError("trace build takes FAMILY_OR_PRESET -o FILE, or --all-presets --into DIR")
    refuse_overwrite(args.output, args.force)
    params: dict[str, Any] = parse_param_strings(args.param)
    started = time.perf_counter()
    if args.name in PRESETS:
        if args.seed is not None:
            params["seed"] = args.seed
        if args.shape is not None:
            params["shape"] = args.shape
        try:
            trace = build_from_sources(args.name, args.capacity_tps, **params)
        except MissingDataError:
            shipped = shipped_trace(args.name, capacity_tps=args.capacity_tps, **params)
            if shipped is None:
                raise
            trace = shipped
            print(f"source data absent: copying the shipped preset {args.name} (the same bytes "
                  "as a build from the sources)", file=sys.stderr)
    else:
        if args.name not in FAMILIES:
            get_family(args.name)  # raises with the known names
        seed = 0 if args.seed is None else args.seed
        trace = build_trace(args.name, seed, args.shape, args.capacity_tps, **params)
    path = write_trace(trace, args.output)
    print(
        f"wrote {len(trace)} requests ({trace.header.duration_s or 0:.0f} s simulated) to {path} "
        f"in {time.perf_counter() - started:.2f} s",
        file=sys.stderr,
    )
    return 0


def _build_all(args: argparse.Namespace) -> int:
    from fairway.errors import TraceError
    from fairway.traces.shipped import write_presets

    if args.into is None or args.name is not None or args.output is not None or args.param or (
            args.seed is not None or args.shape is not None or args.capacity_tps is not None):
        raise TraceError("--all-presets takes only --into DIR (the presets' own settings are used)")
    started = time.perf_counter()
    paths = write_presets(args.into, progress=lambda line: print(line, file=sys.stderr))
    elapsed = time.perf_counter() - started
    print(f"wrote {len(paths)} preset files to {args.into} in {elapsed:.1f} s", file=sys.stderr)
    return 0


def _stats(args: argparse.Namespace) -> int:
    from fairway.traces.format import load_trace
    from fairway.traces.stats import format_stats, trace_stats

    stats = trace_stats(load_trace(args.file), window_s=args.window_s)
    if args.json:
        print(json.dumps(stats.to_json(), indent=2))
    else:
        print(format_stats(stats))
    return 0


def _export(args: argparse.Namespace) -> int:
    from fairway.traces.export import bench_command, export_trace
    from fairway.traces.format import load_trace

    refuse_overwrite(args.output, args.force)
    summary = export_trace(load_trace(args.file), args.output, args.fmt, args.chunk_tokens)
    print(
        f"wrote {summary.num_requests} requests ({summary.num_chunk_ids} distinct "
        f"{summary.chunk_tokens}-token chunks) to {summary.path}; replay it with:\n  "
        + bench_command(summary),
        file=sys.stderr,
    )
    return 0


def _import(args: argparse.Namespace) -> int:
    from fairway.traces.format import write_trace
    from fairway.traces.timed_import import import_timed_trace

    refuse_overwrite(args.output, args.force)
    trace = import_timed_trace(args.file, chunk_tokens=args.chunk_tokens,
                               sec_multiplier=args.sec_multiplier, name=args.name)
    path = write_trace(trace, args.output)
    info = trace.header.info
    chunks = {block for req in trace for block, _ in req.blocks}
    cut = (f"; {info['num_cut']} prompts cut by {info['tokens_cut']} tokens where hash_ids ran "
           "out (as vLLM's loader does)" if info["num_cut"] else "")
    print(
        f"wrote {len(trace)} requests ({sum(r.prompt_tokens for r in trace)} prompt tokens over "
        f"{trace.header.duration_s:.1f} s, {len(chunks)} distinct chunks) to {path}{cut}",
        file=sys.stderr,
    )
    return 0


def _list(args: argparse.Namespace) -> int:
    import dataclasses

    from fairway.traces.build import FAMILIES, PRESETS
    from fairway.traces.shapes import SHAPES
    from fairway.traces.shipped import shipped_path

    print("presets (shipped: built into the package, no data needed; also with --quick):")
    for name, spec in PRESETS.items():
        mark = "" if shipped_path(name).is_file() else " [not shipped: needs the source data]"
        print(f"  {name:<10} {spec['description']}{mark}")
    print("\nshapes:")
    for name, shape in SHAPES.items():
        phases = ", ".join(f"{p.name} {p.load:g}x {p.duration_s:g}s" for p in shape.phases)
        print(f"  {name:<10} {phases}")
    print("\nfamilies (--param KEY=VALUE):")
    for name, fam in FAMILIES.items():
        print(f"  {name:<10} {fam.description} (default shape: {fam.default_shape})")
        for f in dataclasses.fields(fam.params_cls):
            print(f"      {f.name} = {f.default!r}")
    return 0


def _download(args: argparse.Namespace) -> int:
    from fairway.traces.data import download

    results = download(args.dest, progress=print)
    skipped = [r for r in results if r.status == "skipped"]
    if skipped:
        print(
            "note: " + ", ".join(r.name for r in skipped) + " cannot be downloaded (derived "
            "data, see above): without it the sec and sec-long families build only with "
            "--param sources=10k; the shipped presets need no data",
            file=sys.stderr,
        )
    return 0


def _path(args: argparse.Namespace) -> int:
    from fairway.traces.data import resolve_data_dir

    path, how = resolve_data_dir()
    print(path)
    print(f"(from {how})", file=sys.stderr)
    return 0
