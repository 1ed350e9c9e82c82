"""The registry of trace families and named presets: (family, seed, shape, params) -> Trace.

A trace is a pure function of its arguments (and the data files, whose sha256 the header
records): the same arguments give the same bytes, and `rebuild(header)` reproduces a file from
its first line. Presets are the benchmark's default traces; each one is a family with fixed
seed, shape and parameters.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fairway.errors import TraceError
from fairway.traces.agent import DEFAULT_SHAPE as AGENT_SHAPE
from fairway.traces.agent import AgentSessionsParams, build_agent_sessions
from fairway.traces.flood import FloodParams, build_flood
from fairway.traces.format import Trace, TraceHeader, TraceRequest
from fairway.traces.hitheavy import DEFAULT_SHAPE as HIT_HEAVY_SHAPE
from fairway.traces.hitheavy import HitHeavyParams, build_hit_heavy
from fairway.traces.mooncake import MooncakeParams, build_mooncake
from fairway.traces.musique import MusiqueParams, build_musique
from fairway.traces.sec import SecLongParams, SecParams, build_sec
from fairway.traces.shapes import LoadShape, get_shape
from fairway.traces.tenants import DEFAULT_SHAPE as TENANTS_SHAPE
from fairway.traces.tenants import TenantsParams, build_tenants

logger = logging.getLogger(__name__)

BuildResult = tuple[list[TraceRequest], dict[str, Any], float | None]


@dataclass(frozen=True)
class Family:
    """One trace family.

    Attributes:
        name: registry name (kebab-case, as in the CLI).
        params_cls: frozen dataclass of the family's parameters (field docstrings = help).
        default_shape: shape used when none is given; None for families with real arrivals.
        description: one line for `fairway trace list`.
        build: (family, seed, shape, capacity_tps, params) -> (requests, info, duration_s).
    """

    name: str
    params_cls: type
    default_shape: str | None
    description: str
    build: Callable[[str, int, LoadShape | None, float, Any], BuildResult]


def _shaped(builder: Callable[..., tuple[list[TraceRequest], dict[str, Any]]]) -> Callable[
        ..., BuildResult]:
    def run(family: str, seed: int, shape: LoadShape | None, capacity: float, params: Any
            ) -> BuildResult:
        assert shape is not None
        reqs, info = builder(family, seed, shape, capacity, params)
        return reqs, info, shape.duration_s
    return run


def _mooncake(family: str, seed: int, shape: LoadShape | None, capacity: float,
              params: Any) -> BuildResult:
    return build_mooncake(family, seed, capacity, params)


FAMILIES: dict[str, Family] = {
    f.name: f for f in (
        Family("sec", SecParams, "spike", "SEC filings QA, ~4-5k-token prompts",
               _shaped(build_sec)),
        Family("sec-long", SecLongParams, "spike", "SEC filings QA, 1-20 pages (~1k-16k tokens)",
               _shaped(build_sec)),
        Family("musique", MusiqueParams, "spike", "MuSiQue multi-hop agent sessions",
               _shaped(build_musique)),
        Family("mooncake", MooncakeParams, None, "Mooncake trace, real arrivals time-scaled",
               _mooncake),
        Family("flood", FloodParams, "flood", "backlog of misses, then a flood of cached requests",
               _shaped(build_flood)),
        Family("hit-heavy", HitHeavyParams, HIT_HEAVY_SHAPE,
               "96% hits on hot contexts, 4% long misses (after SGLang #31954)",
               _shaped(build_hit_heavy)),
        Family("tenants", TenantsParams, TENANTS_SHAPE,
               "classes of traffic with their own tenant, priority, hit rate and lengths",
               _shaped(build_tenants)),
        Family("agent-sessions", AgentSessionsParams, AGENT_SHAPE,
               "coding-agent sessions: a shared 10k-token prefix, contexts growing to 131k, "
               "subagents, think times (replayed closed loop)",
               _shaped(build_agent_sessions)),
    )
}

#: The step budget the long-context presets (`*-long`, prompts of 32k-128k tokens) are meant to
#: be replayed with: `fairway bench --max-num-batched-tokens 8192`. Long-context servers run
#: larger budgets than vLLM's default 2,048; a trace cannot carry a replay setting, so the
#: presets' descriptions say it and E2 passes it.
LONG_CONTEXT_BATCHED_TOKENS = 8192

#: `agent-sessions-busy`: the `agent-sessions` shape with every load x 1.4 (the session rate).
AGENT_BUSY_SHAPE = "calm:0.21:300,busy:0.35:600,calm:0.21:300"

#: The benchmark's default traces. Each builds in a few seconds, spans about 5-6 simulated
#: minutes (the long-context and agent-session ones longer) and has at most ~2,500 requests at
#: the default capacity.
PRESETS: dict[str, dict[str, Any]] = {
    "sec-a": {
        "family": "sec", "seed": 1, "shape": "spike",
        "params": {"zipf_s": 1.1, "drift_per_min": 1.0},
        "description": "SEC QA, skewed popularity, slow drift; calm-burst-spike-calm",
    },
    "sec-b": {
        "family": "sec", "seed": 2, "shape": "spike",
        "params": {"zipf_s": 0.8, "drift_per_min": 4.0},
        "description": "SEC QA, flatter popularity, faster drift; calm-burst-spike-calm",
    },
    "sec-long": {
        "family": "sec-long", "seed": 3, "shape": "spike", "params": {},
        "description": "SEC QA with mixed 1k-16k-token prompts; calm-burst-spike-calm",
    },
    "musique": {
        "family": "musique", "seed": 4, "shape": "spike", "params": {},
        "description": "MuSiQue agent sessions (2-4 hops, 2 s think time); calm-burst-spike-calm",
    },
    "mooncake": {
        "family": "mooncake", "seed": 5, "shape": None,
        "params": {"window_start_s": 600.0, "window_s": 600.0, "sample_fraction": 0.12,
                   "load": 1.2, "max_prompt_tokens": 32000, "jitter_ms": 3000.0},
        "description": "Mooncake conversation trace: 12% of the conversations of minutes 10-20, "
        "mean load 1.2, prompts capped at 32,000 tokens",
    },
    "flood": {
        "family": "flood", "seed": 6, "shape": "flood", "params": {},
        "description": "one warm-up request computes the shared prefix at t = 0, 60 s backlog of "
        "8k-token misses, 90 s flood of cached requests, calm",
    },
    # After SGLang issue #31954: production agentic traffic with ~96% radix-cache hits, where
    # under `lpm` the ~5% cache misses formed a 20-60 s TTFT tail carrying ~75% of all TTFT
    # (median 0.7 s). Replay it with a cache that holds the hot contexts (--cache-fraction 1.5).
    "hit-heavy": {
        "family": "hit-heavy", "seed": 7, "shape": HIT_HEAVY_SHAPE, "params": {},
        "description": "96% of requests hit one of 4 hot 8k-token contexts, 4% are 8k-token "
        "misses (after SGLang #31954); replay with --cache-fraction 1.5",
    },
    # The conversation trace's first ten minutes: its 12% sample holds prompts up to 121,924
    # tokens (12 above 64k), where the `mooncake` preset's minutes 10-20 stay below 44k. Load 0.4
    # keeps FCFS's median TTFT below 10 s at 8,192-token steps (8.2 s; 0.5 gives 30 s).
    "mooncake-long": {
        "family": "mooncake", "seed": 5, "shape": None,
        "params": {"window_start_s": 0.0, "window_s": 600.0, "sample_fraction": 0.12,
                   "load": 0.4, "max_prompt_tokens": 131072, "jitter_ms": 3000.0},
        "description": "Mooncake conversation trace: 12% of the conversations of minutes 0-10, "
        "mean load 0.4, prompts up to the 131,072-token context (longest 121,924); replay with "
        f"--max-num-batched-tokens {LONG_CONTEXT_BATCHED_TOKENS}",
    },
    # hit-heavy at long context (SGLang #31954's traffic had ~115k-token mean inputs): hot
    # contexts of 32k-64k tokens, misses as long as a hit on the shortest one. A 90 s lead-in
    # without traffic lets the four contexts (~196k tokens, ~76 s of prefill) be computed first;
    # the loads (uncached tokens) are lower than hit-heavy's because a long context makes each
    # uncached token dearer (attention).
    "hit-heavy-long": {
        "family": "hit-heavy", "seed": 8,
        "shape": "warmup:0:90,calm:0.25:60,busy:0.45:180,calm:0.25:60",
        "params": {"prefix_tokens": 32768, "prefix_tokens_max": 65536, "miss_tokens": 33024},
        "description": "96% of requests hit one of 4 hot contexts of 32k-64k tokens, 4% are "
        "33k-token misses (after SGLang #31954); replay with --cache-fraction 1.5 "
        f"--max-num-batched-tokens {LONG_CONTEXT_BATCHED_TOKENS}",
    },
    # Two tenants: "heavy" floods with cache hits (90%, on 4 hot 6k-token contexts) and drives a
    # sustained overload (1.5 x capacity in uncached tokens); "light" sends misses (90%, 3k-6k
    # tokens) at a steady 0.35 x capacity, well under a fair half, whatever the phase. In the
    # calm phases heavy sends ~3x light's request rate, in the overload ~15x.
    "tenants": {
        "family": "tenants", "seed": 9, "shape": TENANTS_SHAPE, "params": {},
        "description": "tenant heavy (90% hits on 6k-token contexts) at 3x the request rate of "
        "tenant light (90% 1k-3k-token misses), 1.5x capacity for 150 s (light: a quarter of "
        "the work); replay with --cache-fraction 1.5",
    },
    # Four tenants of different hit rates and lengths, 1.3 x capacity in the busy phase: chat
    # (short, mostly hits, most requests), rag (8k contexts, mostly hits), batch (4k-12k misses,
    # about half the work), agent (16k-24k contexts, 95% hits).
    "tenants-mixed": {
        "family": "tenants", "seed": 10, "shape": "calm:0.6:60,busy:1.3:150,calm:0.6:60",
        "params": {"tenants": (
            "chat:rate=6:hits=0.9:context=2048:suffix=128:miss=2048:contexts=4,"
            "rag:rate=2:hits=0.8:context=8192:suffix=256:miss=8192:contexts=4,"
            "batch:rate=1:hits=0:suffix=256:miss=4000-12000:contexts=1,"
            "agent:rate=1:hits=0.95:context=16384-24576:suffix=512:miss=16896:contexts=2"
        )},
        "description": "tenants chat (short hits), rag (8k contexts, 80% hits), batch (4k-12k "
        "misses), agent (16k-24k contexts, 95% hits); 1.3x capacity for 150 s; replay with "
        "--cache-fraction 1.5",
    },
    # Two priorities on the default tenant (no tenant named): "interactive" (95% hits, priority
    # 0) at a steady 0.3 x capacity, and a "batch" backlog (priority 1, half hits on 8k contexts,
    # half 8k misses) of 60 s at 2 x capacity that takes ~2 more minutes to drain.
    "priority": {
        "family": "tenants", "seed": 11, "shape": "burst:2.3:60,steady:0.3:180",
        "params": {"tenants": (
            "interactive:tenant=none:load=0.3:hits=0.95:context=4096:suffix=512:miss=4096:"
            "contexts=4:priority=0,"
            "batch:tenant=none:rate=1:hits=0.5:context=8192:suffix=512:miss=8192:contexts=2:"
            "priority=1"
        )},
        "description": "default tenant, two priorities: interactive (priority 0, 95% hits) at "
        "0.3x capacity throughout, a batch backlog (priority 1) at 2x for 60 s; replay with "
        "--cache-fraction 1.5",
    },
    # Coding-agent sessions (fairway/traces/agent.py): contexts growing from ~11k to 131k tokens,
    # subagents, think times of seconds; replayed closed loop (each turn think_s after its
    # parent's first token), with the replay's default cache (0.3 x the reusable content). Loads
    # are uncached tokens at short context; a long context makes them ~2.5 x dearer. Seed 17
    # realises both loads within 10% of nominal (16 and 23 sessions); at 8,192-token steps FCFS's
    # p99 is 43 s (busy: 79 s) and the last turns end at ~22 (24) minutes.
    "agent-sessions": {
        "family": "agent-sessions", "seed": 17, "shape": AGENT_SHAPE, "params": {},
        "description": "coding-agent sessions: a 10k-token shared prefix, contexts growing to "
        "131k, subagents, seconds of think time; 20 min of session starts at 0.15-0.25x capacity "
        "(uncached tokens); replay closed loop with --max-num-batched-tokens "
        f"{LONG_CONTEXT_BATCHED_TOKENS}",
    },
    "agent-sessions-busy": {
        "family": "agent-sessions", "seed": 17, "shape": AGENT_BUSY_SHAPE, "params": {},
        "description": "agent-sessions at 1.4x its session rate (0.21-0.35x capacity in uncached "
        "tokens); replay closed loop with --max-num-batched-tokens "
        f"{LONG_CONTEXT_BATCHED_TOKENS}",
    },
}


def get_family(name: str) -> Family:
    """The family called `name`; an unknown name lists the known ones."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise TraceError(
            f"unknown trace family {name!r}; families: {', '.join(sorted(FAMILIES))}; "
            f"presets: {', '.join(sorted(PRESETS))}"
        ) from None


