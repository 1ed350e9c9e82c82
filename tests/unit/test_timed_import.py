"""`import_timed_trace`: a timed-trace JSONL file read as vLLM's `TimedTrace` loader reads it.

Checked here without vLLM: the block ids (full chunks by hash id, a short last chunk by id and
size), cut and ignored hash ids, millisecond timestamps, file order and ids, the header, and one
clear error per bad line, with its number. tests/integration/test_timed_import_roundtrip.py
compares the same files with vLLM's own loader and round-trips `fairway trace export`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairway.errors import TraceError
from fairway.traces.format import load_trace, write_trace
from fairway.traces.timed_import import import_timed_trace


def _row(ts: float, n: int, ids: list, out: int = 1) -> dict:
    return {"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": ids}


def _write(tmp_path: Path, rows: list, name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _shared_blocks(a, b) -> int:
    n = 0
    for x, y in zip(a.blocks, b.blocks, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_blocks_follow_hash_ids_and_the_short_last_chunk_rule(tmp_path) -> None:
    rows = [
        _row(0, 40, [1, 2, 3]),       # 16 + 16 + 8: a short "3:8"
        _row(1, 48, [1, 2, 4], 5),    # a different third chunk
        _row(2, 40, [1, 2, 3]),       # identical to the first, short chunk included
        _row(3, 44, [1, 2, 3]),       # same ids, a short chunk of another size
        _row(4, 50, [1, 2, 3, 5]),    # id 3 in full here
    ]
    t = import_timed_trace(_write(tmp_path, rows), chunk_tokens=16)
    r = t.requests
    assert [x.request_id for x in r] == [f"t{i:06d}" for i in range(5)]
    assert [x.prompt_tokens for x in r] == [40, 48, 40, 44, 50]
    assert r[0].blocks == (("1:16", 16), ("2:16", 16), ("3:8", 8))
    assert [x.max_tokens for x in r] == [1, 5, 1, 1, 1]
    assert [x.phase for x in r] == [None] * 5
    assert _shared_blocks(r[0], r[1]) == 2
    assert r[0].blocks == r[2].blocks
    assert _shared_blocks(r[0], r[3]) == 2  # "3:8" vs "3:12": vLLM keys them apart
    assert _shared_blocks(r[0], r[4]) == 2  # "3:8" vs "3:16"
    assert r[4].blocks[2:] == (("3:16", 16), ("5:2", 2))
    assert [x.tags["line"] for x in r] == [1, 2, 3, 4, 5]


def test_millisecond_timestamps_count_from_the_first_line(tmp_path) -> None:
    rows = [_row(1000, 600, [7, 8]), _row(1500, 512, [7]), _row(1500, 10, [9]),
            _row(4000.5, 1024, [7, 8])]
    t = import_timed_trace(_write(tmp_path, rows), chunk_tokens=512, sec_multiplier=0.001)
    assert [x.arrival_s for x in t] == [0.0, 0.5, 0.5, 3.0005]
    assert t.requests[0].blocks == (("7:512", 512), ("8:88", 88))
    assert t.requests[1].blocks == (("7:512", 512),)
    assert t.requests[3].blocks == (("7:512", 512), ("8:512", 512))
    h = t.header
    assert (h.family, h.num_requests, h.duration_s) == ("timed-trace", 4, 3.0005)
    assert h.params == {"source": "t.jsonl", "chunk_tokens": 512, "sec_multiplier": 0.001}
    assert h.info["first_timestamp"] == 1000.0
    assert set(h.info["sources"]) == {"t.jsonl"} and len(h.info["sources"]["t.jsonl"]) == 64


def test_missing_ids_cut_the_prompt_and_extra_ids_are_ignored(tmp_path) -> None:
    rows = [_row(0, 100, [1, 2]), _row(0, 20, [1, 8, 9, 10]), _row(0, 32, [1, 2])]
    t = import_timed_trace(_write(tmp_path, rows), chunk_tokens=16)
    cut, extra, exact = t.requests
    assert cut.prompt_tokens == 32 and cut.tags["cut_from"] == 100
    assert extra.blocks == (("1:16", 16), ("8:4", 4)) and "cut_from" not in extra.tags
    assert exact.blocks == cut.blocks and "cut_from" not in exact.tags
    assert (t.header.info["num_cut"], t.header.info["tokens_cut"]) == (1, 68)


def test_string_ids_name_and_file_round_trip(tmp_path) -> None:
    rows = [_row(0, 20, ["a", "b"]), _row(0.25, 20, ["a", 3], 4)]
    t = import_timed_trace(_write(tmp_path, rows), chunk_tokens=16, name="mine")
    assert t.requests[0].blocks[0] == t.requests[1].blocks[0] == ("a:16", 16)
    assert t.header.preset == "mine"
    assert load_trace(write_trace(t, tmp_path / "out.jsonl.gz")) == t


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "bad JSON"),
        ("[1, 2]", "must be a JSON object"),
        ("", "empty line"),
        ('{"timestamp": 1, "input_length": 5, "hash_ids": [1]}', "missing field output_length"),
        (json.dumps(_row(-1, 5, [1])), "timestamp must be a finite number >= 0"),
        (json.dumps(_row(1, -5, [1])), "input_length must be an integer >= 1"),
        (json.dumps(_row(1, 0, [1])), "input_length must be an integer >= 1"),
        (json.dumps(_row(1, 5.5, [1])), "input_length must be an integer >= 1"),
        (json.dumps(_row(1, 5, [1], 0)), "output_length must be an integer >= 1"),
        (json.dumps(_row(1, 5, [])), "hash_ids is empty"),
        (json.dumps(_row(1, 5, 7)), "hash_ids must be a list"),
        (json.dumps(_row(1, 5, [None])), "a hash id must be an integer or a string"),
        (json.dumps(_row(0.5, 5, [1])), "earlier than the line before"),
    ],
)
def test_a_bad_line_is_named_by_its_number(tmp_path, line: str, message: str) -> None:
    path = _write(tmp_path, [_row(1, 5, [1]), line, _row(9, 5, [1])])
    with pytest.raises(TraceError, match=message) as info:
        import_timed_trace(path, chunk_tokens=16)
    assert str(info.value).startswith(f"{path}:2: ")


def test_bad_arguments_and_files(tmp_path) -> None:
    path = _write(tmp_path, [_row(0, 5, [1])])
    with pytest.raises(TraceError, match="chunk_tokens must be an integer >= 1"):
        import_timed_trace(path, chunk_tokens=0)
    with pytest.raises(TraceError, match="sec_multiplier must be a finite number > 0"):
        import_timed_trace(path, chunk_tokens=16, sec_multiplier=0.0)
    with pytest.raises(TraceError, match="not found"):
        import_timed_trace(tmp_path / "absent.jsonl", chunk_tokens=16)
    with pytest.raises(TraceError, match="empty file"):
        import_timed_trace(_write(tmp_path, [], "empty.jsonl"), chunk_tokens=16)
