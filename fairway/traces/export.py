"""Export a trace for another replay client: `vllm bench serve --dataset-name timed_trace`.

vLLM's `TimedTrace` loader (vllm/benchmarks/datasets/datasets.py) reads Mooncake-style JSONL:
one request per line with ``timestamp``, ``input_length``, ``output_length`` and ``hash_ids``, where
each hash id stands for ``--timed-trace-chunk-hash-size`` tokens of content and equal ids expand to
equal token ids. A Fairway trace describes prompts as content blocks of any length, so the export
re-cuts every prompt into fixed chunks of `chunk_tokens`:

* a chunk's id names its exact content: the list of ``(block_id, offset, tokens)`` segments it
  covers. Two requests get the same chunk id exactly when those tokens are the same in the Fairway
  trace, so a prefix shared in whole chunks stays shared, and vLLM's prefix cache sees it;
* the last chunk of a prompt whose length is not a multiple of `chunk_tokens` is short; its id
  also names its length, and vLLM expands a short chunk under its own key (``"id:size"``), so it is
  shared only with an identical short chunk. Sharing is therefore kept to the chunk below the
  first difference: pick `chunk_tokens` no larger than the server's KV block size (the default,
  16, is vLLM's default block size on GPUs and half the CPU backend's) and nothing a prefix cache
  could reuse is lost.

Timestamps are written in seconds (`--timed-trace-sec-multiplier 1`, vLLM's default).

Beside the loader's four fields each row keeps the request's ``request_id``, and its ``tenant``
and ``priority`` when the trace sets them (only then, as in the trace file). vLLM's loader reads
its fields by name and ignores the others, so these are for other tools and for analysis:
`vllm bench serve` sends neither a tenant nor a priority (`fairway replay --url` does).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fairway.errors import TraceError
from fairway.traces.format import Trace, TraceRequest

#: Formats `fairway trace export` writes.
FORMATS = ("vllm-timed-trace",)
#: Default tokens per hash id: vLLM's default block size and its loader's default chunk size.
DEFAULT_CHUNK_TOKENS = 16

Segment = tuple[str, int, int]  # (block_id, offset in the block, tokens)


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote (for the command's message and tests)."""

    path: Path
    num_requests: int
    num_chunk_ids: int
    chunk_tokens: int


def chunk_signatures(request: TraceRequest, chunk_tokens: int) -> Iterator[tuple[Segment, ...]]:
    """The prompt of `request` cut into chunks of `chunk_tokens`, each as its content segments.

    The last chunk is shorter when the prompt length is not a multiple of `chunk_tokens`.
    """
    chunk: list[Segment] = []
    room = chunk_tokens
    for block_id, tokens in request.blocks:
        offset = 0
        while offset < tokens:
            take = min(room, tokens - offset)
            chunk.append((block_id, offset, take))
            offset += take
            room -= take
            if room == 0:
                yield tuple(chunk)
                chunk, room = [], chunk_tokens
    if chunk:
        yield tuple(chunk)


def timed_trace_rows(trace: Trace, chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> list[dict]:
    """One `TimedTrace` row per request, in arrival order (see the module docstring)."""
    if not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise TraceError(f"chunk_tokens must be an integer >= 1, got {chunk_tokens!r}")
    ids: dict[tuple[Segment, ...], int] = {}
    rows = []
    for request in trace:
        chunks = chunk_signatures(request, chunk_tokens)
        hash_ids = [ids.setdefault(sig, len(ids)) for sig in chunks]
        row = {
            "timestamp": round(request.arrival_s, 6),
            "input_length": request.prompt_tokens,
            "output_length": request.max_tokens,
            "hash_ids": hash_ids,
            "request_id": request.request_id,
        }
        if request.tenant is not None:
            row["tenant"] = request.tenant
        if request.priority != 0:
            row["priority"] = request.priority
        rows.append(row)
    return rows


def export_trace(
    trace: Trace,
    path: str | Path,
    fmt: str = "vllm-timed-trace",
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> ExportSummary:
    """Write `trace` in format `fmt` to `path` (the caller decides whether it may overwrite).

    Raises:
        TraceError: unknown format or bad chunk size.
    """
    if fmt not in FORMATS:
        raise TraceError(f"unknown export format {fmt!r}; formats: {', '.join(FORMATS)}")
    out = Path(path)
    rows = timed_trace_rows(trace, chunk_tokens)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    num_ids = len({i for row in rows for i in row["hash_ids"]})
    return ExportSummary(out, len(rows), num_ids, chunk_tokens)


def bench_command(summary: ExportSummary, url: str = "http://127.0.0.1:8000",
                  model: str = "MODEL") -> str:
    """The `vllm bench serve` command line that replays an exported file."""
    return (
        f"vllm bench serve --backend vllm --base-url {url} --model {model} "
        f"--dataset-name timed_trace --dataset-path {summary.path} "
        f"--num-prompts {summary.num_requests} "
        f"--timed-trace-chunk-hash-size {summary.chunk_tokens} --timed-trace-sec-multiplier 1"
    )