def _coerce(name: str, annotation: object, value: Any) -> Any:
    """`value` (a Python value, or a string from the CLI) as the field's declared type."""
    parts = [p.strip() for p in str(annotation).split("|")]
    optional = "None" in parts
    base = next((p for p in parts if p != "None"), "str")
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise TraceError(f"parameter {name} cannot be null")
    try:
        if base == "bool":
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                return value.lower() in ("true", "1")
            return bool(value)
        if base == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if base == "float":
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise TraceError(f"parameter {name} must be {annotation}, got {value!r}") from None


def make_params(family: str, params: Mapping[str, Any]) -> Any:
    """The family's parameter object; unknown names and bad values are `TraceError`s."""
    fam = get_family(family)
    fields = {f.name: f for f in dataclasses.fields(fam.params_cls)}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        raise TraceError(
            f"unknown parameter(s) {', '.join(unknown)} for family {family}; known: "
            f"{', '.join(sorted(fields))}"
        )
    values = {k: _coerce(k, fields[k].type, v) for k, v in params.items()}
    return fam.params_cls(**values)


def parse_param_strings(items: list[str]) -> dict[str, str]:
    """``["k=v", ...]`` from the command line as a dict (values stay strings)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TraceError(f"--param must be KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def default_capacity_tps() -> float:
    """The shipped profile's capacity (tokens/s at 2048-token chunks)."""
    from fairway.profiling.table import default_profile

    return default_profile().capacity_tps()


