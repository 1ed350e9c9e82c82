"""Live replay against a stub OpenAI-compatible server on 127.0.0.1 (its own thread and loop).

The stub's behaviour is chosen by the request's `max_tokens`, so one trace can mix a normal
answer, an HTTP 500, a server that never answers and a malformed stream.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from stub_server import serve_app

from fairway.errors import FairwayConfigError, TraceError
from fairway.replay import results
from fairway.replay.live import (
    INTERRUPTED,
    LiveReplayError,
    base_url,
    replay_live,
    run_live,
)
from fairway.traces.format import Trace, TraceHeader, make_request

pytestmark = pytest.mark.timeout(60)

FIRST_CHUNK_DELAY_S = 0.2
TOLERANCE_S = 0.1
OK, FAIL_500, HANG, MALFORMED, SLOW_OK = 1, 2, 3, 4, 5
CACHED_TOKENS = 16


@dataclass
class Stub:
    """A running stub server and what it received."""

    url: str
    received: list[dict] = field(default_factory=list)


STUB = web.AppKey("stub", Stub)


async def _completions(request: web.Request) -> web.StreamResponse:
    stub = request.app[STUB]
    body = await request.json()
    stub.received.append(body)
    behaviour = body["max_tokens"]
    if behaviour == FAIL_500:
        return web.Response(status=500, text="boom")
    if behaviour == HANG:
        await asyncio.sleep(3600)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)  # headers go out at once: TTFT must wait for the data chunk
    if behaviour == MALFORMED:
        await resp.write(b"data: this is not json\n\n")
        return resp
    await asyncio.sleep(FIRST_CHUNK_DELAY_S * (3 if behaviour == SLOW_OK else 1))
    token = {"choices": [{"index": 0, "text": "x", "finish_reason": None}]}
    usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]),
                                      "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS}}}
    for chunk in (token, usage):
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "stub-model", "object": "model"}]})


@pytest.fixture(scope="module")
def stub() -> Iterator[Stub]:
    """The stub server (in a thread, so the client's loop cannot slow it down)."""
    app = web.Application()
    app[STUB] = stub = Stub("")
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    with serve_app(app) as url:
        stub.url = url
        yield stub


@pytest.fixture(autouse=True)
def _clear(stub: Stub) -> None:
    stub.received.clear()


def make_trace(*spec: tuple[float, int]) -> Trace:
    """A trace of (arrival_s, behaviour) requests; 8-token prompts with a shared first block."""
    reqs = tuple(
        make_request(f"r{i}", arrival, [("shared", 4), (f"own{i}", 4)], phase="calm",
                     tags={"i": i}, max_tokens=behaviour)
        for i, (arrival, behaviour) in enumerate(spec)
    )
    header = TraceHeader(family="test", seed=7, shape=None, params={}, num_requests=len(reqs))
    return Trace(header, reqs)


def live(trace: Trace, url: str, **kwargs) -> results.ReplayResult:
    kwargs.setdefault("progress", False)
    return asyncio.run(replay_live(trace, url, **kwargs))


def test_ttft_measured_to_the_first_chunk(stub: Stub) -> None:
    result = live(make_trace((0.0, OK), (0.05, OK)), stub.url)
    assert result.settings["model"] == "stub-model"  # from GET /v1/models
    assert [r.request_id for r in result.requests] == ["r0", "r1"]
    for r in result.requests:
        assert r.error is None
        assert r.ttft_s == pytest.approx(FIRST_CHUNK_DELAY_S, abs=TOLERANCE_S)
        assert r.cached_tokens == CACHED_TOKENS
        assert (r.phase, r.prompt_tokens, r.tags) == ("calm", 8, {"i": r.tags["i"]})
    sent = stub.received[0]
    assert sent["model"] == "stub-model" and sent["stream"] is True
    assert sent["temperature"] == 0 and sent["max_tokens"] == OK
    trace = make_trace((0.0, OK))
    assert sent["prompt"] == trace.requests[0].token_ids(result.settings["vocab_size"])
    assert result.trace_name == results.default_trace_name(trace) == "test-seed7"
    assert result.simulated_s is None and result.settings["interrupted"] is False


def test_tenant_and_priority_are_sent_and_recorded(stub: Stub) -> None:
    reqs = (
        make_request("t0", 0.0, [("b", 4)], tenant="team-a", priority=2, max_tokens=OK),
        make_request("t1", 0.05, [("b", 4)], max_tokens=OK),
    )
    trace = Trace(TraceHeader("test", 7, None, {}, 2), reqs)
    result = live(trace, stub.url, model="m")
    sent = sorted(stub.received, key=lambda body: len(body))
    assert sent[0].keys() == {"model", "prompt", "max_tokens", "temperature", "stream",
                              "stream_options"}
    assert sent[1]["priority"] == 2 and sent[1]["vllm_xargs"] == {"tenant": "team-a"}
    assert [(r.tenant, r.priority) for r in result.requests] == [("team-a", 2), (None, 0)]


def test_failures_are_recorded_and_sends_stay_on_schedule(stub: Stub) -> None:
    # A hanging first request must not delay the later sends (open loop).
    trace = make_trace((0.0, HANG), (0.1, FAIL_500), (0.2, MALFORMED), (0.3, SLOW_OK), (0.4, OK))
    result = live(trace, stub.url, model="m", timeout_s=1.0, time_scale=1.0)
    hang, fail, malformed, slow, ok = result.requests
    assert hang.error == "timeout after 1 s" and hang.ttft_s is None
    assert fail.error == "HTTP 500: boom"
    assert malformed.error is not None and "malformed stream" in malformed.error
    assert slow.error is None and slow.ttft_s == pytest.approx(0.6, abs=TOLERANCE_S)
    assert ok.error is None and ok.ttft_s == pytest.approx(0.2, abs=TOLERANCE_S)
    for r, scheduled in zip(result.requests, (0.0, 0.1, 0.2, 0.3, 0.4), strict=True):
        assert r.arrival_s == pytest.approx(scheduled, abs=0.05)
    assert result.n_errors == 3 and len(result.requests) == 5


def test_time_scale_compresses_the_schedule(stub: Stub) -> None:
    result = live(make_trace((0.0, OK), (0.4, OK), (0.8, OK)), stub.url, model="m", time_scale=0.5)
    sends = [r.arrival_s for r in result.requests]
    assert sends == pytest.approx([0.0, 0.2, 0.4], abs=0.05)


def test_cancellation_returns_partial_results_and_writes_them(stub: Stub, tmp_path) -> None:
    trace = make_trace((0.0, OK), (0.0, HANG), (5.0, OK))
    out = tmp_path / "partial.json"

    async def cancel_soon() -> results.ReplayResult:
        task = asyncio.create_task(
            replay_live(trace, stub.url, model="m", progress=False, out_path=out))
        await asyncio.sleep(0.6)
        task.cancel()
        return await task

    started = time.monotonic()
    result = asyncio.run(cancel_soon())
    assert time.monotonic() - started < 3
    done, hung, unsent = result.requests
    assert done.error is None and done.ttft_s is not None
    assert hung.error == INTERRUPTED and hung.arrival_s == pytest.approx(0.0, abs=0.05)
    assert unsent.error == INTERRUPTED and unsent.arrival_s == 5.0  # never sent: scheduled time
    assert result.settings["interrupted"] is True
    assert results.load(out) == result


@pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
    reason="SIGINT handler replaced; asyncio.run would not turn Ctrl-C into a cancellation",
)
def test_ctrl_c_under_asyncio_run_returns_what_was_measured(stub: Stub) -> None:
    trace = make_trace((0.0, OK), (0.0, HANG))
    # os.kill targets the process, like a terminal's Ctrl-C; the kernel then wakes the main thread
    # (signal.raise_signal from this thread would hit only the timer thread).
    timer = threading.Timer(0.6, os.kill, args=(os.getpid(), signal.SIGINT))
    started = time.monotonic()
    timer.start()
    try:
        result = run_live(trace, stub.url, model="m", progress=False)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 3
    assert result.requests[0].error is None
    assert result.requests[1].error == INTERRUPTED


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_unreachable_server_without_model_is_a_clear_error() -> None:
    url = _closed_port_url()
    with pytest.raises(LiveReplayError, match=f"{url}/v1/models"):
        live(make_trace((0.0, OK)), url)


