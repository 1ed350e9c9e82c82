"""`fairway bench` as a library: traces x policies through the virtual replay, then the report.

The command (`fairway.cli.replay`) is a shell over `run_bench`; the benchmark scripts in
`benchmarks/` reuse the pieces (`load_traces`, `new_out_dir`, `environment_info`, ...) for their
own tables. Output goes to a new directory that never overwrites an earlier run.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fairway.errors import FairwayConfigError, TraceError
from fairway.machine import cpu_model
from fairway.options import (
    FairwayOptions,
    Setting,
    option_env_vars,
    parse_policy_args,
    policy_arg_settings,
)
from fairway.replay import results as results_io
from fairway.replay.engine_sizing import (
    DEFAULT_BATCHED_TOKENS,
    DEFAULT_CACHE_FRACTION,
    DEFAULT_MAX_NUM_SEQS,
    check_prompt_lengths,
)
from fairway.replay.results import ReplayResult
from fairway.replay.sweep import DEFAULT_WORKERS, ReplayJob, check_jobs, run_jobs

logger = logging.getLogger(__name__)

#: The default experiment: the two dynamic SEC traces (calm, burst, 60 s spike, calm).
DEFAULT_TRACES = ("sec-a", "sec-b")
#: Report order: the two references first, then the baselines, then Fairway and its ablations.
POLICY_ORDER = (
    "fcfs", "lpm", "klpm", "klpm-4", "klpm-8", "hrrn", "ragcache", "preble", "peek",
    "spf", "suf", "wspt", "vllm-window", "fairway", "fairway-step", "fairway-abswait",
    "fairway-nofair",
)


# --- traces ---------------------------------------------------------------------------------------


def trace_label(spec: str, quick: bool) -> str:
    """The report's name of a trace argument (preset name, or the file name without suffixes)."""
    path = Path(spec)
    if path.exists():
        name = path.name
        for suffix in (".gz", ".jsonl", ".json"):
            name = name.removesuffix(suffix)
        return name
    return f"{spec}-quick" if quick else spec


def load_trace_spec(
    spec: str, *, quick: bool = False, cache_dir: str | Path | None = None,
    capacity_tps: float | None = None, **overrides: Any,
) -> Any:
    """A trace from a file, a shipped preset, or a preset built on the fly (or read from
    `cache_dir`).

    A preset as registered and its quick variant ship with the package (`fairway.traces.shipped`)
    and need no data; other variants are built from the source data. Presets are deterministic,
    so a cached build is the same trace; the cache file name carries the overrides. Files are used
    as they are (`quick` does not shorten them).

    Raises:
        TraceError: neither a file nor a preset (the message lists the presets), or the data a
            non-shipped variant needs is missing (the message says which file and how to get it).
    """
    from fairway.traces.build import PRESETS, quick_overrides
    from fairway.traces.format import load_trace, write_trace
    from fairway.traces.shipped import build_from_sources, shipped_trace

    path = Path(spec)
    if path.exists():
        return load_trace(path)
    if spec not in PRESETS:
        raise TraceError(
            f"--trace {spec!r} is neither a trace file nor a preset; presets: "
            f"{', '.join(sorted(PRESETS))} (or build a file with `fairway trace build`)"
        )
    shipped = shipped_trace(spec, quick=quick, capacity_tps=capacity_tps, **overrides)
    if shipped is not None:
        return shipped
    params = {**(quick_overrides(spec) if quick else {}), **overrides}
    cached = None
    if cache_dir is not None:
        tag = "-".join(f"{k}={v}" for k, v in sorted(params.items()))
        tag += f"-cap={capacity_tps}" if capacity_tps is not None else ""
        safe = results_io.safe_name(f"{spec}{'-' + tag if tag else ''}")
        cached = Path(cache_dir) / f"{safe}.jsonl.gz"
        if cached.exists():
            logger.info("trace %s from the cache %s", spec, cached)
            return load_trace(cached)
    trace = build_from_sources(spec, capacity_tps, quick=quick, **overrides)
    if cached is not None:
        write_trace(trace, cached)
    return trace


def load_traces(
    specs: Sequence[str], *, quick: bool = False, cache_dir: str | Path | None = None
) -> list[tuple[str, Any]]:
    """(label, trace) for each `--trace` argument, in order; labels must be unique."""
    out: list[tuple[str, Any]] = []
    for spec in specs:
        label = trace_label(spec, quick)
        if any(label == name for name, _ in out):
            raise FairwayConfigError(f"trace {label!r} given twice")
        out.append((label, load_trace_spec(spec, quick=quick, cache_dir=cache_dir)))
    return out


# --- policies -------------------------------------------------------------------------------------


