"""`fairway trace import` against vLLM's own `TimedTrace` loader and `fairway trace export`.

* A Mooncake-style file (512-token hash ids, millisecond timestamps, short last chunks, prompts cut
  where the hash ids run out, ids beyond the prompt) built here, so no data set is needed: vLLM's
  loader and the import agree on every prompt length, output length and (shifted) timestamp, and
  two requests share exactly the tokens vLLM gives them in common. vLLM samples each chunk's
  tokens at random, so two different chunks may agree on a token or two by chance (a 50,000-token
  vocabulary makes three a 1e-14 event); a chunk shared on one side only would differ by a chunk.
* Fairway trace -> `export` (16-token chunks) -> `import` keeps lengths, arrivals (counted from the
  first request), max_tokens, and each pair's common prefix down to the export's granularity: the
  whole 16-token chunks below the first difference, or everything for identical prompts.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairway.cli import main as fairway_main
from fairway.traces.format import Trace, TraceHeader, load_trace, write_trace
from fairway.traces.shipped import shipped_trace
from fairway.traces.timed_import import import_timed_trace

pytestmark = pytest.mark.integration

#: Token ids of Fairway's own realization: so many that two blocks never agree by chance.
HUGE_VOCAB = 2**62
#: The vocabulary of the stand-in tokenizer vLLM's loader samples from.
VLLM_VOCAB = 50_000
#: Extra tokens two different vLLM chunks may share by chance (see the module docstring).
CHANCE = 3


class _Tokenizer:
    """The two tokenizer calls `TimedTrace` makes: a vocabulary and the special ids."""

    all_special_ids = [0, 1]

    def get_vocab(self) -> dict[str, int]:
        return {f"t{i}": i for i in range(VLLM_VOCAB)}


def _vllm_samples(path, chunk: int, multiplier: float) -> list:
    from vllm.benchmarks.datasets.datasets import TimedTrace

    loader = TimedTrace(
        dataset_path=str(path),
        timed_trace_chunk_hash_size=chunk,
        timed_trace_sec_multiplier=multiplier,
        timed_trace_label_timestamp="timestamp",
        timed_trace_label_input_length="input_length",
        timed_trace_label_output_length="output_length",
        timed_trace_label_hash_ids="hash_ids",
    )
    return loader.sample(_Tokenizer(), num_requests=10**6)


def _common(a, b) -> int:
    a, b = np.asarray(a), np.asarray(b)
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def _mooncake_rows() -> list[dict]:
    """A small Mooncake-like slice: conversations that grow, shared system prompts, ms times."""
    rows = []
    for i in range(24):
        system = [100 + i % 3]                      # three shared first chunks
        history = [1000 + i % 5 + k * 10 for k in range(i % 4)]
        ids = system + history + [5000 + i, 6000 + i]
        n = 512 * (len(ids) - 1) + (37 * i) % 512 + 1   # a short last chunk, mostly
        if i % 7 == 3:
            n += 600  # more tokens than the ids cover: vLLM cuts the prompt
        if i % 6 == 1:
            ids = ids + [9000 + i]  # an id beyond the prompt: ignored
        rows.append({"timestamp": 5000 + 500 * (i // 2),  # pairs arrive together
                     "input_length": n, "output_length": 1 + i % 3, "hash_ids": ids})
    rows[5]["hash_ids"], rows[5]["input_length"] = rows[4]["hash_ids"], rows[4]["input_length"]
    # Same ids and length up to the short last chunk, which has another id: not shared.
    rows[7]["hash_ids"] = rows[6]["hash_ids"][:-1] + [7777]
    rows[7]["input_length"] = rows[6]["input_length"]
    return rows


def _write_rows(path, rows: list[dict]):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _assert_same_as_vllm(path, chunk: int, multiplier: float) -> None:
    ours = import_timed_trace(path, chunk_tokens=chunk, sec_multiplier=multiplier)
    theirs = _vllm_samples(path, chunk, multiplier)
    assert len(theirs) == len(ours)
    offset = ours.header.info["first_timestamp"] * multiplier
    tokens = [r.token_ids(HUGE_VOCAB) for r in ours]
    for s, r in zip(theirs, ours, strict=True):
        assert s.prompt_len == len(s.prompt) == r.prompt_tokens, r.request_id
        assert s.expected_output_len == r.max_tokens
        assert s.timestamp == pytest.approx(r.arrival_s + offset, abs=1e-6)
    for i in range(len(ours)):
        for j in range(i + 1, len(ours)):
            shared = _common(tokens[i], tokens[j])
            seen = _common(theirs[i].prompt, theirs[j].prompt)
            assert shared <= seen <= shared + CHANCE, (i, j, shared, seen)


def test_a_mooncake_style_file_reads_as_vllm_reads_it(tmp_path) -> None:
    rows = _mooncake_rows()
    path = _write_rows(tmp_path / "mooncake-like.jsonl", rows)
    ours = import_timed_trace(path, chunk_tokens=512, sec_multiplier=0.001)
    assert ours.header.info["num_cut"] > 0  # the case vLLM handles by cutting is covered
    assert ours.requests[4].blocks == ours.requests[5].blocks
    assert ours.requests[6].blocks[:-1] == ours.requests[7].blocks[:-1]
    _assert_same_as_vllm(path, 512, 0.001)


@settings(max_examples=25, deadline=None)
@given(st.lists(  # few ids and short prompts (chunks of 4), so requests often share chunks
    st.tuples(st.integers(1, 14), st.lists(st.integers(0, 2), min_size=1, max_size=4),
              st.integers(0, 3)),
    min_size=2, max_size=8))
@example([(2, [1], 0), (2, [2], 0), (6, [1, 2], 1), (7, [1, 2], 1), (8, [1, 2], 1)])
def test_any_small_file_reads_as_vllm_reads_it(tmp_path_factory, lines) -> None:
    rows, ts = [], 0
    for n, ids, gap in lines:
        ts += gap
        rows.append({"timestamp": ts, "input_length": n, "output_length": 1, "hash_ids": ids})
    path = _write_rows(tmp_path_factory.mktemp("h") / "t.jsonl", rows)
    _assert_same_as_vllm(path, 4, 0.5)


def _sample_trace() -> Trace:
    """The first 60 requests of two shipped presets (long shared documents; short questions)."""
    reqs = []
    for preset in ("sec-a", "musique"):
        trace = shipped_trace(preset)
        assert trace is not None, f"the {preset} preset is shipped with the package"
        reqs.extend(trace.requests[:60])
    reqs.sort(key=lambda r: r.arrival_s)
    return Trace(TraceHeader("test", 0, None, {}, len(reqs)), tuple(reqs))


def test_export_then_import_keeps_the_trace(tmp_path, capsys) -> None:
    chunk = 16
    before = _sample_trace()
    src = write_trace(before, tmp_path / "before.jsonl.gz")
    exported, back = tmp_path / "vllm.jsonl", tmp_path / "back.jsonl.gz"
    assert fairway_main(["trace", "export", str(src), "-o", str(exported),
                         "--chunk-tokens", str(chunk)]) == 0
    argv = ["trace", "import", str(exported), "-o", str(back), "--chunk-tokens", str(chunk)]
    assert fairway_main(argv) == 0
    err = capsys.readouterr().err
    assert f"wrote {len(before)} requests" in err and "distinct chunks" in err
    after = load_trace(back)
    assert len(after) == len(before)
    first = before.requests[0].arrival_s
    for a, b in zip(after, before, strict=True):
        assert a.prompt_tokens == b.prompt_tokens
        assert a.max_tokens == b.max_tokens
        assert a.arrival_s == pytest.approx(b.arrival_s - first, abs=2e-6)
    old = [r.token_ids(HUGE_VOCAB) for r in before]
    new = [r.token_ids(HUGE_VOCAB) for r in after]
    pairs_sharing = 0
    for i in range(len(old)):
        for j in range(i + 1, len(old)):
            shared = _common(old[i], old[j])
            identical = shared == len(old[i]) == len(old[j])
            expected = shared if identical else shared // chunk * chunk
            assert _common(new[i], new[j]) == expected, (i, j, shared)
            pairs_sharing += expected >= chunk
    assert pairs_sharing > 0  # the sample does share prefixes
    assert fairway_main(argv) == 2 and "--force" in capsys.readouterr().err
    assert fairway_main([*argv, "--force"]) == 0