def test_unreachable_server_with_a_model_is_refused_before_sending() -> None:
    url = _closed_port_url()
    with pytest.raises(LiveReplayError, match=f"{url}/v1/models"):
        live(make_trace((0.0, OK), (0.05, OK)), url + "/v1/", model="m")


def test_base_url_accepts_v1_suffix() -> None:
    assert base_url("http://h:1/v1/") == base_url("http://h:1") == "http://h:1"


def test_max_concurrency_delays_sends_and_reports_the_lag(stub: Stub) -> None:
    result = live(make_trace((0.0, OK), (0.0, OK)), stub.url, model="m", max_concurrency=1)
    first, second = sorted(result.requests, key=lambda r: r.arrival_s)
    assert second.arrival_s >= first.first_token_s
    assert result.settings["max_send_lag_s"] == pytest.approx(second.arrival_s, abs=0.01)
    assert second.ttft_s == pytest.approx(FIRST_CHUNK_DELAY_S, abs=TOLERANCE_S)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"time_scale": 0.0}, FairwayConfigError),
        ({"timeout_s": -1.0}, FairwayConfigError),
        ({"max_concurrency": 0}, FairwayConfigError),
        ({"vocab_size": 3}, TraceError),
    ],
)
def test_bad_arguments_fail_before_sending(kwargs: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        live(make_trace((0.0, OK)), _closed_port_url(), model="m", **kwargs)


# --- sessions: a turn is sent after its parent's answer (closed loop, the default) -------------

THINK_S = 0.15


def session_trace(parent_behaviour: int = OK, parent: str = "p") -> Trace:
    """A parent and a child turn recorded at the same instant; the child extends the parent."""
    reqs = (
        make_request("p", 0.0, [("ctx", 4)], phase="calm", max_tokens=parent_behaviour,
                     tags={"session": "s0", "parent": None, "think_s": 0.0}),
        make_request("c", 0.0, [("ctx", 4), ("q2", 4)], phase="calm", max_tokens=OK,
                     tags={"session": "s0", "parent": parent, "think_s": THINK_S}),
    )
    return Trace(TraceHeader("test", 7, None, {}, 2), reqs)


def test_a_session_turn_is_sent_think_s_after_its_parents_first_chunk(stub: Stub) -> None:
    result = live(session_trace(), stub.url, model="m")
    parent, child = result.requests
    assert parent.error is None and child.error is None
    assert parent.first_token_s is not None
    assert child.arrival_s >= parent.first_token_s + THINK_S
    assert child.arrival_s == pytest.approx(parent.first_token_s + THINK_S, abs=0.05)
    assert child.tags["recorded_arrival_s"] == 0.0 and "recorded_arrival_s" not in parent.tags
    assert [len(body["prompt"]) for body in stub.received] == [4, 8]  # parent first
    assert result.settings["arrivals"] == "closed-loop"


def test_open_loop_sends_a_session_turn_at_its_timestamp(stub: Stub) -> None:
    result = live(session_trace(), stub.url, model="m", open_loop=True)
    parent, child = result.requests
    assert child.arrival_s == pytest.approx(0.0, abs=0.05)
    assert child.arrival_s < parent.first_token_s
    assert result.settings["arrivals"] == "open-loop"
    assert "arrivals" not in live(make_trace((0.0, OK)), stub.url, model="m").settings


def test_a_failed_parent_still_releases_its_turn(stub: Stub) -> None:
    result = live(session_trace(parent_behaviour=FAIL_500), stub.url, model="m")
    parent, child = result.requests
    assert parent.error == "HTTP 500: boom"
    assert child.error is None
    assert child.arrival_s == pytest.approx(THINK_S, abs=0.05)  # the 500 answers at once


def test_a_turn_naming_an_unknown_parent_is_refused_before_sending(stub: Stub) -> None:
    with pytest.raises(TraceError, match="not an earlier request"):
        live(session_trace(parent="ghost"), stub.url, model="m")
    assert stub.received == []
