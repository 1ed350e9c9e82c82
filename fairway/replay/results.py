"""Per-request results shared by the virtual-clock and the live replay, and their JSON files.

One `ReplayResult` = one trace replayed under one policy = one JSON file. Errored requests stay in
the file (with `error` set), because a failure is a data point of the policy, not noise to filter.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fairway.errors import FairwayError

if TYPE_CHECKING:
    from fairway.traces.format import Trace

logger = logging.getLogger(__name__)

#: Written into every file so a future layout change can be detected instead of misread.
FORMAT = "fairway.replay_result/1"
#: A request is a cache *hit* when the prefix cache served at least this share of its prompt when
#: the engine first scheduled it (`RequestResult.cached_tokens`), else a *miss*. Half, because the
#: workloads this split is about are bimodal (a long cached prefix and a short suffix, or nothing
#: cached at all): any threshold between them gives the same split, and half is the natural one.
HIT_SHARE = 0.5
#: The definition in words, for reports.
HIT_DEFINITION = (
    f"hit: the prefix cache held >= {HIT_SHARE:.0%} of the prompt when the request was first "
    "scheduled (virtual replay: the engine's computed tokens at admission; live replay: the "
    "server's `usage.prompt_tokens_details.cached_tokens`); miss: less"
)


class ResultError(FairwayError, ValueError):
    """A result file that cannot be read (missing, not JSON, wrong format or fields)."""


@dataclass(slots=True)
class RequestResult:
    """What happened to one trace request.

    All times are seconds on the replay's clock: the virtual clock in `fairway bench`, seconds since
    the start of the replay in `fairway replay --url`.

    Attributes:
        request_id: the trace's request id.
        arrival_s: when the request entered the system (virtual: trace arrival; live: send
            time). A closed-loop session turn enters at its release (its parent's first token
            plus its think time) and keeps the trace's arrival in `tags["recorded_arrival_s"]`
            (`fairway.replay.sessions`).
        phase: the trace's phase label (calm, burst, spike, ...) or None.
        prompt_tokens: prompt length in tokens.
        first_scheduled_s: when the engine first scheduled it (virtual replay only; None live).
        first_token_s: when its first output token arrived; None if it never did.
        cached_tokens: prefix-cache hit in tokens when it was scheduled, if known (with a CPU
            offload tier: the GPU hit plus the tokens loaded from the tier).
        error: why it failed ("HTTP 500: ...", "timeout after 30 s", "interrupted"), or None.
        tags: the trace's free-form tags, copied so reports can group by them.
        tenant: the trace request's tenant (None: the default tenant).
        priority: the trace request's vLLM priority (0: vLLM's default).
        tier_tokens: tokens vLLM loaded for it from the CPU offload tier (`--kv-offloading-size`);
            None without a tier, and then left out of the file (files without a tier are
            unchanged).
    """

    request_id: str
    arrival_s: float
    phase: str | None
    prompt_tokens: int
    first_scheduled_s: float | None
    first_token_s: float | None
    cached_tokens: int | None
    error: str | None = None
    tags: dict[str, Any] = field(default_factory=dict)
    tenant: str | None = None
    priority: int = 0
    tier_tokens: int | None = None

    @property
    def ttft_s(self) -> float | None:
        """Time to first token in seconds; None when the request errored or produced no token."""
        if self.error is not None or self.first_token_s is None:
            return None
        return self.first_token_s - self.arrival_s

    @property
    def hit(self) -> bool | None:
        """Cache hit (`HIT_SHARE` of the prompt cached at admission) or miss; None if unknown.

        Unknown when the replay did not learn the cached tokens: a live server that does not
        report them, or a request that was never scheduled.
        """
        if self.cached_tokens is None:
            return None
        return self.cached_tokens >= HIT_SHARE * self.prompt_tokens

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields (no derived values: `ttft_s` is recomputed on load);
        `tier_tokens` only when a tier was configured."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.tier_tokens is None:
            del data["tier_tokens"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestResult:
        """Inverse of `to_dict`; unknown or missing required fields raise `ResultError`.

        Fields with a default may be absent (files written before `tenant` and `priority`;
        `tier_tokens` without a tier).
        """
        return _construct(cls, data, "request")


@dataclass(slots=True)
class ReplayResult:
    """One trace replayed under one policy.

    Attributes:
        policy: registry name of the policy (the report's row label and reference lookup key).
        trace_name: name of the trace, so results of several traces can be reported together.
        settings: everything needed to reproduce the run (policy parameters, cost model, URL, ...).
        requests: one record per trace request, errored ones included, in trace order.
        wall_s: real seconds the replay took.
        simulated_s: virtual seconds simulated (virtual replay), None for a live replay.
    """

    policy: str
    trace_name: str
    settings: dict[str, Any]
    requests: list[RequestResult]
    wall_s: float
    simulated_s: float | None

    @property
    def n_errors(self) -> int:
        """Requests that have no TTFT (errored or never answered)."""
        return sum(1 for r in self.requests if r.ttft_s is None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, tagged with `FORMAT`."""
        return {
            "format": FORMAT,
            "policy": self.policy,
            "trace_name": self.trace_name,
            "settings": self.settings,
            "wall_s": self.wall_s,
            "simulated_s": self.simulated_s,
            "requests": [r.to_dict() for r in self.requests],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplayResult:
        """Inverse of `to_dict`; a wrong `format` or bad fields raise `ResultError`."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ResultError(f"not a replay result: format is {found!r}, expected {FORMAT!r}")
        body = {k: v for k, v in data.items() if k != "format"}
        raw_requests = body.pop("requests", None)
        if not isinstance(raw_requests, list):
            raise ResultError("replay result: 'requests' must be a list")
        body["requests"] = [RequestResult.from_dict(r) for r in raw_requests]
        return _construct(cls, body, "replay result")


def _construct(cls: type, data: Any, what: str) -> Any:
    """Build dataclass `cls` from `data`, turning a shape mismatch into a readable `ResultError`."""
    if not isinstance(data, dict):
        raise ResultError(f"{what}: expected an object, got {type(data).__name__}")
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ResultError(f"{what}: unknown fields {unknown}; known fields: {', '.join(known)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ResultError(f"{what}: {exc}") from exc


def dumps(result: ReplayResult) -> str:
    """Serialize deterministically: sorted keys, fixed indentation, NaN refused.

    The same result always gives the same bytes, so two runs with one seed can be diffed.
    """
    return json.dumps(result.to_dict(), sort_keys=True, indent=1, allow_nan=False,
                      default=_json_default) + "\n"


def _json_default(value: Any) -> Any:
    """Convert the few non-JSON types that settings commonly hold; anything else is a bug."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"cannot store {type(value).__name__} {value!r} in a result file")


def save(result: ReplayResult, path: str | Path) -> Path:
    """Write `result` to `path` (parent folders created) and return the path.

    Raises:
        ValueError: a time is NaN or infinite (it would not round-trip through JSON).
    """
    for r in result.requests:
        for t in (r.arrival_s, r.first_scheduled_s, r.first_token_s):
            if t is not None and not math.isfinite(t):
                raise ValueError(f"request {r.request_id}: time {t!r} is not finite")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(result), encoding="utf-8")
    logger.debug("wrote %d request results to %s", len(result.requests), path)
    return path


def load(path: str | Path) -> ReplayResult:
    """Read a file written by `save`.

    Raises:
        ResultError: the file is missing, not JSON, or not a replay result.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ResultError(f"cannot read result file {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ResultError(f"result file {path} is not JSON: {exc}") from exc
    try:
        return ReplayResult.from_dict(data)
    except ResultError as exc:
        raise ResultError(f"{path}: {exc}") from exc


def default_trace_name(trace: Trace) -> str:
    """`<preset or family>-seed<seed>`: the header fields that identify a built trace.

    A result's `trace_name` when the caller gives none, the same for the virtual and the live
    replay, so their results of one trace are reported together.
    """
    header = trace.header
    return f"{header.preset or header.family}-seed{header.seed}"


def file_name(result: ReplayResult) -> str:
    """A file name made of the run's parameters: `<trace>--<policy>.json` (path-safe)."""
    return f"{safe_name(result.trace_name)}--{safe_name(result.policy)}.json"


def safe_name(text: str) -> str:
    """`text` with everything but letters, digits and `-_.` replaced by `_` (for file names)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text) or "_"
