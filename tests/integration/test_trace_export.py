"""`fairway trace export --format vllm-timed-trace`, read back by vLLM's own `TimedTrace` loader.

The round trip must keep the request count, every prompt and output length, the arrival times, and
the shared-prefix structure: two requests whose Fairway prompts agree on their first P tokens get
token ids from vLLM's loader that agree on at least the first floor(P / chunk) whole chunks and
differ in the chunk after (random vocab sampling could make a few tokens agree by chance, never a
whole 16-token chunk).
"""

from __future__ import annotations

import json

import pytest

from fairway.cli import main as fairway_main
from fairway.traces.export import chunk_signatures, export_trace, timed_trace_rows
from fairway.traces.format import Trace, TraceHeader, TraceRequest, load_trace, write_trace

pytestmark = pytest.mark.integration

CHUNK = 16


class _ByteTokenizer:
    """The two tokenizer calls `TimedTrace` makes: a vocabulary and the special ids."""

    all_special_ids = [0, 1]

    def get_vocab(self) -> dict[str, int]:
        return {f"t{i}": i for i in range(512)}


def _trace() -> Trace:
    doc = [("doc-a", 100), ("doc-b", 37)]
    reqs = [
        TraceRequest("r0", 0.0, (*doc, ("q0", 9))),
        TraceRequest("r1", 0.5, (*doc, ("q1", 40)), max_tokens=3),
        TraceRequest("r2", 1.25, (("doc-a", 100), ("other", 64))),
        TraceRequest("r3", 2.0, (("solo", 48),)),  # a whole number of chunks
        TraceRequest("r4", 2.0, (*doc, ("q0", 9))),  # identical to r0
    ]
    header = TraceHeader("test", 0, None, {}, len(reqs))
    return Trace(header, tuple(reqs))


def _common_prefix(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_chunks_cover_the_prompt_exactly() -> None:
    for req in _trace():
        chunks = list(chunk_signatures(req, CHUNK))
        sizes = [sum(n for _, _, n in c) for c in chunks]
        assert sum(sizes) == req.prompt_tokens
        assert all(s == CHUNK for s in sizes[:-1]) and 0 < sizes[-1] <= CHUNK


def test_equal_content_gets_equal_ids_and_only_then() -> None:
    rows = {r["request_id"]: r for r in timed_trace_rows(_trace(), CHUNK)}
    assert rows["r0"]["hash_ids"] == rows["r4"]["hash_ids"]
    # r0/r1 share 137 tokens: 8 whole chunks (128), then chunk 9 mixes doc-b with the question.
    assert rows["r0"]["hash_ids"][:8] == rows["r1"]["hash_ids"][:8]
    assert rows["r0"]["hash_ids"][8] != rows["r1"]["hash_ids"][8]
    # r2 shares 100 tokens of doc-a with r0: 6 whole chunks.
    assert rows["r0"]["hash_ids"][:6] == rows["r2"]["hash_ids"][:6]
    assert rows["r0"]["hash_ids"][6] != rows["r2"]["hash_ids"][6]


def test_round_trip_through_vllm_timed_trace(tmp_path) -> None:
    from vllm.benchmarks.datasets.datasets import TimedTrace

    trace = _trace()
    summary = export_trace(trace, tmp_path / "t.jsonl", chunk_tokens=CHUNK)
    loader = TimedTrace(
        dataset_path=str(summary.path),
        timed_trace_chunk_hash_size=CHUNK,
        timed_trace_sec_multiplier=1,
        timed_trace_label_timestamp="timestamp",
        timed_trace_label_input_length="input_length",
        timed_trace_label_output_length="output_length",
        timed_trace_label_hash_ids="hash_ids",
    )
    samples = loader.sample(_ByteTokenizer(), num_requests=100)
    reqs = list(trace)
    assert len(samples) == len(reqs)
    for s, r in zip(samples, reqs, strict=True):
        assert s.prompt_len == len(s.prompt) == r.prompt_tokens
        assert s.expected_output_len == r.max_tokens
        assert s.timestamp == pytest.approx(r.arrival_s)
    ours = [r.token_ids(512) for r in reqs]
    for i in range(len(reqs)):
        for j in range(i + 1, len(reqs)):
            shared = _common_prefix(ours[i], ours[j])
            theirs = _common_prefix(samples[i].prompt, samples[j].prompt)
            whole = shared // CHUNK * CHUNK
            if shared == len(ours[i]) == len(ours[j]):
                assert theirs == shared, (reqs[i].request_id, reqs[j].request_id)
            else:
                assert whole <= theirs < whole + CHUNK, (reqs[i].request_id, reqs[j].request_id)


def test_cli_export_refuses_to_overwrite(tmp_path, capsys) -> None:
    src = write_trace(_trace(), tmp_path / "t.jsonl.gz")
    out = tmp_path / "vllm.jsonl"
    argv = ["trace", "export", str(src), "--format", "vllm-timed-trace", "-o", str(out)]
    assert fairway_main(argv) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == len(load_trace(src))
    assert json.loads(lines[1])["output_length"] == 3
    assert "--timed-trace-chunk-hash-size 16" in capsys.readouterr().err
    assert fairway_main(argv) == 2
    assert "--force" in capsys.readouterr().err
    assert fairway_main([*argv, "--force"]) == 0
