"""The hit-heavy family (after SGLang #31954): shape, hit share, warm-up, determinism, errors."""

from __future__ import annotations

import pytest

from fairway.errors import TraceError
from fairway.traces.build import PRESETS, build_preset, build_trace, rebuild
from fairway.traces.format import trace_bytes
from fairway.traces.hitheavy import DEFAULT_SHAPE

SHORT = "calm:0.4:20,busy:0.75:60,calm:0.4:20"
CAPACITY = 4000.0


def kinds(trace) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in trace.requests:
        out[r.tags["kind"]] = out.get(r.tags["kind"], 0) + 1
    return out


def test_shape_hits_misses_and_warmup() -> None:
    trace = build_trace("hit-heavy", 3, SHORT, CAPACITY)
    p = trace.header.params
    assert (p["prefix_tokens"], p["suffix_tokens"], p["miss_tokens"]) == (8192, 256, 8448)
    # One warm-up per hot context first, at t = 0, 0.5, 1, 1.5 s, each a different context.
    warm = [r for r in trace.requests if r.tags["kind"] == "warmup"]
    assert [r.arrival_s for r in warm] == [0.0, 0.5, 1.0, 1.5]
    assert sorted(r.tags["prefix"] for r in warm) == [0, 1, 2, 3]
    assert all(r.phase == "warmup" for r in warm)
    hits = [r for r in trace.requests if r.tags["kind"] == "hit"]
    misses = [r for r in trace.requests if r.tags["kind"] == "miss"]
    for r in hits:  # a hot context and a unique suffix
        (prefix_id, prefix_len), (suffix_id, suffix_len) = r.blocks
        assert (prefix_len, suffix_len) == (8192, 256)
        assert prefix_id == warm[r.tags["prefix"]].blocks[0][0]
    assert len({r.blocks[1][0] for r in hits}) == len(hits)
    assert all(r.prompt_tokens == 8448 and len(r.blocks) == 1 for r in misses)
    assert len({r.blocks[0][0] for r in misses}) == len(misses)
    # Every phase of the shape gets the same mix (unlike the flood family).
    assert {r.phase for r in misses} >= {"calm", "busy"}


def test_hit_share_is_about_96_percent() -> None:
    trace = build_trace("hit-heavy", 1, DEFAULT_SHAPE)  # the full default shape, ~1,500 requests
    k = kinds(trace)
    share = k["hit"] / (k["hit"] + k["miss"])
    assert k["hit"] + k["miss"] > 1000
    assert 0.95 <= share <= 0.97
    # Busy phase arrives faster than calm: load follows the shape.
    busy = sum(1 for r in trace.requests if r.phase == "busy") / 180
    calm = sum(1 for r in trace.requests if r.phase == "calm") / 120
    assert 1.4 < busy / calm < 2.1  # loads 0.7 vs 0.4


def test_miss_fraction_parameter() -> None:
    none = kinds(build_trace("hit-heavy", 2, SHORT, CAPACITY, miss_fraction=0.0))
    assert "miss" not in none
    every = kinds(build_trace("hit-heavy", 2, SHORT, CAPACITY, miss_fraction=1.0, warmup=False))
    assert set(every) == {"miss"}


def test_deterministic_seeded_and_rebuildable() -> None:
    a = build_trace("hit-heavy", 5, SHORT, CAPACITY)
    assert trace_bytes(a) == trace_bytes(build_trace("hit-heavy", 5, SHORT, CAPACITY))
    assert trace_bytes(a) != trace_bytes(build_trace("hit-heavy", 6, SHORT, CAPACITY))
    assert trace_bytes(rebuild(a.header)) == trace_bytes(a)
    assert a.requests[-1].request_id.startswith("hit-heavy-")


def test_preset_is_registered_and_builds() -> None:
    spec = PRESETS["hit-heavy"]
    assert spec["family"] == "hit-heavy" and spec["shape"] == DEFAULT_SHAPE
    trace = build_preset("hit-heavy", shape=SHORT)
    assert trace.header.preset == "hit-heavy" and trace.header.seed == spec["seed"]
    assert "31954" in trace.header.info["source"]


def test_bad_parameters_are_trace_errors() -> None:
    with pytest.raises(TraceError, match="miss_fraction"):
        build_trace("hit-heavy", 0, SHORT, miss_fraction=1.5)
    with pytest.raises(TraceError, match="reserved"):
        build_trace("hit-heavy", 0, "backlog:1:10,calm:0.4:10")
    with pytest.raises(TraceError, match="must be >= 1"):
        build_trace("hit-heavy", 0, SHORT, suffix_tokens=0)


def test_contexts_of_several_lengths_step_evenly_in_whole_blocks() -> None:
    trace = build_trace("hit-heavy", 3, SHORT, CAPACITY, prefix_tokens=32768,
                        prefix_tokens_max=65536, miss_tokens=33024)
    lengths = [32768, 43696, 54608, 65536]
    assert trace.header.info["prefix_lengths"] == lengths
    assert all(n % 16 == 0 for n in lengths)
    warm = {r.tags["prefix"]: r for r in trace.requests if r.tags["kind"] == "warmup"}
    for r in trace.requests:
        if r.tags["kind"] in ("hit", "warmup"):
            (prefix_id, prefix_len), _ = r.blocks
            assert prefix_len == lengths[r.tags["prefix"]]
            assert prefix_id == warm[r.tags["prefix"]].blocks[0][0]
    # Each context's id carries its length, so one id always has one token count.
    assert len({w.blocks[0][0] for w in warm.values()}) == 4


def test_one_length_for_every_context_is_the_default_and_unchanged() -> None:
    base = build_trace("hit-heavy", 3, SHORT, CAPACITY)
    assert "prefix_lengths" not in base.header.info
    same = build_trace("hit-heavy", 3, SHORT, CAPACITY, prefix_tokens_max=8192)
    assert [r.blocks for r in same.requests] == [r.blocks for r in base.requests]


def test_the_long_preset_has_32k_to_64k_contexts_and_4_percent_long_misses() -> None:
    trace = build_preset("hit-heavy-long")
    assert trace.header.info["prefix_lengths"] == [32768, 43696, 54608, 65536]
    k = kinds(trace)
    assert 0.03 <= k["miss"] / (k["hit"] + k["miss"]) <= 0.06
    misses = [r for r in trace.requests if r.tags["kind"] == "miss"]
    assert misses and all(r.prompt_tokens >= 32_768 for r in misses)
    # The lead-in phase has no traffic of its own: the contexts are computed first.
    assert all(r.arrival_s >= 90 for r in trace.requests if r.tags["kind"] != "warmup")


def test_a_longest_context_below_the_shortest_is_an_error() -> None:
    with pytest.raises(TraceError, match="prefix_tokens_max \\(100\\) must be >= prefix_tokens"):
        build_trace("hit-heavy", 0, SHORT, prefix_tokens_max=100)