def ordered_policies(names: Sequence[str] | None) -> list[str]:
    """The given names (checked), or every registered policy in report order."""
    import fairway.policies as policies

    known = policies.names()
    if names:
        for name in names:
            policies.get(name)  # an unknown name raises with the known ones
        if len(set(names)) != len(names):
            raise FairwayConfigError(f"a policy is given twice: {list(names)}")
        return list(names)
    return [p for p in POLICY_ORDER if p in known] + [p for p in known if p not in POLICY_ORDER]


def options_by_policy(config: BenchConfig, selected: Sequence[str]) -> dict[str, FairwayOptions]:
    """Each chosen policy's `FairwayOptions`, built once here from `--policy`/`--policy-arg`.

    `FAIRWAY_*` variables configure a server, not a replay: they are ignored here (with a
    warning), so `FAIRWAY_POLICY=lpm fairway bench --policy fcfs` replays FCFS.
    """
    ignored = option_env_vars(os.environ)
    if ignored:
        logger.warning("fairway bench ignores %s: FAIRWAY_* variables configure a server; give "
                       "the replay's policies and parameters with --policy and --policy-arg",
                       ", ".join(ignored))
    given = policy_arg_settings(parse_policy_args(config.policy_args), selected)
    return {
        name: FairwayOptions.from_settings([Setting("policy", name, "--policy"), *given[name]])
        for name in selected
    }


# --- output ---------------------------------------------------------------------------------------


def new_out_dir(out: str | Path | None, prefix: str = "bench") -> Path:
    """A fresh output directory: `out`, or `results/<prefix>-<timestamp>`; never an old one.

    If the directory exists and is not empty, `-2`, `-3`, ... is appended (the path used is
    printed by the callers), so an earlier run is never overwritten.
    """
    if out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = Path("results") / f"{prefix}-{stamp}"
    base = Path(out)
    path, n = base, 1
    while path.exists() and (not path.is_dir() or any(path.iterdir())):
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty.strip() else "")