def build_trace(
    family: str,
    seed: int,
    shape: str | None = None,
    capacity_tps: float | None = None,
    *,
    preset: str | None = None,
    **params: Any,
) -> Trace:
    """Build a trace.

    Args:
        family: one of `FAMILIES` (sec, sec-long, musique, mooncake, flood, hit-heavy,
            tenants, agent-sessions).
        seed: non-negative integer; every random choice derives from it.
        shape: a named or inline load shape (`fairway.traces.shapes.get_shape`); None: the
            family's default. Mooncake keeps its real arrivals and takes none.
        capacity_tps: the capacity (tokens/s) loads are relative to; None: the shipped
            profile's (`default_capacity_tps`).
        preset: name recorded in the header (informational).
        **params: family parameters (see each family's params class); strings are converted.

    Returns:
        The trace; writing it gives the same bytes for the same arguments.
    """
    fam = get_family(family)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TraceError(f"seed must be a non-negative integer, got {seed!r}")
    if fam.default_shape is None and shape is not None:
        raise TraceError(
            f"family {family} keeps its recorded arrivals and takes no shape (got {shape!r}); "
            "set its load with --param load=X and a slice with window_start_s / window_s"
        )
    shape = shape if shape is not None else fam.default_shape
    load_shape = get_shape(shape) if shape is not None else None
    capacity = float(capacity_tps) if capacity_tps is not None else default_capacity_tps()
    if not capacity > 0:
        raise TraceError(f"capacity_tps must be > 0, got {capacity_tps}")
    param_obj = make_params(family, params)
    started = time.perf_counter()
    reqs, info, duration = fam.build(family, seed, load_shape, capacity, param_obj)
    header = TraceHeader(
        family=family,
        seed=seed,
        shape=shape,
        params=dataclasses.asdict(param_obj),
        num_requests=len(reqs),
        capacity_tps=capacity,
        preset=preset,
        duration_s=None if duration is None else round(duration, 6),
        phases=load_shape.windows() if load_shape is not None else (),
        info=info,
    )
    trace = Trace(header, tuple(reqs))
    logger.info(
        "built %s trace (seed %d): %d requests in %.2f s", family, seed, len(reqs),
        time.perf_counter() - started,
    )
    return trace


