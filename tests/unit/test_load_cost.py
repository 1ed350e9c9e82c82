"""The offload tier's load cost: estimates per hardware class, saved figures, the shipped ratio."""

from __future__ import annotations

import pytest

from fairway.errors import ProfileError
from fairway.profiling import load_cost
from fairway.profiling.load_cost import (
    LLAMA31_8B_KV_BYTES,
    TINY_LLAMA_KV_BYTES,
    LoadCost,
    estimate,
    for_profile,
)
from fairway.profiling.table import from_points, load

POINTS = [(128, 0.01), (2048, 0.2)]


def test_kv_bytes_of_the_named_models() -> None:
    assert LLAMA31_8B_KV_BYTES == 2 * 32 * 8 * 128 * 2 == 131072
    assert TINY_LLAMA_KV_BYTES == 2 * 2 * 4 * 64 * 4


@pytest.mark.parametrize(
    ("hardware", "rate"),
    [
        ("1 x NVIDIA RTX A6000 (49140 MiB)", 24e9),
        ("NVIDIA A100-SXM4-80GB", 24e9),
        ("NVIDIA L40S", 24e9),
        ("1 x NVIDIA H100 80GB HBM3", 50e9),
        ("nvidia h200", 50e9),  # matched case-insensitively
        ("CPU: AMD EPYC 7763, 8 cores usable", 5e9),
        ("a TPU", load_cost.FALLBACK_RATE),
        ("", load_cost.FALLBACK_RATE),
    ],
)
def test_estimate_per_hardware_class(hardware: str, rate: float) -> None:
    cost = estimate(from_points(POINTS, hardware=hardware, model="meta-llama/Llama-3.1-8B"))
    assert (cost.h2d_bytes_per_s, cost.d2h_bytes_per_s) == (rate, rate)
    assert cost.source == "estimate"
    assert cost.note.startswith("ESTIMATE, not a measurement")
    assert cost.kv_bytes_per_token == LLAMA31_8B_KV_BYTES


def test_estimate_knows_the_tiny_model() -> None:
    cost = estimate(from_points(POINTS, hardware="CPU: x", model="/tmp/tiny-model"))
    assert cost.kv_bytes_per_token == TINY_LLAMA_KV_BYTES


def test_a_saved_load_cost_is_read_not_estimated() -> None:
    saved = {"kv_bytes_per_token": 65536, "h2d_bytes_per_s": 2.5e10, "d2h_bytes_per_s": 2.0e10,
             "source": "measured", "note": "pinned copies on cuda:0"}
    cost = for_profile(from_points(POINTS, hardware="NVIDIA H100", load_cost=saved))
    assert cost == LoadCost(65536, 2.5e10, 2.0e10, "measured", "pinned copies on cuda:0")
    assert cost.to_json() == saved
    assert cost.load_s(1000) == pytest.approx(1000 * 65536 / 2.5e10)
    assert cost.store_s(1000) == pytest.approx(1000 * 65536 / 2.0e10)
    assert cost.tokens_per_gib() == pytest.approx((1 << 30) / 65536)


def test_a_saved_load_cost_without_source_is_measured() -> None:
    saved = {"kv_bytes_per_token": 1, "h2d_bytes_per_s": 1, "d2h_bytes_per_s": 1}
    assert for_profile(from_points(POINTS, load_cost=saved)).source == "measured"


def test_without_a_saved_entry_the_estimate_is_used() -> None:
    profile = from_points(POINTS, hardware="NVIDIA H200")
    assert for_profile(profile) == estimate(profile)


@pytest.mark.parametrize(
    ("saved", "needle"),
    [
        ("fast", "must be an object"),
        ([1, 2, 3], "must be an object"),
        ({"h2d_bytes_per_s": 1e9, "d2h_bytes_per_s": 1e9}, "not readable"),  # no KV size
        ({"kv_bytes_per_token": "many", "h2d_bytes_per_s": 1e9, "d2h_bytes_per_s": 1e9},
         "not readable"),
        ({"kv_bytes_per_token": 1024, "h2d_bytes_per_s": None, "d2h_bytes_per_s": 1e9},
         "not readable"),
        ({"kv_bytes_per_token": 1024, "h2d_bytes_per_s": 0, "d2h_bytes_per_s": 1e9},
         "must be positive"),
        ({"kv_bytes_per_token": -1, "h2d_bytes_per_s": 1e9, "d2h_bytes_per_s": 1e9},
         "must be positive"),
    ],
)
def test_bad_saved_entries_are_profile_errors(saved: object, needle: str) -> None:
    with pytest.raises(ProfileError, match=needle):
        for_profile(from_points(POINTS, load_cost=saved))


def test_load_to_compute_on_the_shipped_profile() -> None:
    """Llama-3.1-8B's 128 KiB per token at 24 GB/s over the A6000 table's T(2048)."""
    profile = load("a6000-llama3.1-8b-estimate")
    cost = for_profile(profile)
    assert cost.source == "estimate"
    assert cost.load_to_compute(profile) == pytest.approx(0.0246, abs=5e-4)
    expected = 2048 * LLAMA31_8B_KV_BYTES / 24e9 / profile.prefill_s(2048)
    assert cost.load_to_compute(profile) == pytest.approx(expected)
