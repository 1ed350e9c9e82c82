"""Replay results in `vllm bench serve --save-result --save-detailed`'s shape, both directions."""

from __future__ import annotations

import json

import pytest

from fairway.replay.results import ReplayResult, RequestResult, ResultError
from fairway.replay.vllm_result import (
    from_vllm_result,
    load_vllm_result,
    save_vllm_result,
    to_vllm_result,
)


def _result() -> ReplayResult:
    def req(i: int, arrival: float, ttft: float | None, error: str | None = None) -> RequestResult:
        return RequestResult(
            request_id=f"r{i}", arrival_s=arrival, phase="calm" if i < 2 else "spike",
            prompt_tokens=100 * (i + 1), first_scheduled_s=None,
            first_token_s=None if ttft is None else arrival + ttft, cached_tokens=16 * i,
            error=error,
        )

    requests = [req(0, 0.0, 0.2), req(1, 0.5, 0.4), req(2, 1.0, None, "HTTP 500: boom"),
                req(3, 1.5, 1.0)]
    return ReplayResult(policy="fairway", trace_name="sec-a", settings={"model": "tiny"},
                        requests=requests, wall_s=3.0, simulated_s=None)


def test_fields_and_units_as_vllm_writes_them():
    data = to_vllm_result(_result())
    assert data["num_prompts"] == 4 and data["completed"] == 3 and data["failed"] == 1
    assert data["ttfts"] == pytest.approx([0.2, 0.4, 0.0, 1.0])  # seconds; 0.0 when failed
    assert data["errors"] == ["", "", "HTTP 500: boom", ""]
    assert data["input_lens"] == [100, 200, 300, 400] and data["output_lens"] == [1, 1, 0, 1]
    assert data["median_ttft_ms"] == pytest.approx(400.0)  # over completed requests only
    assert data["mean_ttft_ms"] == pytest.approx(1600.0 / 3)
    assert data["p99_ttft_ms"] == pytest.approx(988.0)  # numpy's linear percentile
    assert data["duration"] == pytest.approx(2.5)  # first send -> last first token
    assert data["total_input_tokens"] == 700 and data["total_output_tokens"] == 3
    assert data["request_throughput"] == pytest.approx(3 / 2.5)
    assert data["label"] == "fairway" and data["model_id"] == "tiny"
    json.dumps(data, allow_nan=False)


def test_round_trip_through_a_file(tmp_path):
    original = _result()
    path = save_vllm_result(original, tmp_path / "x" / "vllm.json", percentiles=(50, 99.9))
    data = json.loads(path.read_text())
    assert "p50_ttft_ms" in data and "p99.9_ttft_ms" in data
    back = load_vllm_result(path)
    assert back.policy == "fairway" and back.trace_name == "sec-a"
    assert [r.request_id for r in back.requests] == ["r0", "r1", "r2", "r3"]
    for a, b in zip(original.requests, back.requests, strict=True):
        assert b.ttft_s == pytest.approx(a.ttft_s) if a.ttft_s is not None else b.ttft_s is None
        assert (b.prompt_tokens, b.phase, b.cached_tokens) == (a.prompt_tokens, a.phase,
                                                               a.cached_tokens)
        assert b.arrival_s == pytest.approx(a.arrival_s)
    assert back.requests[2].error == "HTTP 500: boom"


def test_a_file_of_vllm_itself_without_fairway_fields():
    data = {"backend": "vllm", "label": None, "ttfts": [0.1, 0.0], "input_lens": [10, 20],
            "errors": ["", "timeout"], "start_times": [100.0, 100.5], "duration": 1.0}
    result = from_vllm_result(data)
    assert result.policy == "vllm" and result.trace_name == "vllm-bench"
    assert [r.request_id for r in result.requests] == ["vllm-0", "vllm-1"]
    assert result.requests[0].ttft_s == pytest.approx(0.1) and result.requests[1].ttft_s is None
    assert result.requests[1].arrival_s == pytest.approx(0.5)


def test_summary_only_file_asks_for_save_detailed(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"median_ttft_ms": 3.0, "completed": 2}))
    with pytest.raises(ResultError, match="--save-detailed"):
        load_vllm_result(path)


def test_append_result_file_reads_the_last_object(tmp_path):
    path = tmp_path / "appended.json"
    one = {"ttfts": [0.1], "input_lens": [5], "errors": [""], "label": "first"}
    two = {**one, "label": "second"}
    path.write_text(json.dumps(one) + "\n" + json.dumps(two))
    assert load_vllm_result(path).policy == "second"


def test_lists_of_different_lengths_are_refused():
    with pytest.raises(ResultError, match="2 ttfts but input_lens"):
        from_vllm_result({"ttfts": [0.1, 0.2], "input_lens": [1], "errors": ["", ""]})


def test_fairway_replay_also_writes_the_vllm_shape(tmp_path, capsys):
    """`fairway replay` against a stub server: the extra file sits in <out>/vllm-bench/."""
    from aiohttp import web

    from fairway import cli
    from fairway.traces.format import Trace, TraceHeader, make_request, write_trace
    from tests.unit.stub_server import serve_app

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunks = [{"choices": [{"index": 0, "text": "x", "finish_reason": None}]},
                  {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]),
                                            "prompt_tokens_details": {"cached_tokens": 4}}}]
        for chunk in chunks:
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "stub-model"}]})

    reqs = tuple(make_request(f"r{i}", 0.05 * i, [("shared", 4), (f"own{i}", 4)], max_tokens=2)
                 for i in range(3))
    header = TraceHeader(family="test", seed=1, shape=None, params={}, num_requests=len(reqs))
    trace_path = write_trace(Trace(header, reqs), tmp_path / "t.jsonl")
    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    with serve_app(app) as url:
        code = cli.main(["replay", "--url", url, "--trace", str(trace_path), "--out",
                         str(tmp_path / "out"), "--no-progress", "--label", "stub"])
    assert code == 0, capsys.readouterr().err
    files = list((tmp_path / "out" / "vllm-bench").glob("*.json"))
    assert len(files) == 1 and "vllm-bench" in capsys.readouterr().err
    data = json.loads(files[0].read_text())
    assert data["completed"] == 3 and data["errors"] == ["", "", ""]
    assert data["output_lens"] == [2, 2, 2] and data["label"] == "stub"
    assert data["model_id"] == "stub-model" and len(data["ttfts"]) == 3
    assert load_vllm_result(files[0]).policy == "stub"
