"""Live replay against a failing server: limits read before sending, a server that stops answering,
and `fairway replay`'s messages and exit status.

The stub mimics what matters of vLLM: `/v1/models` with `owned_by: vllm` and `max_model_len`,
"Token id N is out of vocabulary" (HTTP 400) for ids >= its vocabulary, 404 for an unknown model,
and `/health`. It can be told to "stop": /health then answers 503 and open streams go silent,
which is what a vLLM server whose engine was shut down does (FAIRWAY.md, "Shutdown").
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from stub_server import serve_app

from fairway.cli import main
from fairway.replay.live import LiveReplayError, replay_live
from fairway.replay.outcome import STOPPED_MESSAGE, group_errors, verdict
from fairway.replay.results import ReplayResult, RequestResult
from fairway.traces.format import Trace, TraceHeader, make_request, write_trace

pytestmark = pytest.mark.timeout(60)

VOCAB = 600
MAX_MODEL_LEN = 256
MODEL = "tiny"


@dataclass
class VllmStub:
    """A stub vLLM server and its state."""

    url: str = ""
    stopped: bool = False
    completions: list[dict] = field(default_factory=list)


STUB = web.AppKey("stub", VllmStub)


async def _models(request: web.Request) -> web.Response:
    card = {"id": MODEL, "object": "model", "owned_by": "vllm", "max_model_len": MAX_MODEL_LEN}
    return web.json_response({"object": "list", "data": [card]})


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=503 if request.app[STUB].stopped else 200)


async def _completions(request: web.Request) -> web.StreamResponse:
    stub = request.app[STUB]
    body = await request.json()
    stub.completions.append(body)
    if body["model"] != MODEL:
        return web.json_response({"error": {"message": f"The model `{body['model']}` does not "
                                            "exist."}}, status=404)
    top = max(body["prompt"])
    if top >= VOCAB:
        return web.json_response({"error": {"message": f"Token id {top} is out of vocabulary"}},
                                 status=400)
    if not body.get("stream"):
        return web.json_response({"choices": [{"text": "x"}]})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if body["max_tokens"] == 2:  # a long stream: silent forever once the server "stops"
        while not stub.stopped:
            await asyncio.sleep(0.05)
        await asyncio.sleep(3600)
    await resp.write(b'data: {"choices": [{"text": "x"}]}\n\n')
    await resp.write(b"data: [DONE]\n\n")
    return resp


@pytest.fixture()
def stub() -> Iterator[VllmStub]:
    app = web.Application()
    app[STUB] = state = VllmStub()
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_post("/v1/completions", _completions)
    with serve_app(app) as url:
        state.url = url
        yield state


def make_trace(n: int, *, tokens: int = 32, max_tokens: int = 1, every_s: float = 0.05) -> Trace:
    reqs = tuple(make_request(f"r{i}", i * every_s, [("shared", 16), (f"own{i}", tokens - 16)],
                              max_tokens=max_tokens) for i in range(n))
    return Trace(TraceHeader(family="test", seed=1, shape=None, params={}, num_requests=n), reqs)


def live(trace: Trace, url: str, **kwargs) -> ReplayResult:
    kwargs.setdefault("progress", False)
    return asyncio.run(replay_live(trace, url, **kwargs))


def test_the_default_vocabulary_adopts_the_servers(stub: VllmStub) -> None:
    result = live(make_trace(3), stub.url)
    assert result.n_errors == 0
    assert result.settings["vocab_size"] == VOCAB  # found by the probe, below the default 32000
    assert result.settings["vocab_probed"] is True
    assert result.settings["server_max_model_len"] == MAX_MODEL_LEN
    sent = [b for b in stub.completions if b.get("stream")]
    assert len(sent) == 3 and all(max(b["prompt"]) < VOCAB for b in sent)


def test_a_given_vocabulary_beyond_the_servers_is_refused_before_sending(stub: VllmStub) -> None:
    expected = (f"--vocab-size 32000 is larger than the served model's vocabulary "
                f"\\({VOCAB} token ids.*pass --vocab-size {VOCAB} or less")
    with pytest.raises(LiveReplayError, match=expected):
        live(make_trace(3), stub.url, vocab_size=32000)
    assert not [b for b in stub.completions if b.get("stream")]


def test_an_unknown_model_and_too_long_prompts_are_refused_before_sending(stub: VllmStub) -> None:
    with pytest.raises(LiveReplayError, match="does not serve model 'x'; it serves: tiny"):
        live(make_trace(2), stub.url, model="x")
    with pytest.raises(LiveReplayError, match=f"2 of 2 requests need more tokens than the "
                       f"server's max_model_len {MAX_MODEL_LEN} \\(longest: 301 "):
        live(make_trace(2, tokens=300), stub.url, vocab_size=VOCAB)
    assert not stub.completions


def test_a_server_that_stops_answering_ends_the_replay_early(stub: VllmStub) -> None:
    trace = make_trace(40, max_tokens=2, every_s=0.1)  # 4 s of long streams

    async def stop_soon() -> ReplayResult:
        task = asyncio.create_task(replay_live(trace, stub.url, vocab_size=VOCAB, progress=False,
                                               timeout_s=300, health_interval_s=0.2))
        await asyncio.sleep(1.0)
        stub.stopped = True
        return await task

    started = time.monotonic()
    result = asyncio.run(stop_soon())
    assert time.monotonic() - started < 10  # not the 300 s timeout, nor the 4 s trace
    assert "HTTP 503" in result.settings["server_stopped"]
    errors = {r.error for r in result.requests}
    assert errors == {STOPPED_MESSAGE, f"not sent: {STOPPED_MESSAGE}"}
    found = verdict(result)
    assert not found.ok and found.lines()[0].startswith(f"{STOPPED_MESSAGE} (GET ")


def _result(errors: list[str | None]) -> ReplayResult:
    reqs = [RequestResult(f"r{i}", 0.0, None, 8, None, None if e else 0.1, None, e)
            for i, e in enumerate(errors)]
    return ReplayResult("live", "t", {}, reqs, 1.0, None)


def test_errors_are_grouped_by_cause_ignoring_numbers() -> None:
    errors = ["HTTP 400: Token id 700 is out of vocabulary", "timeout after 5 s",
              "HTTP 400: Token id 912 is out of vocabulary", "HTTP 500: boom"]
    causes = group_errors(errors, limit=2)
    assert [(c.count, c.example) for c in causes] == [
        (2, "HTTP 400: Token id 700 is out of vocabulary"), (1, "timeout after 5 s")]


def test_the_verdict_needs_the_min_success_share() -> None:
    assert verdict(_result([None] * 9 + ["x"])).ok  # 90 % >= the default 0.9
    assert not verdict(_result([None] * 8 + ["x"] * 2)).ok
    assert verdict(_result([None] * 8 + ["x"] * 2), min_success=0.8).ok
    assert not verdict(_result([])).ok  # nothing measured
    lines = verdict(_result(["HTTP 404: no model"] * 3)).lines()
    assert lines == ["3 of 3 requests failed; causes:", "  3 x HTTP 404: no model",
                     "only 0 of 3 requests (0%) got a first token; --min-success is 0.9"]


def _replay_cli(stub: VllmStub, tmp_path: Path, trace: Trace, *extra: str) -> int:
    path = tmp_path / "t.jsonl"
    write_trace(trace, path)
    return main(["replay", "--url", stub.url, "--trace", str(path), "--no-progress",
                 "--out", str(tmp_path / "out"), *extra])


def test_cli_exit_status_and_messages(stub: VllmStub, tmp_path: Path, capsys) -> None:
    assert _replay_cli(stub, tmp_path, make_trace(3)) == 0
    assert "wrote the live replay (0 of 3 requests without a first token)" in \
        capsys.readouterr().err

    assert _replay_cli(stub, tmp_path, make_trace(3), "--vocab-size", "1000") == 2
    err = capsys.readouterr().err
    assert err.startswith("fairway: error: --vocab-size 1000 is larger than the served model's")

    assert _replay_cli(stub, tmp_path, make_trace(3), "--model", "x") == 2
    assert "does not serve model 'x'" in capsys.readouterr().err

    with pytest.raises(SystemExit):
        _replay_cli(stub, tmp_path, make_trace(3), "--min-success", "1.5")
    assert "--min-success: must be a number from 0 to 1, got '1.5'" in capsys.readouterr().err


def test_cli_fails_with_the_causes_when_requests_fail(stub: VllmStub, tmp_path: Path,
                                                      capsys, monkeypatch) -> None:
    import fairway.replay.server as server

    async def no_probe(session, url, trace, *, model, vocab_size, vocab_given):
        return server.ServerLimits(MODEL, None, vocab_size, False)  # as a non-vLLM server

    monkeypatch.setattr("fairway.replay.live.read_limits", no_probe)
    assert _replay_cli(stub, tmp_path, make_trace(4), "--vocab-size", "32000") == 1
    err = capsys.readouterr().err
    assert "fairway: 4 of 4 requests failed; causes:" in err
    assert "fairway:   4 x HTTP 400: " in err and "is out of vocabulary" in err
    assert "fairway: only 0 of 4 requests (0%) got a first token; --min-success is 0.9" in err
    assert json.loads(next((tmp_path / "out").glob("replays/*.json")).read_text())["requests"]
