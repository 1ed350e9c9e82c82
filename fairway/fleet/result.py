"""What a fleet replay produced: the fleet-wide `ReplayResult`, each node's figures, the balance.

The fleet-wide result is an ordinary `ReplayResult` (every request, each tagged with the node it
ran on), so the summaries and reports of `fairway bench` read it as they are. On top, per node:
its requests, TTFT percentiles, cache hit share and prefill tokens computed; and the fleet's
balance: the busiest node over the mean, by tokens computed and by requests (1.0: perfectly even).
One JSON file per fleet replay (`FORMAT`). Must not import vllm.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fairway.fleet.routing import FleetSignals
from fairway.replay import results as results_io
from fairway.replay.results import ReplayResult, RequestResult, ResultError
from fairway.replay.summary import ttft_stats

#: Written into every file so a later layout change is detected instead of misread.
FORMAT = "fairway.fleet_result/1"


def hit_share(requests: Sequence[RequestResult]) -> float | None:
    """Share of the requests that were cache hits (`RequestResult.hit`, the replay's
    `HIT_SHARE` definition) among those whose hit is known; None when none is."""
    known = [r.hit for r in requests if r.hit is not None]
    return sum(known) / len(known) if known else None


def tokens_computed(requests: Sequence[RequestResult]) -> int:
    """Prefill tokens computed: every request's prompt minus its cached tokens at admission (a
    request never admitted counts its whole prompt; recomputation after preemption not
    counted), as E2 counts them."""
    return sum(r.prompt_tokens - (r.cached_tokens or 0) for r in requests)


@dataclass(frozen=True)
class NodeStats:
    """One node's share of a fleet replay.

    Attributes:
        node: the node's index.
        requests: requests routed to it.
        errors: of those, the ones without a first token.
        ttft_p50_s / ttft_p90_s / ttft_p99_s: TTFT percentiles of its answered requests
            (None: none answered).
        hit_share: share of its requests that were cache hits (None: none known).
        tokens_computed: prefill tokens it computed (`tokens_computed`).
        steps: engine steps that scheduled something.
    """

    node: int
    requests: int
    errors: int
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    hit_share: float | None
    tokens_computed: int
    steps: int


def node_stats(requests: Sequence[RequestResult], steps: Sequence[int],
               tag: str) -> list[NodeStats]:
    """Each node's figures from the fleet-wide results (a request's node in `tags[tag]`)."""
    by_node: list[list[RequestResult]] = [[] for _ in steps]
    for r in requests:
        node = r.tags.get(tag)
        if isinstance(node, int) and 0 <= node < len(steps):
            by_node[node].append(r)
    out = []
    for k, reqs in enumerate(by_node):
        ttfts = [t for t in (r.ttft_s for r in reqs) if t is not None]
        p50, p90, p99, _ = ttft_stats(ttfts)
        out.append(NodeStats(k, len(reqs), len(reqs) - len(ttfts), p50, p90, p99,
                             hit_share(reqs), tokens_computed(reqs), steps[k]))
    return out


def max_over_mean(values: Sequence[float]) -> float | None:
    """The largest value over the mean (1.0: even; N: all on one of N); None when all are 0."""
    if not values:
        return None
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else None


def fleet_settings(num_nodes: int, router: str, router_params: Mapping[str, Any] | None,
                   seed: int, signals: FleetSignals, cache_fraction: float, kv_events: bool,
                   router_read_events: bool | None) -> dict[str, Any]:
    """The settings' `fleet` entry: what makes the fleet (the rest is each node's, as a single
    replay's settings; `kv_cache` there is one node's)."""
    return {
        "num_nodes": num_nodes,
        "router": router,
        "router_params": dict(router_params or {}),
        "seed": seed,
        "signals": asdict(signals),
        "cache_fraction": cache_fraction,
        "kv_events": kv_events,
        "router_read_kv_events": bool(router_read_events),
    }


@dataclass
class FleetResult:
    """One trace replayed on a fleet under one router and one policy.

    Attributes:
        replay: the fleet-wide result; each request's `tags["node"]` is its node.
        router: the router's registry name.
        num_nodes: the fleet's size.
        nodes: each node's figures, by index.
    """

    replay: ReplayResult
    router: str
    num_nodes: int
    nodes: list[NodeStats] = field(default_factory=list)

    @property
    def label(self) -> str:
        """`policy @ router`: the row's name in tables."""
        return f"{self.replay.policy} @ {self.router}"

    def balance(self) -> dict[str, float | None]:
        """The busiest node over the mean, by tokens computed and by requests."""
        return {
            "tokens_computed": max_over_mean([n.tokens_computed for n in self.nodes]),
            "requests": max_over_mean([n.requests for n in self.nodes]),
        }

    def summary(self) -> dict[str, Any]:
        """The table row: fleet-wide TTFT p50/p90/p99, hit share, tokens computed, balance and
        the worst node's p99."""
        requests = self.replay.requests
        ttfts = [t for t in (r.ttft_s for r in requests) if t is not None]
        p50, p90, p99, _ = ttft_stats(ttfts)
        node_p99 = [n.ttft_p99_s for n in self.nodes if n.ttft_p99_s is not None]
        return {
            "trace": self.replay.trace_name,
            "policy": self.replay.policy,
            "router": self.router,
            "nodes": self.num_nodes,
            "requests": len(requests),
            "errors": self.replay.n_errors,
            "ttft_p50_s": p50,
            "ttft_p90_s": p90,
            "ttft_p99_s": p99,
            "hit_share": hit_share(requests),
            "tokens_computed": tokens_computed(requests),
            "balance_tokens": self.balance()["tokens_computed"],
            "balance_requests": self.balance()["requests"],
            "node_p99_max_s": max(node_p99) if node_p99 else None,
            "kv_blocks": self.replay.settings.get("kv_cache", {}).get("num_blocks"),
            "wall_s": self.replay.wall_s,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "router": self.router,
            "num_nodes": self.num_nodes,
            "nodes": [asdict(n) for n in self.nodes],
            "balance": self.balance(),
            "replay": self.replay.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> FleetResult:
        """Inverse of `to_dict`; a wrong format or bad fields raise `ResultError`."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ResultError(f"not a fleet result: format is {found!r}, expected {FORMAT!r}")
        try:
            nodes = [NodeStats(**n) for n in data["nodes"]]
            return cls(ReplayResult.from_dict(data["replay"]), str(data["router"]),
                       int(data["num_nodes"]), nodes)
        except (KeyError, TypeError) as exc:
            raise ResultError(f"fleet result: {exc}") from exc


def file_name(result: FleetResult) -> str:
    """`<trace>--<policy>--<router>.json` (path-safe)."""
    safe = results_io.safe_name
    return f"{safe(result.replay.trace_name)}--{safe(result.replay.policy)}--" \
           f"{safe(result.router)}.json"


def save(result: FleetResult, path: str | Path) -> Path:
    """Write `result` as JSON (sorted keys, no NaN) to `path`, parent folders created."""
    for r in result.replay.requests:
        for t in (r.arrival_s, r.first_scheduled_s, r.first_token_s):
            if t is not None and not math.isfinite(t):
                raise ValueError(f"request {r.request_id}: time {t!r} is not finite")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_dict(), sort_keys=True, indent=1, allow_nan=False,
                               default=results_io._json_default) + "\n", encoding="utf-8")
    return path


def load(path: str | Path) -> FleetResult:
    """Read a file written by `save`."""
    path = Path(path)
    try:
        return FleetResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except OSError as exc:
        raise ResultError(f"cannot read fleet result {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ResultError(f"fleet result {path} is not JSON: {exc}") from exc
