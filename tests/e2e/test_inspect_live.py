"""`fairway inspect` and the hit/miss histograms against a live `fairway serve` of the tiny model.

While `fairway inspect --json` watches the server, a burst of cache hits (a shared 1,024-token
prefix) and misses (1,024 tokens of their own) arrives; the 512-token step budget makes a queue.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PREFIX_TOKENS = 1024
MISS_TOKENS = 600
NUM_HITS = 6
NUM_MISSES = 2
#: Long enough for the burst on a loaded 2-core box (steps of the tiny model take up to ~3 s).
WINDOW_S = 40
_LOW, _HIGH = 3, 512  # inside the tiny model's vocabulary, clear of special tokens


def _prefix() -> list[int]:
    return [_LOW + (11 * i) % (_HIGH - _LOW) for i in range(PREFIX_TOKENS)]


def hit_prompt(k: int) -> list[int]:
    return _prefix() + [_LOW + (17 * k + 5 * j) % (_HIGH - _LOW) for j in range(32)]


def miss_prompt(k: int) -> list[int]:
    return [_LOW + (97 * k + 29 * j + 1) % (_HIGH - _LOW) for j in range(MISS_TOKENS)]


async def _send(url: str, model: str, prompts: list[list[int]]) -> list[int]:
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
        responses = await asyncio.gather(*(
            client.post("/v1/completions", json={"model": model, "prompt": p, "max_tokens": 1})
            for p in prompts
        ))
    return [r.status_code for r in responses]


def send(server: Any, prompts: list[list[int]]) -> list[int]:
    return asyncio.run(_send(server.url, server.model, prompts))


def _scrapes(server: Any) -> int:
    """GET /metrics requests in the server's access log so far."""
    return server.log_path.read_text(errors="replace").count('"GET /metrics HTTP')


def _count(text: str, name: str, cache: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'cache="{cache}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_inspect_reports_the_live_traffic(server: Any, e2e: Any) -> None:
    assert send(server, [hit_prompt(-1)]) == [200]  # the shared prefix is now cached
    before = httpx.get(f"{server.url}/metrics", timeout=30).text
    argv = [*e2e.fairway_command(), "inspect", server.url, "--window-s", str(WINDOW_S),
            "--interval-s", "0.5", "--json"]
    scrapes = _scrapes(server)
    watcher = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    start = time.monotonic()
    while _scrapes(server) == scrapes:  # the watcher's first scrape must precede the burst
        assert watcher.poll() is None, watcher.communicate()[1]
        assert time.monotonic() - start < 60, "fairway inspect made no scrape in 60 s"
        time.sleep(0.1)
    prompts = [miss_prompt(k) for k in range(NUM_MISSES)] + [hit_prompt(k) for k in range(NUM_HITS)]
    codes = send(server, prompts)
    assert codes == [200] * len(prompts), f"{codes}\n{server.log_tail()}"
    if time.monotonic() - start > WINDOW_S - 2:
        watcher.kill()
        pytest.fail(f"the burst outlasted the {WINDOW_S} s window: the machine is too busy")
    out, err = watcher.communicate(timeout=WINDOW_S + 60)
    assert watcher.returncode == 0, err
    report = json.loads(out)
    context = f"report:\n{json.dumps(report, indent=1)}\nlog tail:\n{server.log_tail()}"
    assert report["fairway_series"] and report["policy"] == ["fairway"], context
    assert report["requests"]["finished"] == len(prompts), context
    assert 0.3 < report["prefix_cache"]["hit_rate"] < 1.0, context
    by_cache = report["by_cache"]
    assert by_cache["hit"]["ttft"]["n"] == NUM_HITS, context
    assert by_cache["miss"]["ttft"]["n"] == NUM_MISSES, context
    assert by_cache["hit"]["queue_time"]["n"] == NUM_HITS, context
    assert by_cache["miss"]["ttft"]["median_s"] > 0, context
    assert sum(report["lanes"]["admitted"].values()) == len(prompts), context
    assert report["fallbacks"] == 0, context
    assert report["prepass"]["ordered_steps"] > 0, context
    assert report["work_spread"]["samples"] >= 1, context
    spread = report["work_spread"]
    assert spread["largest_tokens"] >= spread["smallest_tokens"] >= 1, context
    assert report["verdict"]["text"].startswith("ordering matters"), context
    assert report["vllm_latency"]["ttft"]["n"] == len(prompts), context
    # the histograms themselves, on the API server's /metrics (the multiprocess transport)
    after = httpx.get(f"{server.url}/metrics", timeout=30).text
    for cache, n in (("hit", NUM_HITS), ("miss", NUM_MISSES)):
        for name in ("fairway:ttft_seconds_count", "fairway:queue_time_seconds_count"):
            assert _count(after, name, cache) - _count(before, name, cache) == n, (name, cache)


def test_inspect_text_output(server: Any, e2e: Any) -> None:
    argv = [*e2e.fairway_command(), "inspect", server.url, "--window-s", "2", "--no-progress"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for needle in ("policy fairway", "Prefix cache  hit rate", "Verdict", "hit  TTFT",
                   "Fallbacks     0"):
        assert needle in result.stdout, result.stdout