def environment_info() -> dict[str, Any]:
    """Machine and versions, recorded in every output JSON."""
    import numpy

    import fairway
    from fairway.replay.sim import vllm_version

    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": cpu_model() or platform.processor() or None,  # e.g. macOS: no cpuinfo
        "cpu_count": os.cpu_count(),
        "fairway": fairway.__version__,
        "vllm": vllm_version(),
        "numpy": numpy.__version__,
        "git_commit": _git_commit(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def write_json(path: str | Path, data: Any) -> Path:
    """Deterministic JSON (sorted keys, no NaN) with a trailing newline."""
    path = Path(path)
    path.write_text(json.dumps(data, indent=1, sort_keys=True, allow_nan=False,
                               default=results_io._json_default) + "\n", encoding="utf-8")
    return path


def speed_table(results: Sequence[ReplayResult]) -> list[dict[str, Any]]:
    """Per replay: wall seconds, simulated seconds and simulated seconds per wall second."""
    return [
        {
            "trace": r.trace_name, "policy": r.policy, "requests": len(r.requests),
            "errors": r.n_errors, "wall_s": round(r.wall_s, 3),
            "simulated_s": round(r.simulated_s or 0.0, 3),
            "simulated_s_per_wall_s": round((r.simulated_s or 0.0) / r.wall_s, 1)
            if r.wall_s > 0 else None,
            "kv_blocks": r.settings.get("kv_cache", {}).get("num_blocks"),
        }
        for r in results
    ]


# --- the bench ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    """Everything `fairway bench` takes (the CLI flags, resolved)."""

    #: Trace files or presets (`--trace`, repeatable).
    traces: tuple[str, ...] = DEFAULT_TRACES
    #: Policy names (`--policy`); empty: all registered policies.
    policies: tuple[str, ...] = ()
    #: `--policy-arg [POLICY.]KEY=VALUE` strings (`fairway.options.parse_policy_args`).
    policy_args: tuple[str, ...] = ()
    #: Profile table path or shipped name (`--profile`); None: the shipped default.
    profile: str | None = None
    #: Share of each trace's reusable content the KV cache holds.
    cache_fraction: float = DEFAULT_CACHE_FRACTION
    #: KV blocks (overrides cache_fraction).
    num_blocks: int | None = None
    #: vLLM's token budget per step (`--max-num-batched-tokens`; chunked prefill).
    max_num_batched_tokens: int = DEFAULT_BATCHED_TOKENS
    #: vLLM's limit on running requests (`--max-num-seqs`).
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    #: vLLM's `--kv-offloading-size`: a CPU offload tier of this many GiB; None: no tier.
    kv_offloading_gib: float | None = None
    #: `--open-loop`: keep the recorded arrivals of session turns (default: closed loop, each
    #: turn released its think time after its parent's first token; `fairway.replay.sessions`).
    open_loop: bool = False
    #: Output directory; None: results/bench-<timestamp>.
    out: str | None = None
    #: Local worker processes (0: in this process).
    workers: int = DEFAULT_WORKERS
    #: Ray address ("local" starts one here); None: local processes.
    ray: str | None = None
    #: Shorter preset traces (smoke tests).
    quick: bool = False
    #: Directory of built preset traces to reuse (and fill).
    trace_cache: str | None = None
    #: One process per replay.
    fresh_processes: bool = False
    #: tqdm bars.
    progress: bool = True


@dataclass
class BenchOutcome:
    """What a bench run produced."""

    out_dir: Path
    results: list[ReplayResult]
    markdown: str
    paths: dict[str, Path] = field(default_factory=dict)
    wall_s: float = 0.0


def replay_options(config: BenchConfig) -> dict[str, Any]:
    """Keyword arguments of `sim.replay` shared by every job of the run."""
    options: dict[str, Any] = {
        "cache_fraction": config.cache_fraction,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "max_num_seqs": config.max_num_seqs,
    }
    if config.num_blocks is not None:
        options["num_blocks"] = config.num_blocks
    if config.profile is not None:
        from fairway.profiling.table import load

        load(config.profile)  # a bad path fails here, once, not in every worker
        options["profile"] = config.profile
    if config.kv_offloading_gib is not None:
        check_kv_offloading(config.kv_offloading_gib, config.profile)
        options["kv_offloading_gib"] = config.kv_offloading_gib
    if config.open_loop:  # only when set: the jobs of a default run are what they were
        options["open_loop"] = True
    return options


def run_bench(config: BenchConfig) -> BenchOutcome:
    """Run the traces x policies replays, write results and the report, return them."""
    started = time.perf_counter()
    selected = ordered_policies(config.policies)
    fairway = options_by_policy(config, selected)
    options = replay_options(config)
    traces = load_traces(config.traces, quick=config.quick, cache_dir=config.trace_cache)
    for name, trace in traces:
        check_prompt_lengths(trace, name)  # here once, not in every worker
    if config.num_blocks is not None:
        check_num_blocks(config.num_blocks, traces)
    jobs = [
        ReplayJob(name, trace, fairway[policy], {}, options)
        for name, trace in traces
        for policy in selected
    ]
    check_jobs(jobs)  # bad names or parameters fail before anything is written
    out_dir = new_out_dir(config.out, "bench")
    raw_dir = out_dir / "replays"
    logger.info("bench: %d replays (%d traces x %d policies) -> %s", len(jobs), len(traces),
                len(selected), out_dir)
    found = run_jobs(
        jobs, workers=config.workers, ray_address=config.ray,
        fresh_processes=config.fresh_processes, progress=config.progress,
        on_result=lambda r: results_io.save(r, raw_dir / results_io.file_name(r)),
    )
    warn_about_engine(found)
    return write_bench_report(found, out_dir, config, time.perf_counter() - started)


#: Tokens per KV block in the virtual replay (vLLM's default, `sim.replay`'s).
BLOCK_SIZE = 16


def check_num_blocks(num_blocks: int, traces: Sequence[tuple[str, Any]],
                     block_size: int = BLOCK_SIZE) -> None:
    """Refuse a `--num-blocks` too small for a trace's largest request (every policy would fail).

    vLLM reserves one block, so `num_blocks - 1` are usable; a request needs its prompt and
    output tokens in blocks. The advice names `bench`'s own flags.

    Raises:
        FairwayConfigError: the first trace that does not fit, its largest request and the
            smallest `--num-blocks` that admits it.
    """
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 2:
        raise FairwayConfigError(f"--num-blocks must be an integer >= 2, got {num_blocks!r}")
    usable = num_blocks - 1
    for name, trace in traces:
        largest = max((r.prompt_tokens + r.max_tokens for r in trace.requests), default=0)
        needed = -(-largest // block_size)
        if needed > usable:
            raise FairwayConfigError(
                f"--num-blocks {num_blocks} leaves {usable} usable KV blocks of {block_size} "
                f"tokens, but trace {name!r} has a request of {largest} prompt + output tokens "
                f"({needed} blocks): no policy could run it; pass --num-blocks {needed + 1} or "
                "more, or drop --num-blocks (--cache-fraction sizing never goes below the "
                "largest request)"
            )


def check_kv_offloading(gib: float, profile: str | None, block_size: int = BLOCK_SIZE) -> int:
    """The tier blocks `--kv-offloading-size gib` gives under `profile`'s load cost, checked
    here once (a bad size fails before any worker starts).

    Raises:
        FairwayConfigError: not a number > 0, or less than one block.
    """
    from fairway.profiling.load_cost import for_profile
    from fairway.replay.offload_sim import blocks_for_gib
    from fairway.replay.sim import resolve_profile

    return blocks_for_gib(gib, for_profile(resolve_profile(profile)), block_size)


def failed_replays(results: Sequence[ReplayResult]) -> list[ReplayResult]:
    """Replays in which no request got a first token: nothing was measured."""
    return [r for r in results if r.requests and r.n_errors == len(r.requests)]


def warn_about_engine(results: Sequence[ReplayResult]) -> None:
    """Log replays whose numbers need a second look: policy fallbacks, errors, preemptions."""
    for r in results:
        engine = r.settings.get("engine", {})
        if engine.get("policy_fallbacks"):
            logger.warning("%s @ %s: the policy failed in %d steps (vLLM's FCFS order was used "
                           "there)", r.trace_name, r.policy, engine["policy_fallbacks"])
        if r.n_errors:
            logger.warning("%s @ %s: %d requests without a first token", r.trace_name, r.policy,
                           r.n_errors)


def write_bench_report(results: list[ReplayResult], out_dir: Path, config: BenchConfig | None,
                       wall_s: float) -> BenchOutcome:
    """report.md/.json and plots (`fairway.replay.report`) plus bench.json (config, machine)."""
    from fairway.replay import report

    paths = report.write_report(results, out_dir)
    markdown = paths["markdown"].read_text(encoding="utf-8")
    meta = {
        "config": asdict(config) if config is not None else None,
        "environment": environment_info(),
        "wall_s": round(wall_s, 3),
        "replays": speed_table(results),
        "settings": {f"{r.trace_name}--{r.policy}": r.settings for r in results},
    }
    paths["bench"] = write_json(out_dir / "bench.json", meta)
    return BenchOutcome(out_dir, results, markdown, paths, wall_s)


# --- helpers of the benchmark scripts (benchmarks/e*.py) ------------------------------------------


def experiment_parser(description: str) -> Any:
    """The flags every benchmark script takes (`--out`, `--quick`, `--workers`, `--ray`, ...)."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="output directory (default results/<experiment>-<timestamp>; never "
                        "overwritten)")
    parser.add_argument("--quick", action="store_true",
                        help="traces shortened to a quarter of their phases (smoke test)")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                        help="local worker processes (default %(default)s)")
    parser.add_argument("--ray", default=None, metavar="ADDRESS",
                        help="run the replays on Ray (`local` or a cluster address)")
    parser.add_argument("--profile", default=None, metavar="PATH_OR_NAME",
                        help="prefill-time table (default: the shipped A6000 estimate)")
    parser.add_argument("--trace-cache", default=None, metavar="DIR",
                        help="reuse preset traces built earlier in DIR")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def trace_info(trace: Any) -> dict[str, Any]:
    """The header facts that rebuild a trace (family, preset, seed, shape, params, capacity)."""
    h = trace.header
    return {
        "family": h.family, "preset": h.preset, "seed": h.seed, "shape": h.shape,
        "capacity_tps": h.capacity_tps, "params": dict(h.params), "num_requests": len(trace),
    }


def run_experiment(jobs: Sequence[ReplayJob], args: Any, out_dir: Path) -> list[ReplayResult]:
    """Run a script's replays with its flags; every result is saved under `out_dir/replays`."""
    raw_dir = out_dir / "replays"
    found = run_jobs(
        jobs, workers=args.workers, ray_address=args.ray, progress=not args.no_progress,
        on_result=lambda r: results_io.save(r, raw_dir / results_io.file_name(r)),
    )
    warn_about_engine(found)
    return found


def finish_experiment(out_dir: Path, name: str, markdown: str, data: dict[str, Any],
                      results: Sequence[ReplayResult], args: Any, started: float) -> Path:
    """Write `<name>.md` and `<name>.json` (machine, versions, seeds, speed); print the table."""
    wall = time.perf_counter() - started
    env = environment_info()
    header = (
        f"_{name}: {env['date']}, {os.cpu_count()}-core {platform.machine()} CPU, "
        f"{env['vllm']}, virtual-clock replay"
        f"{' (--quick: traces shortened to a quarter)' if args.quick else ''}; "
        f"{len(results)} replays in {wall:.0f} s wall._\n\n"
    )
    (out_dir / f"{name}.md").write_text(header + markdown, encoding="utf-8")
    payload = {
        "experiment": name,
        "args": vars(args),
        "environment": env,
        "wall_s": round(wall, 3),
        "replays": speed_table(results),
        "settings": {f"{r.trace_name}--{r.policy}": r.settings for r in results},
        **data,
    }
    write_json(out_dir / f"{name}.json", payload)
    print(header + markdown)
    print(f"wrote {out_dir}", file=sys.stderr)
    return out_dir
