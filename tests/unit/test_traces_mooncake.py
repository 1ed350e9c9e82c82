"""Mooncake loader: exact sharing, time scaling, window, length limit, sampling, bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairway.errors import TraceError
from fairway.traces.build import build_trace
from fairway.traces.format import load_trace, write_trace
from fairway.traces.mooncake import load_mooncake

RECORDS = [
    {"timestamp": 0, "input_length": 1200, "output_length": 10, "hash_ids": [0, 1, 2]},
    {"timestamp": 1000, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 3]},
    {"timestamp": 3000, "input_length": 600, "output_length": 7, "hash_ids": [0, 4]},
    {"timestamp": 3000, "input_length": 2048, "output_length": 9, "hash_ids": [5, 6, 7, 8]},
]
TOTAL_TOKENS = 1200 + 1100 + 600 + 2048


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny_trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


def _build(path: Path, capacity: float = 1000.0, **params):
    return build_trace("mooncake", 0, None, capacity, path=str(path), **params)


def test_blocks_keep_sharing_exactly(tiny: Path) -> None:
    r1, r2, r3, r4 = _build(tiny).requests
    assert r1.blocks == (("mc-0", 512), ("mc-1", 512), ("mc-2:176", 176))
    assert r2.blocks[:2] == r1.blocks[:2] and r2.blocks[2] != r1.blocks[2]
    assert r3.blocks[:1] == r1.blocks[:1] and r3.blocks[1] != r1.blocks[1]
    assert r4.blocks == (("mc-5", 512), ("mc-6", 512), ("mc-7", 512), ("mc-8", 512))
    assert [r.prompt_tokens for r in (r1, r2, r3, r4)] == [1200, 1100, 600, 2048]
    assert all(r.max_tokens == 1 and r.phase is None for r in (r1, r2, r3, r4))
    assert r1.tags["output_length"] == 10 and r1.tags["line"] == 1
    # Equal leading blocks give equal leading token ids.
    assert r1.token_ids(32000)[:1024] == r2.token_ids(32000)[:1024]


def test_time_scaled_to_target_load(tiny: Path) -> None:
    trace = _build(tiny, capacity=1000.0, load=2.0)
    # Span 3 s as released; prompt work 4948 tokens must arrive at 2 x 1000 tokens/s.
    scale = TOTAL_TOKENS / (2.0 * 1000.0 * 3.0)
    assert [r.arrival_s for r in trace.requests] == pytest.approx(
        [0.0, 1.0 * scale, 3.0 * scale, 3.0 * scale], abs=1e-6)
    assert trace.header.duration_s == pytest.approx(3.0 * scale, abs=1e-6)
    assert trace.header.info["time_scale"] == pytest.approx(scale)


def test_window(tiny: Path) -> None:
    trace = _build(tiny, window_start_s=1.0, window_s=2.5)
    assert [r.tags["line"] for r in trace.requests] == [2, 3, 4]
    assert trace.requests[0].arrival_s == 0.0
    with pytest.raises(TraceError, match="no \\(sampled\\) request"):
        _build(tiny, window_start_s=100.0)


def test_cap_and_drop_are_counted(tiny: Path) -> None:
    capped = _build(tiny, max_prompt_tokens=1000, over_length="cap")
    assert [r.prompt_tokens for r in capped.requests] == [1000, 1000, 600, 1000]
    assert capped.requests[0].blocks == (("mc-0", 512), ("mc-1:488", 488))
    assert capped.requests[0].tags["capped_from"] == 1200
    assert capped.header.info["num_capped"] == 3 and capped.header.info["num_dropped"] == 0
    dropped = _build(tiny, max_prompt_tokens=1000, over_length="drop")
    assert [r.tags["line"] for r in dropped.requests] == [3]
    assert dropped.header.info["num_dropped"] == 3 and dropped.header.info["num_capped"] == 0


def test_sampling_keeps_whole_conversations(tmp_path: Path) -> None:
    lines = []
    for conv in range(60):
        for turn in range(3):  # three turns of each conversation, growing prompts
            ids = [0, 1000 + conv] + [10_000 + conv * 10 + k for k in range(turn)]
            lines.append({"timestamp": conv * 10 + turn, "input_length": 512 * len(ids),
                          "output_length": 1, "hash_ids": ids})
    path = tmp_path / "conv.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    trace = _build(path, sample_fraction=0.3)
    kept = {}
    for r in trace.requests:
        kept.setdefault(r.blocks[1][0], 0)
        kept[r.blocks[1][0]] += 1
    assert 5 <= len(kept) <= 35
    assert set(kept.values()) == {3}


def test_deterministic_and_seeded_jitter(tiny: Path, tmp_path: Path) -> None:
    a = write_trace(_build(tiny, jitter_ms=3000.0), tmp_path / "a.jsonl").read_bytes()
    b = write_trace(_build(tiny, jitter_ms=3000.0), tmp_path / "b.jsonl").read_bytes()
    other = build_trace("mooncake", 1, None, 1000.0, path=str(tiny), jitter_ms=3000.0)
    assert a == b
    assert write_trace(other, tmp_path / "c.jsonl").read_bytes() != a
    assert load_trace(tmp_path / "a.jsonl").header.params["path"] == str(tiny)


def test_mooncake_takes_no_shape(tiny: Path) -> None:
    with pytest.raises(TraceError, match="takes no shape"):
        build_trace("mooncake", 0, "spike", 1000.0, path=str(tiny))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "bad JSON"),
        ('{"timestamp": 5, "input_length": 10, "output_length": 1}', "missing key 'hash_ids'"),
        ('{"timestamp": 5, "input_length": 1100, "output_length": 1, "hash_ids": [1, 2]}',
         "needs ceil(1100/512) = 3"),
        ('{"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [1]}',
         "timestamp"),
        ('{"timestamp": 5, "input_length": 0, "output_length": 1, "hash_ids": []}',
         "input_length"),
        ('{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": ["a"]}',
         "list of integers"),
    ],
)
def test_bad_mooncake_file_names_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n" + line + "\n")
    with pytest.raises(TraceError) as err:
        load_mooncake(path)
    assert f"{path}:2:" in str(err.value)
    assert message in str(err.value)
    with pytest.raises(TraceError, match=":2:"):
        _build(path)


def test_missing_mooncake_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="not found"):
        _build(tmp_path / "absent.jsonl")
