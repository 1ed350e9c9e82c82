"""docs/grafana-dashboard.json loads, and every PromQL expression names a series that exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram

from fairway.vllm import metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
_NAME = re.compile(r"\b[a-zA-Z_]\w*:[\w:]+")
_SUFFIXES = {Counter: ("_total",), Gauge: ("",), Histogram: ("_bucket", "_sum", "_count")}


def _fairway_samples() -> set[str]:
    """Sample names of every `fairway:` collector (counter foo -> foo_total, ...)."""
    names = set()
    collectors = {**metrics.collectors(), **metrics.latency_collectors(),
                  **{f"tenant_{k}": v for k, v in metrics.tenant_collectors().items()}}
    for collector in collectors.values():
        for kind, suffixes in _SUFFIXES.items():
            if isinstance(collector, kind):
                names |= {collector._name + s for s in suffixes}
    return names


def _vllm_samples() -> set[str]:
    source = _vllm_source()
    families = set(re.findall(r'name="(vllm:[\w:]+)"', source))
    return {f + s for f in families for s in ("", "_total", "_bucket", "_sum", "_count")}


def _vllm_source() -> str:
    """vLLM's metrics module as text (found, not imported: no vLLM import in unit tests)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "v1" / "metrics" / "loggers.py"
    return path.read_text()


def _exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_dashboard_is_valid_json_with_panels():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 6
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_every_expression_names_an_existing_series():
    known = _fairway_samples() | _vllm_samples()
    dashboard = json.loads(DASHBOARD.read_text())
    used = set()
    for expr in _exprs(dashboard):
        names = set(_NAME.findall(expr))
        assert names, f"no metric in {expr!r}"
        unknown = names - known
        assert not unknown, f"{expr!r} names unknown series {sorted(unknown)}"
        used |= names
    # the new hit/miss histograms and the work spread are on the dashboard
    assert {"fairway:ttft_seconds_bucket", "fairway:queue_time_seconds_bucket",
            "fairway:queue_work_max_tokens", "fairway:oldest_waiting_age_seconds",
            "fairway:lane_prefill_tokens_total", "vllm:time_to_first_token_seconds_bucket"} <= used
    # the per-tenant series (option tenants)
    assert {"fairway:tenant_prefill_tokens_total", "fairway:tenant_waiting_requests",
            "fairway:tenant_time_to_first_token_seconds_bucket"} <= used


def test_the_name_check_can_fail():
    known = _fairway_samples() | _vllm_samples()
    assert "fairway:no_such_series_total" not in known
    assert "fairway:steps_ordered_total" in known and "fairway:steps_ordered_bucket" not in known
