"""Trace file format: deterministic bytes, validation with line numbers, token realization."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairway.errors import TraceError
from fairway.traces.format import (
    PhaseWindow,
    Trace,
    TraceHeader,
    TraceRequest,
    block_token_ids,
    load_trace,
    make_request,
    trace_bytes,
    write_trace,
)


def _trace(num: int = 3) -> Trace:
    reqs = tuple(
        make_request(
            f"r{i}", 0.5 * i, [("sys", 4), (f"doc-{i % 2}", 10), (f"q-{i}", 3)],
            phase="calm" if i < 2 else "spike", tags={"session": f"s{i}", "hop": 1},
        )
        for i in range(num)
    )
    header = TraceHeader(
        family="test", seed=7, shape="calm:1:1,spike:2:1", params={"b": 1.5, "a": None},
        num_requests=num, capacity_tps=1000.0, duration_s=2.0,
        phases=(PhaseWindow("calm", 0.0, 1.0, 1.0), PhaseWindow("spike", 1.0, 2.0, 2.0)),
        info={"note": "x"},
    )
    return Trace(header, reqs)


def test_round_trip_keeps_bytes_and_values(tmp_path: Path) -> None:
    trace = _trace()
    path = write_trace(trace, tmp_path / "t.jsonl")
    loaded = load_trace(path)
    assert loaded == trace
    write_trace(loaded, tmp_path / "again.jsonl")
    assert (tmp_path / "again.jsonl").read_bytes() == path.read_bytes()


def test_file_layout_is_fixed(tmp_path: Path) -> None:
    lines = trace_bytes(_trace(1)).decode().splitlines()
    header = json.loads(lines[0])
    assert list(header)[:3] == ["fairway_trace", "family", "seed"]
    assert header["fairway_trace"] == 1
    assert list(header["params"]) == ["a", "b"]  # sorted keys
    assert lines[1] == (
        '{"request_id":"r0","arrival_s":0.000000,"blocks":[["sys",4],["doc-0",10],["q-0",3]],'
        '"max_tokens":1,"phase":"calm","tags":{"hop":1,"session":"s0"}}'
    )


def test_gzip_output_is_deterministic(tmp_path: Path) -> None:
    a = write_trace(_trace(), tmp_path / "a.jsonl.gz").read_bytes()
    b = write_trace(_trace(), tmp_path / "b.jsonl.gz").read_bytes()
    assert a == b
    assert load_trace(tmp_path / "a.jsonl.gz") == _trace()


def test_request_properties() -> None:
    req = make_request("r", 1.23456789, [("a", 3), ("b", 5)])
    assert req.prompt_tokens == 8
    assert req.arrival_s == 1.234568
    assert req.max_tokens == 1


def test_token_ids_follow_blocks() -> None:
    a = make_request("a", 0, [("sys", 7), ("doc", 20), ("qa", 5)])
    b = make_request("b", 0, [("sys", 7), ("doc", 20), ("qb", 5)])
    ia, ib = a.token_ids(1000), b.token_ids(1000)
    assert len(ia) == a.prompt_tokens == 32
    assert ia[:27] == ib[:27]  # equal leading blocks => equal leading ids
    assert ia[27:] != ib[27:]
    assert all(4 <= t < 1000 for t in ia)
    assert a.token_ids(1000) == ia  # same block => same ids, every time
    assert all(10 <= t < 50 for t in a.token_ids(50, reserved=10))


def test_token_ids_rule_is_pinned() -> None:
    # Replays and live servers must see the same ids forever: pin the rule on two blocks.
    assert block_token_ids("a", 5, 1000).tolist() == [534, 673, 640, 551, 459]
    assert block_token_ids("sec-system-v1", 3, 128256).tolist() == [21273, 22359, 74286]
    key = int.from_bytes(hashlib.sha256(b"a").digest()[:8], "little")
    assert key > 0
    ids = block_token_ids("x", 100, 32000)
    assert not ids.flags.writeable
    assert len(set(ids.tolist())) > 90  # spread over the vocabulary


def test_token_ids_reject_tiny_vocab() -> None:
    with pytest.raises(TraceError, match="vocab_size"):
        block_token_ids("a", 3, 4)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "bad JSON"),
        ('{"arrival_s": 1.0, "blocks": [["a", 2]]}', "missing key request_id"),
        ('{"request_id": "x", "arrival_s": 1.0, "blocks": [["a", -2]]}', "tokens must be"),
        ('{"request_id": "x", "arrival_s": 1.0, "blocks": [["a", 3]]}', "one token count"),
        ('{"request_id": "x", "arrival_s": 0.1, "blocks": [["b", 2]]}', "goes backwards"),
        ('{"request_id": "r0", "arrival_s": 1.0, "blocks": [["b", 2]]}', "duplicate request_id"),
        ('{"request_id": "x", "arrival_s": 1.0, "blocks": []}', "non-empty list"),
        ('{"request_id": "x", "arrival_s": 1.0, "blocks": [["b", 2]], "max_tokens": 0}',
         "max_tokens"),
        ('{"request_id": "x", "arrival_s": 1.0, "blocks": [["b", 2]], "colour": 1}',
         "unknown key colour"),
    ],
)
def test_bad_request_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    header = json.dumps({"fairway_trace": 1, "family": "t", "seed": 0, "shape": None,
                         "params": {}, "num_requests": 2})
    good = '{"request_id": "r0", "arrival_s": 0.5, "blocks": [["a", 2]]}'
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{header}\n{good}\n{line}\n")
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert f"{path}:3:" in str(err.value)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("", ":1:", "empty file"),
        ('{"family": "t"}\n', ":1:", "not a Fairway trace header"),
        ('{"fairway_trace": 1, "family": "t", "seed": 0, "shape": null, "params": {}}\n', ":1:",
         "missing num_requests"),
        ('{"fairway_trace": 1, "family": "t", "seed": 0, "shape": null, "params": {}, '
         '"num_requests": 2}\n{"request_id": "a", "arrival_s": 0, "blocks": [["a", 1]]}\n',
         ":1:", "num_requests=2"),
    ],
)
def test_bad_header(tmp_path: Path, text: str, where: str, message: str) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(text)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert f"{path}{where}" in str(err.value)
    assert message in str(err.value)


def test_missing_file() -> None:
    with pytest.raises(TraceError, match="not found"):
        load_trace("/nonexistent/trace.jsonl")


def test_trace_construction_checks_order() -> None:
    header = TraceHeader("t", 0, None, {}, 2)
    reqs = (make_request("a", 2.0, [("x", 1)]), make_request("b", 1.0, [("y", 1)]))
    with pytest.raises(TraceError, match="backwards"):
        Trace(header, reqs)
    with pytest.raises(TraceError, match="tokens must be"):
        TraceRequest("a", 0.0, (("x", 0),))


_block = st.tuples(st.sampled_from(["a", "b", "c", "d", "e"]), st.just(0))


@settings(max_examples=40, deadline=None)
@given(
    gaps=st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=8),
    prompts=st.lists(st.lists(_block, min_size=1, max_size=4), min_size=8, max_size=8),
    tag=st.text(max_size=5),
)
def test_write_load_write_is_stable(tmp_path_factory, gaps, prompts, tag) -> None:
    sizes = {"a": 3, "b": 16, "c": 1, "d": 700, "e": 2}
    times = np.cumsum(gaps)
    reqs = tuple(
        make_request(f"r{i}", t, [(b, sizes[b]) for b, _ in prompts[i]], tags={"t": tag})
        for i, t in enumerate(times)
    )
    trace = Trace(TraceHeader("p", 1, None, {"x": tag}, len(reqs)), reqs)
    path = tmp_path_factory.mktemp("rt") / "t.jsonl"
    write_trace(trace, path)
    loaded = load_trace(path)
    assert trace_bytes(loaded) == path.read_bytes()
    assert [r.blocks for r in loaded.requests] == [r.blocks for r in reqs]
