"""Builders: determinism, prefix sharing (SEC, MuSiQue), phases, flood mix, the registry.

SEC and MuSiQue build from the source data (the `sources` fixture of tests/conftest.py) and are
skipped, with the reason, where it is absent.
Traces are kept short with inline shapes so the module runs in a few seconds.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from fairway.errors import TraceError
from fairway.traces.build import (
    FAMILIES,
    PRESETS,
    build_preset,
    build_trace,
    make_params,
    parse_param_strings,
    rebuild,
)
from fairway.traces.data import data_dir, data_file
from fairway.traces.format import Trace, load_trace, trace_bytes, write_trace
from fairway.traces.shapes import get_shape

SHORT = "calm:0.5:20,spike:2:10,after:0.5:10"
CAPACITY = 4000.0


def _need(*names: str) -> None:
    for name in names:
        try:
            data_file(name)
        except TraceError:
            pytest.skip(f"source data file {name} not found (data directory {data_dir()}): "
                        "this test checks a build from the source data")


def _need_sec() -> None:
    _need("financebench/financebench_filing_pages.jsonl.gz",
          "financebench/financebench_open_source.jsonl",
          "sec_filings/sec_10k_fy2023_sections.jsonl.gz")


def _need_musique() -> None:
    _need("musique/musique_ans_v1.0_dev.subset200.jsonl")


def _assert_phases_match_windows(trace: Trace) -> None:
    shape = get_shape(trace.header.shape)
    windows = trace.header.phases
    assert windows == shape.windows()
    for r in trace.requests:
        if r.tags.get("kind") == "warmup":  # flood's warm-up requests precede the shape
            assert r.phase == "warmup"
            continue
        inside = [w for w in windows if w.start_s <= r.arrival_s < w.end_s]
        expected = inside[0].name if inside else windows[-1].name
        assert r.phase == expected, (r.request_id, r.arrival_s, r.phase)


# ---------------------------------------------------------------------------------- flood


def test_flood_deterministic_and_seeded() -> None:
    a = trace_bytes(build_trace("flood", 3, SHORT, CAPACITY))
    b = trace_bytes(build_trace("flood", 3, SHORT, CAPACITY))
    c = trace_bytes(build_trace("flood", 4, SHORT, CAPACITY))
    assert a == b
    assert a != c


def test_rebuild_from_header_gives_same_bytes(tmp_path: Path) -> None:
    trace = build_trace("flood", 5, SHORT, CAPACITY, miss_tokens=4096)
    path = write_trace(trace, tmp_path / "f.jsonl")
    again = rebuild(load_trace(path).header)
    assert trace_bytes(again) == path.read_bytes()


def test_flood_phases_and_mix() -> None:
    trace = build_trace("flood", 1, "backlog:1.3:20,flood:0.9:20,calm:0.3:20", CAPACITY,
                        calm_miss_fraction=0.5)
    _assert_phases_match_windows(trace)
    kinds = defaultdict(set)
    for r in trace.requests:
        kinds[r.phase].add(r.tags["kind"])
    assert kinds["warmup"] == {"warmup"}
    assert kinds["backlog"] == {"miss"}
    assert kinds["flood"] == {"hit"}
    assert kinds["calm"] == {"miss", "hit"}
    hits = [r for r in trace.requests if r.tags["kind"] == "hit"]
    assert len({r.blocks[0] for r in hits}) == 1  # one shared prefix
    assert len({r.blocks[1] for r in hits}) == len(hits)  # unique suffixes
    # The flood is cheap per request, so it brings many more requests than the backlog.
    n = {p: sum(r.phase == p for r in trace.requests) for p in ("backlog", "flood")}
    assert n["flood"] > 10 * n["backlog"]


def test_flood_warmup_precedes_backlog_and_shares_prefix() -> None:
    shape = "backlog:1.3:20,flood:0.9:20,calm:0.3:20"
    trace = build_trace("flood", 1, shape, CAPACITY)
    assert trace.header.params["warmup_requests"] == 1  # the default, recorded in the header
    first, *rest = trace.requests
    assert first.tags == {"kind": "warmup", "prefix": 0} and first.phase == "warmup"
    assert first.arrival_s == 0.0
    misses = [r for r in rest if r.tags["kind"] == "miss" and r.phase == "backlog"]
    assert misses and first.arrival_s < min(r.arrival_s for r in misses)
    hits = [r for r in rest if r.tags["kind"] == "hit"]
    assert {r.blocks[0] for r in hits} == {first.blocks[0]}  # the flood's shared prefix
    assert first.blocks[1] not in {r.blocks[1] for r in hits}  # its own suffix
    assert trace.header.info["warmup"] == [
        {"request_id": first.request_id, "arrival_s": 0.0, "prefix": 0}
    ]
    # The warm-up requests are extra: the rest of the trace is the one without them.
    cold = build_trace("flood", 1, shape, CAPACITY, warmup_requests=0)
    assert cold.requests == tuple(rest)
    assert cold.header.info["warmup"] == []


def test_flood_warmup_several_prefixes_and_determinism() -> None:
    shape = "backlog:1.3:20,flood:0.9:20,calm:0.3:20"
    kwargs = {"num_prefixes": 2, "warmup_requests": 3, "warmup_spacing_s": 0.25}
    trace = build_trace("flood", 2, shape, CAPACITY, **kwargs)
    assert trace_bytes(trace) == trace_bytes(build_trace("flood", 2, shape, CAPACITY, **kwargs))
    warm = [r for r in trace.requests if r.tags["kind"] == "warmup"]
    assert [r.arrival_s for r in warm] == [0.0, 0.25, 0.5]
    assert [r.tags["prefix"] for r in warm] == [0, 1, 0]  # each prefix warmed in turn
    prefixes = {r.tags["prefix"]: r.blocks[0] for r in trace.requests if r.tags["kind"] == "hit"}
    assert all(r.blocks[0] == prefixes[r.tags["prefix"]] for r in warm)
    ids = [r.request_id for r in trace.requests]
    assert len(set(ids)) == len(ids)
    with pytest.raises(TraceError, match="warmup_requests"):
        build_trace("flood", 2, shape, CAPACITY, warmup_requests=-1)
    with pytest.raises(TraceError, match="warmup_spacing_s"):
        build_trace("flood", 2, shape, CAPACITY, warmup_spacing_s=-1)


def test_phase_labels_match_shape_windows() -> None:
    _assert_phases_match_windows(build_trace("flood", 2, "a:1:7.5,b:0.4:12.5,c:2:5", CAPACITY))


def test_capacity_scales_request_count() -> None:
    slow = build_trace("flood", 1, SHORT, 2000.0)
    fast = build_trace("flood", 1, SHORT, 8000.0)
    assert 2.5 < len(fast) / len(slow) < 6
    assert build_trace("flood", 1, SHORT).header.capacity_tps == pytest.approx(4509.5, abs=1)


# ---------------------------------------------------------------------------------- registry


def test_registry_names() -> None:
    assert set(FAMILIES) == {
        "sec", "sec-long", "musique", "mooncake", "flood", "hit-heavy", "tenants",
        "agent-sessions"}
    assert set(PRESETS) == {
        "sec-a", "sec-b", "sec-long", "musique", "mooncake", "flood", "hit-heavy",
        "mooncake-long", "hit-heavy-long", "tenants", "tenants-mixed", "priority",
        "agent-sessions", "agent-sessions-busy",
    }
    for spec in PRESETS.values():
        make_params(spec["family"], spec["params"])  # every preset parameter is valid


def test_unknown_names_and_params() -> None:
    with pytest.raises(TraceError, match="families: agent-sessions, flood, hit-heavy, mooncake"):
        build_trace("nope", 0)
    with pytest.raises(TraceError, match="unknown parameter.*zipf"):
        build_trace("flood", 0, SHORT, zipf=1)
    with pytest.raises(TraceError, match="must be int"):
        make_params("flood", {"miss_tokens": "many"})
    with pytest.raises(TraceError, match="seed"):
        build_trace("flood", -1, SHORT)
    with pytest.raises(TraceError, match="KEY=VALUE"):
        parse_param_strings(["novalue"])


def test_string_params_are_converted() -> None:
    p = make_params("mooncake", parse_param_strings(
        ["load=1.5", "max_prompt_tokens=none", "window_s=30", "over_length=drop"]))
    assert (p.load, p.max_prompt_tokens, p.window_s, p.over_length) == (1.5, None, 30.0, "drop")
    assert make_params("flood", {"miss_tokens": 4096.0}).miss_tokens == 4096


def test_flood_preset_builds() -> None:
    trace = build_preset("flood", shape="backlog:1.3:10,flood:0.9:10,calm:0.3:10")
    assert trace.header.preset == "flood" and trace.header.seed == PRESETS["flood"]["seed"]
    # The preset starts warm: its first request computes the flood's prefix before any miss.
    assert trace.header.params["warmup_requests"] >= 1
    assert trace.header.params["miss_tokens"] == 8192
    first = trace.requests[0]
    assert first.tags["kind"] == "warmup" and first.arrival_s == 0.0
    hit = next(r for r in trace.requests if r.tags["kind"] == "hit")
    assert first.blocks[0] == hit.blocks[0]


# ---------------------------------------------------------------------------------- SEC


@pytest.fixture(scope="module")
def sec_trace(source_data_dir: Path) -> Trace:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FAIRWAY_DATA", str(source_data_dir))
        _need_sec()
        return build_trace("sec", 11, SHORT, CAPACITY, zipf_s=1.2, drift_per_min=2.0)


def test_sec_requests_on_one_filing_share_all_excerpts(sec_trace: Trace) -> None:
    by_filing = defaultdict(list)
    for r in sec_trace.requests:
        by_filing[r.tags["filing"]].append(r)
        assert r.blocks[0][0] == "sec-system-v1"
        assert r.blocks[-1][0] == r.tags["question_id"]
        pages = [int(b.rsplit("-p", 1)[1]) for b, _ in r.blocks[1:-1]]
        assert pages == sorted(pages)  # canonical page order
    pairs = 0
    for reqs in by_filing.values():
        excerpts = {r.blocks[:-1] for r in reqs}
        assert len(excerpts) == 1  # system prompt + every excerpt block identical
        questions = {r.blocks[-1] for r in reqs}
        pairs += len(questions) > 1
    assert pairs > 0  # some filing got two different questions
    assert any(len(v) > 1 for v in by_filing.values())
    lengths = sorted(r.prompt_tokens for r in sec_trace.requests)
    assert 1500 < lengths[len(lengths) // 2] < 8000  # a few thousand tokens


def test_sec_deterministic_and_seeded(sec_trace: Trace, sources: Path) -> None:
    again = build_trace("sec", 11, SHORT, CAPACITY, zipf_s=1.2, drift_per_min=2.0)
    other = build_trace("sec", 12, SHORT, CAPACITY, zipf_s=1.2, drift_per_min=2.0)
    assert trace_bytes(again) == trace_bytes(sec_trace)
    assert trace_bytes(other) != trace_bytes(sec_trace)
    _assert_phases_match_windows(sec_trace)
    assert sec_trace.header.info["token_estimate"].startswith("ceil(chars / 4)")


def test_sec_popularity_is_skewed(sec_trace: Trace) -> None:
    counts = sorted(
        (sum(r.tags["filing"] == f for r in sec_trace.requests)
         for f in {r.tags["filing"] for r in sec_trace.requests}), reverse=True)
    assert counts[0] >= 3 * counts[len(counts) // 2]


def test_sec_drift_rotates_the_popular_filing(sources: Path) -> None:
    _need_sec()
    # zipf_s=3 puts ~80% of requests on rank 0; a shift every second changes who holds it.
    still = build_trace("sec", 2, "calm:1:20", CAPACITY, zipf_s=3.0)
    moving = build_trace("sec", 2, "calm:1:20", CAPACITY, zipf_s=3.0, drift_per_min=60.0)
    top_still = {r.tags["filing"] for r in still.requests if r.tags["rank"] == 0}
    top_moving = {r.tags["filing"] for r in moving.requests if r.tags["rank"] == 0}
    assert len(top_still) == 1
    assert len(top_moving) >= 5


def test_sec_long_lengths(sources: Path) -> None:
    _need_sec()
    trace = build_trace("sec-long", 3, "calm:1:60", CAPACITY, max_prompt_tokens=12000)
    lengths = [r.prompt_tokens for r in trace.requests]
    assert max(lengths) <= 12000
    assert min(lengths) < 2000 and max(lengths) > 6000


# ---------------------------------------------------------------------------------- MuSiQue


@pytest.fixture(scope="module")
def musique_trace(source_data_dir: Path) -> Trace:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FAIRWAY_DATA", str(source_data_dir))
        _need_musique()
        return build_trace("musique", 5, SHORT, CAPACITY, think_mean_s=1.5)


def test_musique_hops_extend_previous_hop(musique_trace: Trace) -> None:
    by_id = {r.request_id: r for r in musique_trace.requests}
    sessions = defaultdict(list)
    for r in musique_trace.requests:
        sessions[r.tags["session"]].append(r)
        parent = r.tags["parent"]
        if r.tags["hop"] == 1:
            assert parent is None
            continue
        prev = by_id[parent]
        assert prev.tags["hop"] == r.tags["hop"] - 1
        assert r.blocks[: len(prev.blocks)] == prev.blocks
        assert len(r.blocks) > len(prev.blocks)
        assert r.arrival_s >= prev.arrival_s
    for reqs in sessions.values():
        assert 2 <= len(reqs) == reqs[0].tags["num_hops"] <= 4
        assert [r.tags["hop"] for r in reqs] == list(range(1, len(reqs) + 1))


def test_musique_deterministic_and_phases(musique_trace: Trace, sources: Path) -> None:
    again = build_trace("musique", 5, SHORT, CAPACITY, think_mean_s=1.5)
    assert trace_bytes(again) == trace_bytes(musique_trace)
    assert trace_bytes(build_trace("musique", 6, SHORT, CAPACITY, think_mean_s=1.5)) != (
        trace_bytes(musique_trace))
    _assert_phases_match_windows(musique_trace)
    # Sessions only share the system prompt across different questions.
    firsts = [r for r in musique_trace.requests if r.tags["hop"] == 1]
    assert len({r.blocks[0] for r in firsts}) == 1
    assert len({r.blocks[1] for r in firsts}) == len(firsts)