def preset_arguments(name: str) -> dict[str, Any]:
    """A copy of a preset's family, seed, shape and params."""
    try:
        spec = PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise TraceError(f"unknown preset {name!r}; presets: {known}") from None
    return {"family": spec["family"], "seed": spec["seed"], "shape": spec["shape"],
            "params": dict(spec["params"])}


#: A quick variant shortens every phase of a preset's shape to this share of its length (and a
#: recorded-arrival trace's window likewise), keeping loads: the same story in a quarter of the
#: time (`fairway bench --quick`, smoke runs).
QUICK_FACTOR = 0.25


def quick_overrides(preset: str, factor: float = QUICK_FACTOR) -> dict[str, Any]:
    """Preset overrides for a shorter trace: every phase (or the Mooncake window) x `factor`."""
    args = preset_arguments(preset)
    if args["shape"] is None:
        window = args["params"].get("window_s")
        return {} if window is None else {"window_s": round(window * factor, 6)}
    shape = get_shape(args["shape"])
    return {"shape": ",".join(
        f"{p.name}:{p.load:g}:{p.duration_s * factor:g}" for p in shape.phases
    )}


def build_preset(name: str, capacity_tps: float | None = None, **overrides: Any) -> Trace:
    """Build a preset; `overrides` replace its parameters (seed and shape too, by name)."""
    args = preset_arguments(name)
    seed = overrides.pop("seed", args["seed"])
    shape = overrides.pop("shape", args["shape"])
    params = {**args["params"], **overrides}
    return build_trace(args["family"], seed, shape, capacity_tps, preset=name, **params)


def rebuild(header: TraceHeader) -> Trace:
    """Build again the trace a header describes (same bytes if the data files are the same)."""
    return build_trace(
        header.family, header.seed, header.shape, header.capacity_tps, preset=header.preset,
        **dict(header.params),
    )
