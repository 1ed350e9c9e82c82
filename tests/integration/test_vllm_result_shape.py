"""Our `vllm bench serve`-shaped results checked against vLLM's own benchmark code.

The field list comes from `vllm/benchmarks/serve.py` itself (the keys its `benchmark()` and
`main_async()` write), and the TTFT statistics from its `calculate_metrics` on the same requests.
"""

from __future__ import annotations

import ast
import inspect

import pytest

from fairway.replay.results import ReplayResult, RequestResult
from fairway.replay.vllm_result import from_vllm_result, to_vllm_result

pytestmark = pytest.mark.integration

#: vLLM fields from decode timings or its own client that a TTFT-only replay cannot fill, and
#: those it writes only with a request-rate ramp (`--ramp-up-strategy`).
NOT_MEASURED = {"itls", "latencies", "queue_times", "generated_texts", "max_output_tokens_per_s",
                "max_concurrent_requests", "rtfx", "ramp_up_strategy", "ramp_up_start_rps",
                "ramp_up_end_rps"}


def _vllm_fields() -> set[str]:
    """Keys of the generation `result = {...}` in benchmark() and of `result_json[...]`."""
    from vllm.benchmarks import serve

    tree = ast.parse(inspect.getsource(serve))
    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "benchmark":
            dicts = [n.value for n in ast.walk(node) if isinstance(n, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == "result" for t in n.targets)
                     and isinstance(n.value, ast.Dict)]
            generation = next(d for d in dicts if any(
                isinstance(k, ast.Constant) and k.value == "ttfts" for k in d.keys))
            keys |= {k.value for k in generation.keys if isinstance(k, ast.Constant)}
        if isinstance(node, ast.AsyncFunctionDef) and node.name == "main_async":
            for sub in ast.walk(node):
                if (isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name)
                        and sub.value.id == "result_json" and isinstance(sub.slice, ast.Constant)
                        and isinstance(sub.ctx, ast.Store)):
                    keys.add(sub.slice.value)
    return keys


def _result() -> ReplayResult:
    rows = [(0.0, 0.21, None), (0.3, 0.35, None), (0.6, None, "timeout after 30 s"),
            (0.9, 1.7, None), (1.2, 0.05, None)]
    requests = [
        RequestResult(request_id=f"r{i}", arrival_s=a, phase=None, prompt_tokens=50 + 10 * i,
                      first_scheduled_s=None, first_token_s=None if t is None else a + t,
                      cached_tokens=None, error=e)
        for i, (a, t, e) in enumerate(rows)
    ]
    return ReplayResult(policy="fcfs", trace_name="t", settings={"model": "m"},
                        requests=requests, wall_s=2.0, simulated_s=None)


def test_every_vllm_field_a_replay_measures_is_written():
    fields = _vllm_fields()
    assert {"ttfts", "input_lens", "errors", "duration", "completed", "num_prompts"} <= fields
    data = to_vllm_result(_result())
    missing = sorted(fields - NOT_MEASURED - set(data))
    assert not missing, f"vLLM writes {missing}, we do not"
    for key in ("mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms"):
        assert key in data


def test_ttft_statistics_match_vllm_calculate_metrics():
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
    from vllm.benchmarks.serve import calculate_metrics

    result = _result()
    data = to_vllm_result(result)
    outputs = [
        RequestFuncOutput(success=r.ttft_s is not None, ttft=r.ttft_s or 0.0,
                          latency=r.ttft_s or 0.0, output_tokens=1, prompt_len=r.prompt_tokens,
                          start_time=r.arrival_s, error=r.error or "")
        for r in result.requests
    ]
    metrics, output_lens = calculate_metrics(
        input_requests=[], outputs=outputs, dur_s=data["duration"], tokenizer=None,
        selected_percentiles=[99.0], goodput_config_dict={},
    )
    assert data["completed"] == metrics.completed and data["failed"] == metrics.failed
    assert data["total_input_tokens"] == metrics.total_input
    assert data["output_lens"] == output_lens
    assert data["request_throughput"] == pytest.approx(metrics.request_throughput)
    assert data["median_ttft_ms"] == pytest.approx(metrics.median_ttft_ms)
    assert data["mean_ttft_ms"] == pytest.approx(metrics.mean_ttft_ms)
    assert data["std_ttft_ms"] == pytest.approx(metrics.std_ttft_ms)
    assert data["p99_ttft_ms"] == pytest.approx(dict(metrics.percentiles_ttft_ms)[99.0])
    assert data["ttfts"] == [o.ttft for o in outputs]  # as vLLM lists them, failures 0.0
    back = from_vllm_result(data)
    for a, b in zip(result.requests, back.requests, strict=True):
        assert (b.ttft_s is None) == (a.ttft_s is None)
        if a.ttft_s is not None:
            assert b.ttft_s == pytest.approx(a.ttft_s)
