"""Replay results in the shape of `vllm bench serve --save-result --save-detailed`, both ways.

Writing: `to_vllm_result(result)` gives the dict `vllm bench serve` saves (field names and units of
`vllm/benchmarks/serve.py`: per-request lists `ttfts` in seconds, `input_lens`, `output_lens`,
`errors` with "" for success, `start_times`; summary `completed`, `failed`, `duration` in seconds,
`mean/median/std/p99_ttft_ms` in milliseconds, throughputs per second; setup `date`, `backend`,
`label`, `model_id`, `num_prompts`, ...), so scripts and dashboards written for vLLM's files read
ours. As in vLLM, a failed request has `ttft` 0.0, `output_len` 0 and a non-empty `error`, and
the TTFT statistics are over completed requests only. Fields vLLM fills from decode timings
(`itls`, `tpot`, `e2el`, `generated_texts`) are left out: a replay measures TTFT only. Fairway's own
per-request fields ride along under `fairway_*` keys (ignored by vLLM's readers).

Reading: `from_vllm_result(data)` turns such a file (from `vllm bench serve` itself, with
`--save-detailed`) into a `ReplayResult`, so a report can put vLLM's benchmark and ours side by
side.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from fairway.replay.results import ReplayResult, RequestResult, ResultError

#: Percentiles written as `p<P>_ttft_ms` (vLLM's default `--metric-percentiles` is "99").
DEFAULT_PERCENTILES = (99.0,)
#: Per-request lists `from_vllm_result` needs (vLLM writes them only with `--save-detailed`).
DETAILED_FIELDS = ("input_lens", "ttfts", "errors")


def to_vllm_result(
    result: ReplayResult,
    *,
    output_lens: Sequence[int] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    backend: str = "openai",
) -> dict[str, Any]:
    """`result` as `vllm bench serve --save-result --save-detailed` would have saved it.

    Args:
        result: a replay (live or virtual-clock).
        output_lens: tokens generated per request (trace order), e.g. the trace's `max_tokens`;
            None: 1 per completed request (the prefill-node setting of the replays).
        percentiles: TTFT percentiles to write as `p<P>_ttft_ms`.
        backend: vLLM's `--backend` value the file claims (the replay speaks OpenAI completions).
    """
    requests = result.requests
    ok = [r.ttft_s is not None for r in requests]
    if output_lens is None:
        output_lens = [1] * len(requests)
    if len(output_lens) != len(requests):
        raise ValueError(f"output_lens has {len(output_lens)} entries for {len(requests)} requests")
    outs = [int(n) if good else 0 for n, good in zip(output_lens, ok, strict=True)]
    ttfts = [r.ttft_s if r.ttft_s is not None else 0.0 for r in requests]
    good_ttfts = [t for t, good in zip(ttfts, ok, strict=True) if good]
    duration = _duration(result)
    completed = sum(ok)
    total_input = sum(r.prompt_tokens for r, good in zip(requests, ok, strict=True) if good)
    total_output = sum(outs)
    data: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": backend,
        "backend": backend,
        "label": result.policy,
        "model_id": result.settings.get("model"),
        "tokenizer_id": result.settings.get("model"),
        "num_prompts": len(requests),
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": result.settings.get("max_concurrency"),
        "duration": duration,
        "completed": completed,
        "failed": len(requests) - completed,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": completed / duration if duration else 0.0,
        "request_goodput": None,
        "output_throughput": total_output / duration if duration else 0.0,
        "total_token_throughput": (total_input + total_output) / duration if duration else 0.0,
        "input_lens": [r.prompt_tokens for r in requests],
        "output_lens": outs,
        "ttfts": ttfts,
        "start_times": [r.arrival_s for r in requests],
        "errors": ["" if good else (r.error or "no first token") for r, good in
                   zip(requests, ok, strict=True)],
        "mean_ttft_ms": _ms(np.mean(good_ttfts or 0)),
        "median_ttft_ms": _ms(np.median(good_ttfts or 0)),
        "std_ttft_ms": _ms(np.std(good_ttfts or 0)),
        **{f"p{_p_word(p)}_ttft_ms": _ms(np.percentile(good_ttfts or 0, p)) for p in percentiles},
        "fairway_trace_name": result.trace_name,
        "fairway_request_ids": [r.request_id for r in requests],
        "fairway_phases": [r.phase for r in requests],
        "fairway_cached_tokens": [r.cached_tokens for r in requests],
    }
    return data


def _duration(result: ReplayResult) -> float:
    """Seconds from the first send to the last first token (the replay's wall time if none)."""
    starts = [r.arrival_s for r in result.requests]
    ends = [r.first_token_s for r in result.requests if r.first_token_s is not None]
    if starts and ends:
        return max(ends) - min(starts)
    return float(result.simulated_s if result.simulated_s is not None else result.wall_s)


def _ms(seconds: Any) -> float:
    return float(seconds) * 1000.0


def _p_word(p: float) -> str:
    """vLLM's percentile key: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def save_vllm_result(result: ReplayResult, path: str | Path, **kwargs: Any) -> Path:
    """Write `to_vllm_result(result, **kwargs)` as JSON (vLLM writes one object per file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = to_vllm_result(result, **kwargs)
    path.write_text(json.dumps(data, allow_nan=False) + "\n", encoding="utf-8")
    return path


def from_vllm_result(
    data: Mapping[str, Any], *, policy: str | None = None, trace_name: str | None = None
) -> ReplayResult:
    """A `vllm bench serve --save-result --save-detailed` dict as a `ReplayResult`.

    Times: `arrival_s` is each request's `start_times` entry minus the first one (0 when the file
    has no start times), `first_token_s` = arrival + ttft for requests with an empty `error`.

    Args:
        data: the JSON object vLLM saved.
        policy: the row label (default: the file's `label`, else its `backend`).
        trace_name: default: the file's `fairway_trace_name`, `dataset_name` or "vllm-bench".

    Raises:
        ResultError: a per-request field is missing (vLLM omits them without
            `--save-detailed`) or the lists disagree in length.
    """
    if not isinstance(data, Mapping):
        raise ResultError(f"not a vllm bench serve result: expected an object, got "
                          f"{type(data).__name__}")
    missing = [name for name in DETAILED_FIELDS if not isinstance(data.get(name), list)]
    if missing:
        raise ResultError(
            f"vllm bench serve result lacks the per-request fields {', '.join(missing)}: run "
            "`vllm bench serve` with --save-result --save-detailed"
        )
    n = len(data["ttfts"])
    starts = data.get("start_times") or [0.0] * n
    ids = data.get("fairway_request_ids") or [f"vllm-{i}" for i in range(n)]
    phases = data.get("fairway_phases") or [None] * n
    cached = data.get("fairway_cached_tokens") or [None] * n
    lists = {"input_lens": data["input_lens"], "errors": data["errors"], "start_times": starts,
             "fairway_request_ids": ids, "fairway_phases": phases,
             "fairway_cached_tokens": cached}
    wrong = [f"{name} ({len(v)})" for name, v in lists.items() if len(v) != n]
    if wrong:
        raise ResultError(f"vllm bench serve result: {n} ttfts but {', '.join(wrong)} entries")
    origin = min(starts) if starts else 0.0
    requests = []
    for i in range(n):
        arrival = float(starts[i]) - origin
        error = data["errors"][i] or None
        ttft = data["ttfts"][i]
        if error is None and (ttft is None or not math.isfinite(float(ttft))):
            error = "no first token"
        requests.append(RequestResult(
            request_id=str(ids[i]),
            arrival_s=arrival,
            phase=phases[i],
            prompt_tokens=int(data["input_lens"][i]),
            first_scheduled_s=None,
            first_token_s=arrival + float(ttft) if error is None else None,
            cached_tokens=cached[i],
            error=error,
        ))
    return ReplayResult(
        policy=policy or str(data.get("label") or data.get("backend") or "vllm"),
        trace_name=trace_name or str(data.get("fairway_trace_name") or data.get("dataset_name")
                                     or "vllm-bench"),
        settings={"mode": "vllm-bench-serve", "model": data.get("model_id"),
                  "date": data.get("date"), "request_rate": data.get("request_rate")},
        requests=requests,
        wall_s=float(data.get("duration") or 0.0),
        simulated_s=None,
    )


def load_vllm_result(path: str | Path, **kwargs: Any) -> ReplayResult:
    """Read a `vllm bench serve --save-result --save-detailed` file (see `from_vllm_result`).

    vLLM's `--append-result` writes one JSON object per line; this reads the last one.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ResultError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        lines = [line for line in text.splitlines() if line.strip()]
        try:  # --append-result: one object per line
            data = json.loads(lines[-1]) if len(lines) > 1 else None
        except json.JSONDecodeError:
            data = None
        if data is None:
            raise ResultError(f"{path} is not JSON: {exc}") from exc
    try:
        return from_vllm_result(data, **kwargs)
    except ResultError as exc:
        raise ResultError(f"{path}: {exc}") from exc
