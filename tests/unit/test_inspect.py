"""`fairway inspect` against a stub /metrics server whose series advance between scrapes."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fairway import cli, inspection, inspection_scrape
from fairway.inspection_text import render
from tests.unit.stub_server import serve_app

LABELS = {"model_name": "tiny", "engine": "0"}
FW = {**LABELS, "policy": "fairway"}
BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0)


@dataclass
class State:
    """Cumulative values of one scrape (what a server would export at that moment)."""

    finished: int = 0
    queries: int = 0
    hits: int = 0
    waiting: int = 0
    engine_steps: int = 0
    vllm_ttft: list[float] = field(default_factory=list)
    fairway: bool = True
    steps: int = 0
    placed: dict[str, int] = field(default_factory=lambda: {"fast": 0, "fair": 0, "single": 0})
    fallbacks: int = 0
    prepass: list[float] = field(default_factory=list)
    work: tuple[int, int] | None = None
    oldest_s: float | None = None
    ttft: dict[str, list[float]] = field(default_factory=lambda: {"hit": [], "miss": []})
    queue: dict[str, list[float]] = field(default_factory=lambda: {"hit": [], "miss": []})


def exposition(s: State) -> bytes:
    """The Prometheus text of `s`, written by prometheus_client (the real format)."""
    reg = CollectorRegistry()
    Counter("vllm:request_success", "", [*LABELS, "finished_reason"], registry=reg).labels(
        *LABELS.values(), "length").inc(s.finished)
    Counter("vllm:prefix_cache_queries", "", list(LABELS), registry=reg).labels(
        *LABELS.values()).inc(s.queries)
    Counter("vllm:prefix_cache_hits", "", list(LABELS), registry=reg).labels(
        *LABELS.values()).inc(s.hits)
    Gauge("vllm:num_requests_waiting", "", list(LABELS), registry=reg).labels(
        *LABELS.values()).set(s.waiting)
    steps = Histogram("vllm:iteration_tokens_total", "", list(LABELS), registry=reg,
                      buckets=(1, 512)).labels(*LABELS.values())
    for _ in range(s.engine_steps):
        steps.observe(100)
    ttft = Histogram("vllm:time_to_first_token_seconds", "", list(LABELS), registry=reg,
                     buckets=BUCKETS).labels(*LABELS.values())
    for v in s.vllm_ttft:
        ttft.observe(v)
    if s.fairway:
        _fairway_series(reg, s)
    return generate_latest(reg)


def _fairway_series(reg: CollectorRegistry, s: State) -> None:
    Counter("fairway:steps_ordered", "", list(FW), registry=reg).labels(**FW).inc(s.steps)
    placed = Counter("fairway:requests_placed", "", [*FW, "lane"], registry=reg)
    for lane, n in s.placed.items():
        placed.labels(**FW, lane=lane).inc(n)
    Counter("fairway:policy_fallbacks", "", list(FW), registry=reg).labels(**FW).inc(s.fallbacks)
    prepass = Histogram("fairway:prepass_seconds", "", list(FW), registry=reg,
                        buckets=(1e-3, 1e-2)).labels(**FW)
    for v in s.prepass:
        prepass.observe(v)
    if s.work is not None:
        Gauge("fairway:queue_work_max_tokens", "", list(FW), registry=reg).labels(**FW).set(
            s.work[0])
        Gauge("fairway:queue_work_min_tokens", "", list(FW), registry=reg).labels(**FW).set(
            s.work[1])
    if s.oldest_s is not None:
        Gauge(inspection.SERIES["oldest"], "", list(FW), registry=reg).labels(**FW).set(
            s.oldest_s)
    ttft = Histogram("fairway:ttft_seconds", "", [*FW, "cache"], registry=reg, buckets=BUCKETS)
    queue = Histogram("fairway:queue_time_seconds", "", [*FW, "cache", "lane"], registry=reg,
                      buckets=BUCKETS)
    for cache in ("hit", "miss"):
        for v in s.ttft[cache]:
            ttft.labels(**FW, cache=cache).observe(v)
        for v in s.queue[cache]:
            queue.labels(**FW, cache=cache, lane="fast").observe(v)


@pytest.fixture()
def stub() -> Iterator[tuple[str, list[bytes]]]:
    """A server whose /metrics answers the next text of a list (the last one repeats)."""
    texts: list[bytes] = []
    served = {"n": 0}

    async def metrics(_: web.Request) -> web.Response:
        text = texts[min(served["n"], len(texts) - 1)]
        served["n"] += 1
        return web.Response(body=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    with serve_app(app) as url:
        yield url, texts


def _scrapes(*states: State) -> list[bytes]:
    return [exposition(s) for s in states]


def _loaded() -> list[State]:
    """Before, mid-window, end: 20 finished, 75% hits, a 10x spread, hits fast / misses slow."""
    before = State(finished=5, queries=1000, hits=500, steps=10, engine_steps=10,
                   placed={"fast": 3, "fair": 2, "single": 0}, prepass=[0.001] * 10,
                   work=(800, 80), waiting=1)
    mid = State(**{**before.__dict__, "steps": 30, "work": (1000, 100), "waiting": 6,
                   "oldest_s": 3.0})
    end = State(
        finished=25, queries=5000, hits=3500, steps=50, engine_steps=60, waiting=2,
        placed={"fast": 19, "fair": 6, "single": 0}, fallbacks=0, prepass=[0.001] * 50,
        work=(1200, 100), oldest_s=1.5, vllm_ttft=[0.3] * 20,
        ttft={"hit": [0.3] * 16, "miss": [2.0] * 4},
        queue={"hit": [0.05] * 16, "miss": [1.5] * 4},
    )
    return [before, mid, end]


def _observe(url: str) -> dict:
    ticks = iter(range(100))
    window = inspection.observe(url, window_s=2.0, interval_s=1.0, progress=False,
                                sleep=lambda _: None, clock=lambda: float(next(ticks)))
    return inspection.summarize(window)


def test_report_from_a_fairway_server(stub):
    url, texts = stub
    texts += _scrapes(*_loaded())
    report = _observe(url)
    assert report["fairway_series"] and report["policy"] == ["fairway"]
    assert report["requests"] == {"finished": 20, "waiting_now": 2, "waiting_max": 6}
    assert report["prefix_cache"]["hit_rate"] == pytest.approx(3000 / 4000)
    spread = report["work_spread"]
    assert spread["samples"] == 2 and spread["max"] == pytest.approx(12.0)
    assert spread["largest_tokens"] == 1200 and spread["smallest_tokens"] == 100
    assert report["verdict"]["matters"] and "ordering matters here" in report["verdict"]["text"]
    assert report["lanes"]["admitted"] == {"fair": 4, "fast": 16, "single": 0}
    hit, miss = report["by_cache"]["hit"], report["by_cache"]["miss"]
    assert hit["ttft"]["n"] == 16 and miss["ttft"]["n"] == 4
    assert 0.1 < hit["ttft"]["median_s"] <= 0.5 and 1.0 < miss["ttft"]["median_s"] <= 2.5
    assert miss["queue_time"]["p99_s"] <= 2.5 and hit["queue_time"]["p99_s"] <= 0.1
    assert report["oldest_waiting_s"] == {"now": 1.5, "max": 3.0}
    assert report["fallbacks"] == 0
    pre = report["prepass"]
    assert pre["ordered_steps"] == 40 and pre["total_s"] == pytest.approx(0.04)
    assert pre["engine_steps"] == 50 and pre["share_of_window"] == pytest.approx(0.04 / 2.0)
    text = render(report)
    for needle in ("policy fairway", "hit rate 75.0%", "ordering matters here", "fast 16 (80%)",
                   "hit  TTFT", "miss queue", "Oldest wait   1.50 s now", "Fallbacks     0",
                   "Pre-pass", "estimates from histogram bucket"):
        assert needle in text, (needle, text)
    json.dumps(report, allow_nan=False)


def test_small_spread_says_ordering_matters_little(stub):
    url, texts = stub
    states = _loaded()
    for s in states:
        s.work = (300, 100)
    texts += _scrapes(*states)
    report = _observe(url)
    assert report["work_spread"]["median"] == pytest.approx(3.0)
    assert not report["verdict"]["matters"]
    assert "ordering matters little" in report["verdict"]["text"] and "< 4x" in report[
        "verdict"]["text"]


def test_no_ordered_step_in_the_window(stub):
    url, texts = stub
    texts += _scrapes(State(work=(500, 50)))  # the same scrape every time: nothing moved
    report = _observe(url)
    assert report["work_spread"]["samples"] == 0 and not report["verdict"]["matters"]
    assert "Work spread   n/a" in render(report)


def test_plain_vllm_says_the_fairway_series_are_absent(stub):
    url, texts = stub
    before = State(fairway=False, queries=100, hits=0, waiting=0)
    end = State(fairway=False, finished=12, queries=2100, hits=1000, waiting=8,
                vllm_ttft=[0.3] * 12)
    texts += _scrapes(before, end)
    report = _observe(url)
    assert not report["fairway_series"] and "work_spread" not in report
    assert report["requests"]["finished"] == 12
    assert report["vllm_latency"]["ttft"]["n"] == 12
    assert report["verdict"]["matters"] and "heuristic" in report["verdict"]["text"]
    text = render(report)
    assert "series absent" in text and "hit rate 50.0%" in text


def test_quantile_is_linear_within_a_bucket():
    buckets = [(0.1, 0.0), (0.5, 10.0), (1.0, 20.0), (float("inf"), 20.0)]
    assert inspection_scrape.quantile(buckets, 0.5) == pytest.approx(0.5)
    assert inspection_scrape.quantile(buckets, 0.99) == pytest.approx(0.99)
    assert inspection_scrape.quantile([(1.0, 0.0), (float("inf"), 5.0)], 0.5) == 1.0  # +Inf bucket
    assert inspection_scrape.quantile([(1.0, 0.0), (float("inf"), 0.0)], 0.5) is None


def test_metrics_url():
    assert inspection_scrape.metrics_url("http://h:8000/") == "http://h:8000/metrics"
    assert inspection_scrape.metrics_url("http://h:8000/v1") == "http://h:8000/metrics"
    assert inspection_scrape.metrics_url("http://h:8000/metrics") == "http://h:8000/metrics"


def test_cli_json_and_text(stub, capsys):
    url, texts = stub
    before, _, end = _loaded()
    texts += _scrapes(before, end)  # any number of polls ends on `end`
    assert cli.main(["inspect", url, "--window-s", "0.2", "--interval-s", "0.1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fairway_series"] and report["requests"]["finished"] == 20
    assert cli.main(["inspect", url, "--window-s", "0.1", "--no-progress"]) == 0
    assert "fairway inspect" in capsys.readouterr().out


def test_unreachable_url_exits_2_with_a_clear_message(capsys):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = cli.main(["inspect", f"http://127.0.0.1:{port}", "--window-s", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("fairway: error: cannot read http://127.0.0.1:") and "/metrics" in err
    assert "is the server running?" in err


def test_not_a_metrics_endpoint(capsys):
    app = web.Application()
    with serve_app(app) as url:
        code = cli.main(["inspect", url, "--window-s", "1"])
    assert code == 2 and "answered HTTP 404" in capsys.readouterr().err


def test_bad_window(stub, capsys):
    url, texts = stub
    texts += _scrapes(State())
    assert cli.main(["inspect", url, "--window-s", "0"]) == 2
    assert "must be > 0" in capsys.readouterr().err


@pytest.mark.parametrize(("peaks", "matters"), [((4, 9), True), ((4,), False)])
def test_verdict_follows_the_load_peaks_not_the_median(stub, peaks, matters):
    """Between bursts one request waits (spread 1x); the verdict reads the 90th percentile:
    two peaks in ten samples reach it, one does not."""
    url, texts = stub
    states = [State(steps=k, work=(1200, 100) if k in peaks else (100, 100)) for k in range(11)]
    texts += _scrapes(*states)
    ticks = iter(range(100))
    window = inspection.observe(url, window_s=10.0, interval_s=1.0, progress=False,
                                sleep=lambda _: None, clock=lambda: float(next(ticks)))
    report = inspection.summarize(window)
    spread = report["work_spread"]
    assert spread["samples"] == 10 and spread["median"] == 1.0 and spread["max"] == 12.0
    assert spread["p90"] == (12.0 if matters else 1.0)
    assert report["verdict"]["matters"] is matters and "90th percentile" in report["verdict"][
        "text"]
