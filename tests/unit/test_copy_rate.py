"""`fairway profile`'s load-cost measurement on the CPU: the timing and median with a fake clock,
KV bytes from a Hugging Face config, and the copy itself on a CPU device (the pinned CUDA path
runs only on a GPU machine)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fairway.errors import ProfileError
from fairway.profiling import copy_rate
from fairway.profiling.copy_rate import (
    CopyRates,
    kv_bytes_per_token_from_config,
    measure_load_cost,
    median_rate,
    read_model_config,
    time_copies,
)
from fairway.profiling.load_cost import LLAMA31_8B_KV_BYTES

LLAMA_31_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "hidden_size": 4096, "torch_dtype": "bfloat16"}


class FakeClock:
    """A clock that each copy advances by the next of `durations`."""

    def __init__(self, durations: list[float]) -> None:
        self.now = 0.0
        self.durations: Iterator[float] = iter(durations)
        self.calls: list[str] = []

    def __call__(self) -> float:
        return self.now

    def copy(self) -> None:
        self.calls.append("copy")
        self.now += next(self.durations)

    def wait(self) -> None:
        self.calls.append("wait")


def test_time_copies_skips_the_warmup_and_times_copy_plus_wait() -> None:
    clock = FakeClock([9.0, 9.0, 0.1, 0.3, 0.2])
    seconds = time_copies(clock.copy, clock.wait, warmup=2, repeats=3, clock=clock)
    assert seconds == pytest.approx([0.1, 0.3, 0.2])
    assert clock.calls == ["copy", "wait"] * 5


def test_the_rate_is_the_median_copy() -> None:
    assert median_rate(1000, [0.1, 10.0, 0.2]) == pytest.approx(1000 / 0.2)  # one slow copy


@pytest.mark.parametrize(("warmup", "repeats"), [(0, 0), (-1, 3)])
def test_time_copies_checks_its_counts(warmup: int, repeats: int) -> None:
    with pytest.raises(ProfileError, match="repeats >= 1"):
        time_copies(lambda: None, lambda: None, warmup=warmup, repeats=repeats)


def test_a_clock_that_does_not_advance_is_an_error() -> None:
    with pytest.raises(ProfileError, match="did not advance"):
        time_copies(lambda: None, lambda: None, repeats=2, clock=lambda: 1.0)


@pytest.mark.parametrize(
    ("config", "dtype", "expected"),
    [
        (LLAMA_31_8B, None, LLAMA31_8B_KV_BYTES),
        (LLAMA_31_8B, "auto", LLAMA31_8B_KV_BYTES),
        (LLAMA_31_8B, "float32", 2 * LLAMA31_8B_KV_BYTES),  # --dtype float32
        (LLAMA_31_8B, "fp8", LLAMA31_8B_KV_BYTES // 2),  # --kv-cache-dtype fp8
        # No num_key_value_heads: multi-head attention, KV heads = attention heads.
        ({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256,
          "torch_dtype": "float32"}, None, 2 * 2 * 4 * 64 * 4),
        # An explicit head_dim wins over hidden / heads (Gemma, Qwen3).
        ({"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
          "hidden_size": 640, "head_dim": 256, "dtype": "torch.float16"}, None,
         2 * 4 * 2 * 256 * 2),
        # A multimodal config keeps the language model under text_config.
        ({"text_config": LLAMA_31_8B, "torch_dtype": "bfloat16"}, None, LLAMA31_8B_KV_BYTES),
        # Multi-head latent attention: one latent of kv_lora_rank + rope dims per layer.
        ({"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
          "num_attention_heads": 128, "torch_dtype": "bfloat16"}, None, 61 * 576 * 2),
    ],
)
def test_kv_bytes_from_the_config(config: dict, dtype: str | None, expected: int) -> None:
    assert kv_bytes_per_token_from_config(config, dtype) == expected


@pytest.mark.parametrize(
    ("config", "dtype", "needle"),
    [
        ({**LLAMA_31_8B, "torch_dtype": None}, None, "dtype None"),
        (LLAMA_31_8B, "int3", "dtype 'int3'"),
        ({**LLAMA_31_8B, "num_hidden_layers": 0}, None, "'num_hidden_layers'"),
        ({k: v for k, v in LLAMA_31_8B.items() if k != "hidden_size"}, None, "'hidden_size'"),
        ({**LLAMA_31_8B, "hidden_size": 4097}, None, "not a multiple"),
    ],
)
def test_an_unreadable_config_says_what_is_missing(config: dict, dtype: str | None,
                                                   needle: str) -> None:
    with pytest.raises(ProfileError, match=needle) as info:
        kv_bytes_per_token_from_config(config, dtype)
    assert "--kv-bytes-per-token" in str(info.value)


def test_the_config_of_a_model_directory_is_read(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    assert read_model_config(str(tmp_path)) == LLAMA_31_8B
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(ProfileError, match="not a JSON object"):
        read_model_config(str(tmp_path))


def test_the_tiny_model_config_gives_its_kv_size(tmp_path: Path) -> None:
    from fairway.tiny_model import make_tiny_model

    model = make_tiny_model(tmp_path, hidden=128, layers=3, dtype="float16")
    config = read_model_config(str(model))
    assert config is not None
    assert kv_bytes_per_token_from_config(config) == 2 * 3 * 2 * 64 * 2


def test_the_copy_runs_on_a_cpu_device() -> None:
    """The same code the GPU runs, on two host buffers (no pinning, no synchronize)."""
    torch = pytest.importorskip("torch")
    rates = copy_rate.measure_copy_rates(torch.device("cpu"), num_bytes=1 << 20, warmup=1,
                                         repeats=3)
    assert rates.h2d_bytes_per_s > 0 and rates.d2h_bytes_per_s > 0
    assert (rates.num_bytes, rates.repeats, rates.warmup, rates.device) == (1 << 20, 3, 1, "cpu")


def test_measure_load_cost_on_a_given_device(tmp_path: Path, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    rates = CopyRates(2.5e10, 2.0e10, 256 << 20, 9, 2, "cuda:0")
    monkeypatch.setattr(copy_rate, "measure_copy_rates", lambda device: rates)
    cost = measure_load_cost(model=str(tmp_path), device=torch.device("cpu"))
    assert (cost.kv_bytes_per_token, cost.h2d_bytes_per_s, cost.d2h_bytes_per_s) == (
        LLAMA31_8B_KV_BYTES, 2.5e10, 2.0e10)
    assert cost.source == "measured"
    assert "median of 9 after 2 warm-up" in cost.note and "25.0 GB/s" in cost.note
    given = measure_load_cost(model=None, kv_bytes_per_token=4096, device=torch.device("cpu"))
    assert given.kv_bytes_per_token == 4096 and "as given" in given.note


def test_a_url_run_without_kv_size_is_skipped_with_the_reason() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(ProfileError, match="pass --kv-bytes-per-token"):
        measure_load_cost(model=None, device=torch.device("cpu"))


def test_without_cuda_nothing_is_measured(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ProfileError, match=r"torch.cuda.is_available\(\) is False"):
        measure_load_cost(model=None, kv_bytes_per_token=4096)
