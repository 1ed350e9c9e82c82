"""The trace file: one JSON header line, then one request per line (JSONL, optionally gzipped).

A request's prompt is a list of content blocks ``[block_id, tokens]``. Equal leading blocks mean a
shared prefix, which is all a prefix cache can reuse, so the file keeps the sharing structure
without shipping text. A block id always has one token count within a trace (checked on load), and
`block_token_ids` turns a block into the same token ids everywhere: the replay, a live server and
the statistics all see one prompt.

A request line has, in this order, ``request_id``, ``arrival_s``, ``blocks``, ``max_tokens``,
``phase``, ``tags``, and two optional keys, written only when set: ``tenant`` (the tenant the
request names, sent to a server as ``vllm_xargs`` ``{"tenant": ...}``, `fairway.tenants`) and
``priority`` (vLLM's per-request priority, an integer, lower first; absent means 0). A trace
without tenants or priorities has the bytes it had before these keys existed.

Writing is deterministic (fixed key order, sorted keys inside ``params``/``info``/``tags``,
``arrival_s`` with exactly six decimals, gzip without a timestamp), so the same trace always has
the same bytes and a trace can be compared with a rebuild of its header by ``cmp``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from fairway.errors import TraceError

FORMAT_VERSION = 1

#: ``(block_id, tokens)``: one content block of a prompt.
Block = tuple[str, int]

_HEADER_KEYS = (
    "fairway_trace", "family", "seed", "shape", "capacity_tps", "preset", "params",
    "num_requests", "duration_s", "phases", "info",
)
_REQUIRED_HEADER_KEYS = ("fairway_trace", "family", "seed", "shape", "params", "num_requests")
_REQUEST_KEYS = (
    "request_id", "arrival_s", "blocks", "max_tokens", "phase", "tags", "tenant", "priority",
)


@dataclass(frozen=True, slots=True)
class PhaseWindow:
    """One labelled window of a load shape: requests arriving in [start_s, end_s) get `name`.

    Attributes:
        name: phase label (calm, burst, spike, overload, steady, backlog, flood, ...).
        start_s: window start in seconds from the trace start.
        end_s: window end in seconds (exclusive).
        load: offered work as a multiple of the trace's `capacity_tps`.
    """

    name: str
    start_s: float
    end_s: float
    load: float

    def to_json(self) -> dict[str, Any]:
        """The header representation."""
        return {"name": self.name, "start_s": self.start_s, "end_s": self.end_s, "load": self.load}


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One prefill request of a trace.

    Attributes:
        request_id: unique within the trace.
        arrival_s: arrival time in seconds from the trace start (non-decreasing along the file).
        blocks: the prompt as content blocks ``(block_id, tokens)``, tokens >= 1 each.
        max_tokens: tokens to generate (1: the prefill-node setting, TTFT only).
        phase: label of the load-shape window the request arrived in, or None.
        tags: small JSON-able facts for analysis (filing, question_id, session, hop, ...).
        tenant: the tenant the request names (vLLM's ``vllm_xargs`` / ``SamplingParams.
            extra_args["tenant"]``, see `fairway.tenants`), or None: the default tenant.
        priority: vLLM's per-request priority (lower is served first under
            ``--scheduling-policy priority``); 0 is vLLM's default.
    """

    request_id: str
    arrival_s: float
    blocks: tuple[Block, ...]
    max_tokens: int = 1
    phase: str | None = None
    tags: Mapping[str, Any] = field(default_factory=dict)
    tenant: str | None = None
    priority: int = 0

    def __post_init__(self) -> None:
        problem = _request_problem(self)
        if problem:
            raise TraceError(f"request {self.request_id!r}: {problem}")

    @property
    def prompt_tokens(self) -> int:
        """Prompt length L in tokens (sum over blocks)."""
        return sum(tokens for _, tokens in self.blocks)

    def token_ids(self, vocab_size: int, reserved: int = 4) -> list[int]:
        """The prompt as token ids in ``[reserved, vocab_size)``, block by block.

        Same block id => same ids, so requests with equal leading blocks have equal leading ids
        (what a prefix cache matches). See `block_token_ids` for the exact rule.
        """
        if not self.blocks:
            return []
        parts = [block_token_ids(b, n, vocab_size, reserved) for b, n in self.blocks]
        return np.concatenate(parts).tolist()


