"""Reading a server's Prometheus `/metrics` for `fairway inspect`: fetch, parse, and the window's
arithmetic (a counter's increase, a histogram's buckets and quantiles between two scrapes).

Why apart from `fairway.inspection`: this is the generic half, true of any Prometheus text; the
report there knows which series mean what. No vLLM import: only HTTP (`fairway.client`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from fairway.errors import FairwayError

Samples = dict[str, list[tuple[dict[str, str], float]]]


class InspectError(FairwayError):
    """The server's /metrics cannot be read (not running, wrong URL, not Prometheus text)."""


def metrics_url(url: str) -> str:
    """`.../metrics` from a base URL given with or without `/v1` or `/metrics`."""
    url = url.rstrip("/")
    if url.endswith("/metrics"):
        return url
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return f"{url}/metrics"


def fetch_metrics(url: str, timeout_s: float = 10.0) -> str:
    """GET the Prometheus text at `url` (with the project's one HTTP client, `fairway.client`).

    Raises:
        InspectError: no answer, or an answer other than 200.
    """
    import aiohttp

    from fairway import client

    hint = "is the server running? (`fairway serve MODEL` or `vllm serve MODEL`) Check the URL"
    try:
        return client.fetch_text(url, timeout_s)
    except client.HTTPStatusError as exc:
        raise InspectError(f"GET {url} answered HTTP {exc.status}; {hint}") from None
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        raise InspectError(f"cannot read {url}: {client.describe(exc)}; {hint}") from None


def parse(text: str) -> Samples:
    """Sample name -> [(labels, value)] of a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: Samples = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[sample.name].append((dict(sample.labels), float(sample.value)))
    except ValueError as exc:
        raise InspectError(f"the answer is not Prometheus text: {exc}") from None
    return dict(samples)


def total(samples: Samples, name: str, **match: str) -> float | None:
    """Sum of the samples of `name` whose labels include `match`; None when there is none."""
    values = [v for labels, v in samples.get(name, ()) if _matches(labels, match)]
    return math.fsum(values) if values else None


def _matches(labels: Mapping[str, str], match: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match.items())


def delta(before: Samples, after: Samples, name: str, **match: str) -> float | None:
    """Increase of a counter over the window (a reset counts from 0); None when absent."""
    end = total(after, name, **match)
    if end is None:
        return None
    start = total(before, name, **match) or 0.0
    return end - start if end >= start else end


def bucket_deltas(
    before: Samples, after: Samples, histogram: str, **match: str
) -> list[tuple[float, float]]:
    """[(le, cumulative count)] of the window for `histogram`, summed over other labels."""
    counts: dict[float, float] = defaultdict(float)
    for sign, samples in ((-1.0, before), (1.0, after)):
        for labels, value in samples.get(f"{histogram}_bucket", ()):
            if _matches(labels, match):
                counts[float(labels["le"])] += sign * value
    return sorted((le, max(n, 0.0)) for le, n in counts.items())


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile of a cumulative histogram, linear within the bucket (None: no data)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, cumulative in buckets:
        if cumulative >= rank and cumulative > below:
            if math.isinf(le):
                return lower  # beyond the largest finite bound: that bound, as PromQL does
            return lower + (le - lower) * (rank - below) / (cumulative - below)
        lower, below = le, cumulative
    return lower


def latency(before: Samples, after: Samples, histogram: str, **match: str) -> dict[str, Any]:
    """{"n", "median_s", "p99_s"} of a latency histogram over the window."""
    buckets = bucket_deltas(before, after, histogram, **match)
    n = buckets[-1][1] if buckets else 0.0
    return {"n": round(n), "median_s": quantile(buckets, 0.5), "p99_s": quantile(buckets, 0.99)}
