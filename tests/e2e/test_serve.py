"""`fairway serve` end to end on CPU: real vLLM server, real tokenizer, tiny random-weight model.

Checks what only a live server can show: the scheduler class loads in the EngineCore process,
concurrent chunked prefills with a shared prefix complete, the `fairway:` series reach the API
server's /metrics (the multiprocess transport), and SIGINT shuts the whole process tree down.
The tests of the live server run in file order and share one server; the last one stops it.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NUM_REQUESTS = 12
PREFIX_TOKENS = 1024
SUFFIX_TOKENS = 64
#: Token ids stay clear of the 3 special tokens and inside the tiny model's 512-token vocabulary.
_LOW, _HIGH = 3, 512


def shared_prefix() -> list[int]:
    """A 1,024-token prefix every request starts with (cached after the first request)."""
    return [_LOW + (7 * i) % (_HIGH - _LOW) for i in range(PREFIX_TOKENS)]


def prompt(k: int) -> list[int]:
    """Request k: the shared prefix plus 64 tokens of its own."""
    suffix = [_LOW + (13 * k + 31 * j + 5) % (_HIGH - _LOW) for j in range(SUFFIX_TOKENS)]
    return shared_prefix() + suffix


async def _complete_all(url: str, model: str, prompts: list[list[int]]) -> list[httpx.Response]:
    """POST all prompts to /v1/completions at once (max_tokens=1: a prefill-node request)."""
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
        return await asyncio.gather(
            *(
                client.post("/v1/completions", json={"model": model, "prompt": p, "max_tokens": 1})
                for p in prompts
            )
        )


def complete_all(server: Any, prompts: list[list[int]]) -> list[httpx.Response]:
    return asyncio.run(_complete_all(server.url, server.model, prompts))


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")


def metric_sum(text: str, name: str, **labels: str) -> float | None:
    """Sum of the samples of `name` whose labels include `labels`; None if there is none."""
    total, found = 0.0, False
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match["name"] != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(match["value"])
            found = True
    return total if found else None


def test_concurrent_completions_share_a_prefix(server: Any) -> None:
    warm = complete_all(server, [prompt(-1)])  # puts the shared prefix in the cache
    assert warm[0].status_code == 200, warm[0].text
    responses = complete_all(server, [prompt(k) for k in range(NUM_REQUESTS)])
    failed = [(r.status_code, r.text[:200]) for r in responses if r.status_code != 200]
    assert not failed, f"{len(failed)} requests failed: {failed}\nlog tail:\n{server.log_tail()}"
    for r in responses:
        body = r.json()
        assert body["usage"]["prompt_tokens"] == PREFIX_TOKENS + SUFFIX_TOKENS
        assert body["usage"]["completion_tokens"] == 1


def test_fairway_series_on_metrics(server: Any) -> None:
    responses = complete_all(server, [prompt(100 + k) for k in range(NUM_REQUESTS)])
    assert all(r.status_code == 200 for r in responses)
    text = httpx.get(f"{server.url}/metrics", timeout=30.0).text
    labels = {"policy": "fairway", "model_name": server.model}
    steps = metric_sum(text, "fairway:steps_ordered_total", **labels)
    placed = metric_sum(text, "fairway:requests_placed_total", **labels)
    lanes = (
        metric_sum(text, "fairway:requests_placed_total", lane="fast", **labels),
        metric_sum(text, "fairway:requests_placed_total", lane="fair", **labels),
    )
    fallbacks = metric_sum(text, "fairway:policy_fallbacks_total", **labels)
    prepass = metric_sum(text, "fairway:prepass_seconds_count", **labels)
    fairway_lines = "\n".join(line for line in text.splitlines() if line.startswith("fairway:"))
    context = f"fairway series:\n{fairway_lines or '(none)'}\nlog tail:\n{server.log_tail()}"
    assert steps is not None and placed is not None, f"no fairway: series on /metrics\n{context}"
    assert fallbacks == 0, f"the policy fell back to vLLM's order\n{context}"
    assert steps > 0, context
    assert placed >= NUM_REQUESTS, context  # every request here went through our order
    assert sum(v or 0 for v in lanes) == placed, context  # policy fairway places by lane
    assert prepass and prepass >= steps, context
    hits = metric_sum(text, "vllm:prefix_cache_hits_total", model_name=server.model)
    assert hits and hits >= PREFIX_TOKENS, f"no prefix-cache hits\n{context}"


def test_server_log_shows_fairway_start_up(server: Any) -> None:
    log = server.log_path.read_text(errors="replace")
    assert "FairwayScheduler ordering vLLM's waiting queue with policy fairway" in log, (
        server.log_tail()
    )
    assert "falls back to the patience floor" in log  # no --profile: the CLI warns


def test_sigint_stops_the_whole_tree(server: Any, e2e: SimpleNamespace) -> None:
    tree = set(e2e.process_tree(server.proc.pid))
    assert len(tree) >= 3, f"expected fairway, the API server and EngineCore, got {tree}"
    server.proc.send_signal(signal.SIGINT)
    try:
        code = server.proc.wait(timeout=e2e.shutdown_timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no exit {e2e.shutdown_timeout_s:.0f} s after SIGINT\n{server.log_tail()}")
    assert code == 0, f"exit code {code} after SIGINT\n{server.log_tail()}"
    deadline = time.monotonic() + 10.0
    while e2e.alive(tree) and time.monotonic() < deadline:
        time.sleep(0.2)  # children may take a moment after their parent
    assert not e2e.alive(tree), f"orphaned processes: {e2e.alive(tree)}\n{server.log_tail()}"
    log = server.log_path.read_text(errors="replace")
    match = re.search(r"PROMETHEUS_MULTIPROC_DIR=(\S+)", log)
    assert match, "fairway serve did not report its metrics directory"
    assert not Path(match[1]).exists(), "the metrics directory was not removed"


def test_unknown_policy_fails_fast_without_a_server(tiny_model: Path, e2e: SimpleNamespace) -> None:
    port = e2e.free_port()
    argv = [
        *e2e.fairway_command(),
        "serve",
        str(tiny_model),
        "--policy",
        "no-such-policy",
        "--port",
        str(port),
    ]
    start = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=e2e.server_env())
    elapsed = time.monotonic() - start
    assert result.returncode == 2, result.stderr
    assert "fairway: error: Fairway option policy='no-such-policy' (from --policy)" in result.stderr
    assert "starting vLLM" not in result.stderr
    assert elapsed < 30, f"took {elapsed:.1f} s: vLLM must not have been started"


def test_tiny_model_is_deterministic(tmp_path: Path) -> None:
    from fairway.tiny_model import make_tiny_model

    a = make_tiny_model(tmp_path / "a", vocab_size=300, hidden=64, layers=1, seed=3)
    b = make_tiny_model(tmp_path / "b", vocab_size=300, hidden=64, layers=1, seed=3)
    c = make_tiny_model(tmp_path / "c", vocab_size=300, hidden=64, layers=1, seed=4)
    names = sorted(p.name for p in a.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(
        names
    )
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
