"""Per-tenant bookkeeping (`TenantLabels`, `FairwayStats`' tenant fields) and `fairway inspect`'s
tenant lines, from a scrape text and a decision trace (no vLLM: the scheduler side is in
tests/integration/test_tenant_metrics.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fairway import cli, inspection
from fairway.inspection_scrape import InspectError, parse
from fairway.inspection_text import render
from fairway.tenants import TenantTable
from fairway.vllm.metrics import LATENCY_BUCKETS, FairwayStats, TenantLabels
from tests.unit.stub_server import serve_app

FW = {"model_name": "tiny", "engine": "0", "policy": "fairway"}


def _request(rid: str, tenant: str | None) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, tenant=tenant)


def test_labels_are_cached_per_request_and_bounded():
    table = TenantTable.parse({"a": 1, "b": 2})
    calls: list[str] = []

    def tenant_of(request):
        calls.append(request.request_id)
        return request.tenant

    labels = TenantLabels(table, tenant_of)
    assert labels.labels == ("default", "a", "b", "other")
    r = [_request("r1", "a"), _request("r2", "zz"), _request("r3", None), _request("r4", "b")]
    assert [labels.of(x) for x in r] == ["a", "other", "default", "b"]
    assert [labels.of(x) for x in r] == ["a", "other", "default", "b"]
    assert calls == ["r1", "r2", "r3", "r4"]  # looked up once each
    assert labels.count(r + r[:1]) == {"default": 1, "a": 2, "b": 1, "other": 1}
    assert labels.count([]) == {"default": 0, "a": 0, "b": 0, "other": 0}
    labels.prune({"r1"}, 1)  # 4 <= 2 * 1 + 64: kept
    assert len(labels.cache) == 4
    for k in range(100):
        labels.of(_request(f"gone{k}", "a"))
    labels.prune({"r1", "r4"}, 2)
    assert labels.cache == {"r1": "a", "r4": "b"}


def test_stats_take_reset_and_add_carry_the_tenant_fields():
    stats = FairwayStats()
    assert stats.tenant_prefill_tokens == {} and stats.tenant_waiting is None
    stats.tenant_prefill_tokens.update({"a": 64, "other": 3})
    stats.tenant_waiting = {"a": 2, "default": 0}
    taken = stats.take()
    assert taken.tenant_prefill_tokens == {"a": 64, "other": 3}
    assert taken.tenant_waiting == {"a": 2, "default": 0}
    assert stats.tenant_prefill_tokens == {"a": 0, "other": 0} and stats.tenant_waiting is None
    totals = FairwayStats()
    totals.add(taken)
    totals.add(taken)
    assert totals.tenant_prefill_tokens == {"a": 128, "other": 6}
    assert totals.tenant_waiting == {"a": 2, "default": 0}
    tokens = stats.tenant_prefill_tokens
    tokens["a"] += 5
    stats.tenant_waiting = {"a": 1}
    stats.reset()  # in place
    assert stats.tenant_prefill_tokens is tokens and tokens == {"a": 0, "other": 0}
    assert stats.tenant_waiting is None and taken.tenant_prefill_tokens["a"] == 64


# --- fairway inspect ------------------------------------------------------------------------------


def _scrape(tokens: dict[str, int], waiting: dict[str, int], ttft: dict[str, list[float]],
            steps: int) -> str:
    """A /metrics text with the tenant series (as prometheus_client writes it)."""
    reg = CollectorRegistry()
    Counter("fairway:steps_ordered", "", list(FW), registry=reg).labels(**FW).inc(steps)
    prefill = Counter("fairway:tenant_prefill_tokens", "", [*FW, "tenant"], registry=reg)
    gauge = Gauge("fairway:tenant_waiting_requests", "", [*FW, "tenant"], registry=reg)
    hist = Histogram("fairway:tenant_time_to_first_token_seconds", "", [*FW, "tenant"],
                     registry=reg, buckets=LATENCY_BUCKETS)
    for tenant in ("default", "a", "b", "other"):
        prefill.labels(**FW, tenant=tenant).inc(tokens.get(tenant, 0))
        gauge.labels(**FW, tenant=tenant).set(waiting.get(tenant, 0))
        child = hist.labels(**FW, tenant=tenant)
        for seconds in ttft.get(tenant, ()):
            child.observe(seconds)
    return generate_latest(reg).decode()


def _window(*texts: str) -> inspection.Window:
    scrapes = [parse(t) for t in texts]
    polls = [inspection._poll(s, float(k)) for k, s in enumerate(scrapes)]
    return inspection.Window(url="http://x/metrics", window_s=float(len(texts) - 1),
                             first=scrapes[0], last=scrapes[-1], polls=polls)


BEFORE = _scrape({"a": 100, "b": 50}, {"a": 1}, {"a": [0.2]}, steps=1)
MID = _scrape({"a": 500, "b": 250}, {"a": 7, "b": 3}, {"a": [0.2, 0.3]}, steps=5)
AFTER = _scrape({"a": 700, "b": 450, "other": 100, "default": 0}, {"a": 2, "b": 0},
                {"a": [0.2, 0.3, 0.3, 0.3], "b": [3.0] * 3, "other": [0.05]}, steps=9)


def test_report_gives_each_tenants_tokens_share_waiting_and_ttft():
    report = inspection.summarize(_window(BEFORE, MID, AFTER))
    tenants = report["tenants"]
    assert list(tenants) == ["default", "a", "b", "other"]  # default first, other last
    assert {t: r["prefill_tokens"] for t, r in tenants.items()} == {
        "default": 0, "a": 600, "b": 400, "other": 100}
    assert tenants["a"]["share"] == pytest.approx(600 / 1100)
    assert tenants["default"]["share"] == 0.0
    assert (tenants["a"]["waiting_now"], tenants["a"]["waiting_max"]) == (2, 7)
    assert (tenants["b"]["waiting_now"], tenants["b"]["waiting_max"]) == (0, 3)
    assert tenants["a"]["ttft"]["n"] == 3 and 0.25 < tenants["a"]["ttft"]["median_s"] <= 0.5
    assert tenants["b"]["ttft"]["n"] == 3 and 2.5 < tenants["b"]["ttft"]["p99_s"] <= 5.0
    assert tenants["default"]["ttft"]["n"] == 0
    text = render(report)
    for needle in (
        "  Tenant a      prefill 600 tokens (54.5%); waiting 2 now, up to 7; TTFT median ",
        "  Tenant b      prefill 400 tokens (36.4%); waiting 0 now, up to 3; TTFT median ",
        "  Tenant other  prefill 100 tokens (9.1%); waiting 0 now, up to 0; TTFT median ",
        "  Tenant default prefill 0 tokens (0.0%); waiting 0 now, up to 0; TTFT n/a",
    ):
        assert needle in text, (needle, text)
    assert "Counters" not in text
    json.dumps(report, allow_nan=False)


def test_no_tenant_lines_without_the_series():
    reg = CollectorRegistry()
    Counter("fairway:steps_ordered", "", list(FW), registry=reg).labels(**FW).inc(3)
    text = generate_latest(reg).decode()
    report = inspection.summarize(_window(text, text))
    assert report["fairway_series"] and report["tenants"] is None
    assert "Tenant" not in render(report)


def test_no_tenant_traffic_in_the_window_has_no_share():
    report = inspection.summarize(_window(BEFORE, BEFORE))
    assert report["tenants"]["a"]["prefill_tokens"] == 0
    assert report["tenants"]["a"]["share"] is None
    assert "Tenant a      prefill 0 tokens (n/a)" in render(report)


def _trace(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_trace_tenant_counters_reads_the_last_record_with_counters(tmp_path):
    path = tmp_path / "decisions.jsonl"
    _trace(path, [
        {"step": 1, "time_s": 1.0, "tenant_counters": {"b": 0.0, "a": 10.0}, "head": []},
        {"step": 11, "time_s": 2.0, "tenant_counters": {"b": 64.0, "default": 0.0, "a": 0.0},
         "head": []},
        {"step": 21, "time_s": 3.0, "head": []},  # one tenant waited: no counters
    ])
    last = inspection.trace_tenant_counters(path)
    assert last == {"step": 11, "time_s": 2.0,
                    "counters": {"default": 0.0, "a": 0.0, "b": 64.0}}
    assert list(last["counters"]) == ["default", "a", "b"]
    _trace(path, [{"step": 1, "head": []}])
    assert inspection.trace_tenant_counters(path) is None
    with pytest.raises(InspectError, match="cannot read the decision trace"):
        inspection.trace_tenant_counters(tmp_path / "missing.jsonl")


def test_trace_tail_skips_a_cut_first_line(tmp_path, monkeypatch):
    path = tmp_path / "decisions.jsonl"
    _trace(path, [{"step": k, "tenant_counters": {"a": float(k)}, "pad": "x" * 50}
                  for k in range(1, 30)])
    monkeypatch.setattr(inspection, "TRACE_TAIL_BYTES", 150)
    assert inspection.trace_tenant_counters(path)["step"] == 29


def test_cli_prints_tenant_lines_and_trace_counters(tmp_path, capsys):
    texts = [BEFORE.encode(), AFTER.encode()]
    served = {"n": 0}

    async def metrics(_: web.Request) -> web.Response:
        text = texts[min(served["n"], len(texts) - 1)]
        served["n"] += 1
        return web.Response(body=text, content_type="text/plain")

    trace = tmp_path / "decisions.jsonl"
    _trace(trace, [{"step": 40, "time_s": 9.5,
                    "tenant_counters": {"a": 0.0, "b": 1536.0, "default": 12.5}}])
    app = web.Application()
    app.router.add_get("/metrics", metrics)
    with serve_app(app) as url:
        assert cli.main(["inspect", url, "--window-s", "0.1", "--interval-s", "0.1",
                         "--no-progress", "--decision-trace", str(trace)]) == 0
        out = capsys.readouterr().out
        assert "  Tenant a      prefill 600 tokens (54.5%)" in out, out
        assert ("  Counters      default 12, a 0, b 1,536 (uncached tokens / weight, above the "
                "lowest; decision trace step 40)") in out, out
        served["n"] = 0
        assert cli.main(["inspect", url, "--window-s", "0.1", "--interval-s", "0.1",
                         "--json", "--decision-trace", str(trace)]) == 0
        report = json.loads(capsys.readouterr().out)
    assert report["tenants"]["b"]["prefill_tokens"] == 400
    assert report["tenant_counters"]["counters"] == {"default": 12.5, "a": 0.0, "b": 1536.0}


def test_inspect_help_documents_the_tenant_columns(capsys):
    with pytest.raises(SystemExit):
        cli.main(["inspect", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for needle in ("one line per tenant", "prefill N tokens (S%)", "waiting W now, up to M",
                   "TTFT median X, p99 Y (n=K)", "--decision-trace", "Counters"):
        assert needle in out, needle