@dataclass(frozen=True)
class TraceHeader:
    """The first line of a trace file: how it was built and what it contains.

    Attributes:
        family: builder family (sec, sec-long, musique, mooncake, flood).
        seed: seed of every random choice.
        shape: load-shape name or inline spec (see `fairway.traces.shapes`), or None.
        params: every family parameter, resolved (defaults filled in): with family, seed, shape
            and capacity_tps they rebuild the trace bit for bit (`fairway.traces.build.rebuild`).
        num_requests: number of request lines that follow.
        capacity_tps: the capacity (prefill tokens/s) that the shape's loads are relative to.
        preset: preset name when built from one, else None (informational).
        duration_s: the shape's length in seconds (requests may arrive later, e.g. late hops).
        phases: the shape's windows, in time order.
        info: facts the builder reports (work per request used for the rate, capped/dropped
            counts, source files and their sha256, ...).
    """

    family: str
    seed: int
    shape: str | None
    params: Mapping[str, Any]
    num_requests: int
    capacity_tps: float | None = None
    preset: str | None = None
    duration_s: float | None = None
    phases: tuple[PhaseWindow, ...] = ()
    info: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The header line as a dict, keys in file order."""
        return {
            "fairway_trace": FORMAT_VERSION,
            "family": self.family,
            "seed": self.seed,
            "shape": self.shape,
            "capacity_tps": self.capacity_tps,
            "preset": self.preset,
            "params": dict(self.params),
            "num_requests": self.num_requests,
            "duration_s": self.duration_s,
            "phases": [p.to_json() for p in self.phases],
            "info": dict(self.info),
        }


@dataclass(frozen=True)
class Trace:
    """A header and its requests (arrival order). Construction checks the whole trace."""

    header: TraceHeader
    requests: tuple[TraceRequest, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", tuple(self.requests))
        checker = _TraceChecker()
        for req in self.requests:
            problem = checker.add(req)
            if problem:
                raise TraceError(f"request {req.request_id!r}: {problem}")
        if self.header.num_requests != len(self.requests):
            raise TraceError(
                f"header says num_requests={self.header.num_requests} but the trace has "
                f"{len(self.requests)} requests"
            )

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[TraceRequest]:
        return iter(self.requests)


# --------------------------------------------------------------------------------------------
# Token realization


_MASK64 = (1 << 64) - 1


@lru_cache(maxsize=8192)
def _block_ids_cached(block_id: str, tokens: int, vocab_size: int, reserved: int) -> np.ndarray:
    key = int.from_bytes(hashlib.sha256(block_id.encode("utf-8")).digest()[:8], "little")
    # SplitMix64 over a counter: stateless, so the rule is the same in any numpy version or
    # language, and token i of a block never depends on the block's length.
    x = np.arange(tokens, dtype=np.uint64) + np.uint64(key)
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    ids = (x % np.uint64(vocab_size - reserved)).astype(np.int64) + reserved
    ids.setflags(write=False)
    return ids


def block_token_ids(block_id: str, tokens: int, vocab_size: int, reserved: int = 4) -> np.ndarray:
    """Deterministic token ids of one block (read-only int64 array of length `tokens`).

    Rule: ``k = int.from_bytes(sha256(block_id.encode())[:8], "little")``; token i is
    ``reserved + splitmix64(k + i) mod (vocab_size - reserved)`` (all arithmetic mod 2**64;
    splitmix64 as in Steele et al. 2014). Ids below `reserved` are left for special tokens.
    """
    if vocab_size <= reserved or reserved < 0:
        raise TraceError(
            f"vocab_size must be larger than reserved >= 0 (got vocab_size={vocab_size}, "
            f"reserved={reserved})"
        )
    if tokens < 0:
        raise TraceError(f"block {block_id!r}: tokens must be >= 0, got {tokens}")
    return _block_ids_cached(block_id, int(tokens), int(vocab_size), int(reserved))


# --------------------------------------------------------------------------------------------
# Validation shared by construction and loading


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _request_problem(req: TraceRequest) -> str | None:
    """What is wrong with one request on its own, or None."""
    if not isinstance(req.request_id, str) or not req.request_id:
        return f"request_id must be a non-empty string, got {req.request_id!r}"
    a = req.arrival_s
    if isinstance(a, bool) or not isinstance(a, int | float) or not math.isfinite(a) or a < 0:
        return f"arrival_s must be a finite number >= 0, got {a!r}"
    if not isinstance(req.blocks, tuple) or not req.blocks:
        return "blocks must be a non-empty list of [block_id, tokens]"
    for i, block in enumerate(req.blocks):
        if not isinstance(block, tuple) or len(block) != 2:
            return f"block {i} must be a [block_id, tokens] pair, got {block!r}"
        block_id, tokens = block
        if not isinstance(block_id, str) or not block_id:
            return f"block {i}: block_id must be a non-empty string, got {block_id!r}"
        if not _is_int(tokens) or tokens < 1:
            return f"block {i} ({block_id}): tokens must be an integer >= 1, got {tokens!r}"
    if not _is_int(req.max_tokens) or req.max_tokens < 1:
        return f"max_tokens must be an integer >= 1, got {req.max_tokens!r}"
    if req.phase is not None and not isinstance(req.phase, str):
        return f"phase must be a string or null, got {req.phase!r}"
    if not isinstance(req.tags, Mapping):
        return f"tags must be an object, got {req.tags!r}"
    if req.tenant is not None and (not isinstance(req.tenant, str) or not req.tenant):
        return f"tenant must be a non-empty string (or absent), got {req.tenant!r}"
    if not _is_int(req.priority):
        return f"priority must be an integer, got {req.priority!r}"
    return None


class _TraceChecker:
    """Checks across requests: arrival order, unique ids, one token count per block id."""

    def __init__(self) -> None:
        self.last_arrival = -math.inf
        self.ids: set[str] = set()
        self.block_tokens: dict[str, int] = {}

    def add(self, req: TraceRequest) -> str | None:
        if req.arrival_s < self.last_arrival:
            return (
                f"arrival_s goes backwards ({req.arrival_s} after {self.last_arrival}); "
                "requests must be in arrival order"
            )
        if req.request_id in self.ids:
            return f"duplicate request_id {req.request_id!r}"
        for block_id, tokens in req.blocks:
            known = self.block_tokens.setdefault(block_id, tokens)
            if known != tokens:
                return (
                    f"block {block_id!r} has {tokens} tokens here but {known} earlier; a block "
                    "id must always have one token count"
                )
        self.last_arrival = req.arrival_s
        self.ids.add(req.request_id)
        return None


# --------------------------------------------------------------------------------------------
# Writing


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:
        raise TraceError(f"cannot write {value!r}: {exc}") from None


def _format_arrival(arrival_s: float) -> str:
    return format(float(arrival_s) + 0.0, ".6f")


def header_line(header: TraceHeader) -> str:
    """The header as one JSON line (no newline), keys in file order."""
    data = header.to_json()
    return "{" + ",".join(f"{json.dumps(k)}:{_dumps(data[k])}" for k in _HEADER_KEYS) + "}"


def request_line(req: TraceRequest) -> str:
    """One request as one JSON line (no newline), keys in file order.

    ``tenant`` and ``priority`` are written only when set (a tenant, a priority other than 0),
    after ``tags``: a trace without them has the bytes it had before they existed.
    """
    blocks = ",".join(f"[{json.dumps(b)},{n}]" for b, n in req.blocks)
    extra = ""
    if req.tenant is not None:
        extra += f',"tenant":{json.dumps(req.tenant)}'
    if req.priority != 0:
        extra += f',"priority":{req.priority}'
    return (
        f'{{"request_id":{json.dumps(req.request_id)},'
        f'"arrival_s":{_format_arrival(req.arrival_s)},'
        f'"blocks":[{blocks}],'
        f'"max_tokens":{req.max_tokens},'
        f'"phase":{json.dumps(req.phase)},'
        f'"tags":{_dumps(dict(req.tags))}{extra}}}'
    )


def trace_lines(trace: Trace) -> Iterator[str]:
    """Every line of the file, newline included."""
    yield header_line(trace.header) + "\n"
    for req in trace.requests:
        yield request_line(req) + "\n"


def trace_bytes(trace: Trace) -> bytes:
    """The uncompressed file content."""
    return "".join(trace_lines(trace)).encode("utf-8")


def write_trace(trace: Trace, path: str | Path) -> Path:
    """Write `trace` (gzipped when the name ends in ``.gz``); same trace => same bytes."""
    path = Path(path)
    data = trace_bytes(trace)
    if path.suffix == ".gz":
        buf = io.BytesIO()
        # mtime=0 and no file name in the gzip header keep the bytes reproducible.
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz:
            gz.write(data)
        data = buf.getvalue()
    if not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# --------------------------------------------------------------------------------------------
# Loading


def _open_text(path: Path) -> Iterable[str]:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return f.read().splitlines()
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise TraceError(f"trace file {str(path)!r} not found") from None
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise TraceError(f"cannot read trace file {str(path)!r}: {exc}") from None


def _parse_header(obj: Any) -> TraceHeader:
    if not isinstance(obj, dict):
        raise ValueError("the first line must be a JSON object (the trace header)")
    if obj.get("fairway_trace") != FORMAT_VERSION:
        raise ValueError(
            f'not a Fairway trace header: expected "fairway_trace": {FORMAT_VERSION}, got '
            f"{obj.get('fairway_trace')!r}"
        )
    missing = [k for k in _REQUIRED_HEADER_KEYS if k not in obj]
    if missing:
        raise ValueError(f"header is missing {', '.join(missing)}")
    if not isinstance(obj["family"], str):
        raise ValueError(f"header family must be a string, got {obj['family']!r}")
    if not _is_int(obj["seed"]):
        raise ValueError(f"header seed must be an integer, got {obj['seed']!r}")
    if not _is_int(obj["num_requests"]) or obj["num_requests"] < 0:
        raise ValueError(
            f"header num_requests must be an integer >= 0, got {obj['num_requests']!r}"
        )
    if not isinstance(obj["params"], dict):
        raise ValueError("header params must be an object")
    try:
        phases = tuple(
            PhaseWindow(str(p["name"]), float(p["start_s"]), float(p["end_s"]), float(p["load"]))
            for p in obj.get("phases") or ()
        )
    except (KeyError, TypeError, ValueError):
        raise ValueError("header phases must be objects with name, start_s, end_s, load") from None
    capacity = obj.get("capacity_tps")
    duration = obj.get("duration_s")
    return TraceHeader(
        family=obj["family"],
        seed=obj["seed"],
        shape=obj["shape"],
        params=obj["params"],
        num_requests=obj["num_requests"],
        capacity_tps=None if capacity is None else float(capacity),
        preset=obj.get("preset"),
        duration_s=None if duration is None else float(duration),
        phases=phases,
        info=obj.get("info") or {},
    )


def _parse_request(obj: Any) -> TraceRequest:
    if not isinstance(obj, dict):
        raise ValueError("a request line must be a JSON object")
    missing = [k for k in ("request_id", "arrival_s", "blocks") if k not in obj]
    if missing:
        raise ValueError(f"missing key {', '.join(missing)}")
    unknown = sorted(set(obj) - set(_REQUEST_KEYS))
    if unknown:
        raise ValueError(f"unknown key {', '.join(unknown)} (allowed: {', '.join(_REQUEST_KEYS)})")
    raw_blocks = obj["blocks"]
    if not isinstance(raw_blocks, list):
        raise ValueError("blocks must be a list of [block_id, tokens]")
    blocks = tuple(tuple(b) if isinstance(b, list) else b for b in raw_blocks)
    req = TraceRequest.__new__(TraceRequest)
    # Bypass __post_init__ so that the problem text (not a TraceError) reaches the caller.
    for name, value in (
        ("request_id", obj["request_id"]),
        ("arrival_s", obj["arrival_s"]),
        ("blocks", blocks),
        ("max_tokens", obj.get("max_tokens", 1)),
        ("phase", obj.get("phase")),
        ("tags", obj.get("tags") or {}),
        ("tenant", obj.get("tenant")),
        ("priority", obj.get("priority", 0)),
    ):
        object.__setattr__(req, name, value)
    problem = _request_problem(req)
    if problem:
        raise ValueError(problem)
    if isinstance(req.arrival_s, int):
        object.__setattr__(req, "arrival_s", float(req.arrival_s))
    return req


def load_trace(path: str | Path) -> Trace:
    """Read and validate a trace file; errors name the file, the first bad line and the problem."""
    path = Path(path)
    lines = _open_text(path)
    if not lines:
        raise TraceError(f"{path}:1: empty file, expected a trace header")
    requests: list[TraceRequest] = []
    checker = _TraceChecker()
    header: TraceHeader | None = None
    for lineno, text in enumerate(lines, start=1):
        if not text.strip():
            raise TraceError(f"{path}:{lineno}: empty line")
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(
                f"{path}:{lineno}: bad JSON ({exc.msg} at column {exc.colno})"
            ) from None
        try:
            if header is None:
                header = _parse_header(obj)
                continue
            req = _parse_request(obj)
            problem = checker.add(req)
            if problem:
                raise ValueError(problem)
        except ValueError as exc:
            raise TraceError(f"{path}:{lineno}: {exc}") from None
        requests.append(req)
    assert header is not None
    if header.num_requests != len(requests):
        raise TraceError(
            f"{path}:1: header says num_requests={header.num_requests} but the file has "
            f"{len(requests)} request lines"
        )
    return Trace(header, tuple(requests))


def make_request(
    request_id: str,
    arrival_s: float,
    blocks: Sequence[Block],
    phase: str | None = None,
    tags: Mapping[str, Any] | None = None,
    max_tokens: int = 1,
    tenant: str | None = None,
    priority: int = 0,
) -> TraceRequest:
    """Builder helper: a request with `arrival_s` rounded to the file's microsecond resolution."""
    return TraceRequest(
        request_id=request_id,
        arrival_s=round(float(arrival_s), 6),
        blocks=tuple((b, int(n)) for b, n in blocks),
        max_tokens=max_tokens,
        phase=phase,
        tags=dict(tags or {}),
        tenant=tenant,
        priority=priority,
    )
