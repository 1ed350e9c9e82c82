"""Measure what a hit in vLLM's CPU offload tier costs to load: host<->device copy rates and the
model's KV bytes per token, saved by `fairway profile` as the profile's `metadata["load_cost"]`.

Plain PyTorch (must not import vllm): a pinned host buffer and a device buffer of the same size,
`non_blocking` copies each way, timed from the issue to `torch.cuda.synchronize()`, median of
several repetitions after warm-up. Pinned memory is what vLLM's CPU tier copies from, and a
pageable buffer would measure the driver's staging copy instead. The timing and the median
(`time_copies`) take the copy, the wait and the clock as functions, and `measure_copy_rates`
takes the torch device, so both run on the CPU in the unit tests; the CUDA path itself is run
only on a GPU machine (there is none where the tests run).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fairway.errors import ProfileError
from fairway.profiling.load_cost import LoadCost, kv_bytes_per_token

if TYPE_CHECKING:
    import torch

#: 256 MiB per copy: long enough (~5-10 ms over PCIe) that launch and sync overhead are noise,
#: small enough to fit beside anything else on the GPU.
DEFAULT_COPY_BYTES = 256 << 20
DEFAULT_WARMUP = 2
DEFAULT_REPEATS = 9

#: Bytes of one element of the dtypes a Hugging Face config or `--dtype`/`--kv-cache-dtype` name.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "float": 4, "fp32": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_ds_mla": 1, "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


@dataclass(frozen=True)
class CopyRates:
    """Median copy rates between pinned host memory and one device.

    Attributes:
        h2d_bytes_per_s: host to device (a load from the tier).
        d2h_bytes_per_s: device to host (a store into the tier).
        num_bytes: bytes per timed copy.
        repeats: timed copies per direction (after `warmup` untimed ones).
        warmup: untimed copies per direction first.
        device: the torch device, e.g. "cuda:0".
    """

    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    num_bytes: int
    repeats: int
    warmup: int
    device: str


def time_copies(
    copy: Callable[[], object],
    wait: Callable[[], object],
    *,
    warmup: int = DEFAULT_WARMUP,
    repeats: int = DEFAULT_REPEATS,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Seconds of `repeats` copies, each timed from issuing `copy()` to the end of `wait()`.

    `warmup` untimed copies come first (CUDA context, allocator, the first touch of the pages).

    Raises:
        ProfileError: `repeats` < 1, `warmup` < 0, or a copy timed at zero or less (a clock that
            does not advance cannot give a rate).
    """
    if repeats < 1 or warmup < 0:
        raise ProfileError(f"copy timing needs repeats >= 1 and warmup >= 0, "
                           f"got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        copy()
        wait()
    seconds = []
    for _ in range(repeats):
        start = clock()
        copy()
        wait()
        seconds.append(clock() - start)
    if min(seconds) <= 0:
        raise ProfileError(f"a copy was timed at {min(seconds)} s: the clock did not advance")
    return seconds


def median_rate(num_bytes: int, seconds: list[float]) -> float:
    """Bytes per second of the median copy (robust to one slow copy of a busy machine)."""
    return num_bytes / statistics.median(seconds)


def measure_copy_rates(
    device: torch.device,
    *,
    num_bytes: int = DEFAULT_COPY_BYTES,
    warmup: int = DEFAULT_WARMUP,
    repeats: int = DEFAULT_REPEATS,
    clock: Callable[[], float] = time.perf_counter,
) -> CopyRates:
    """Host<->device copy rates of `device`, pinned host memory when the device is CUDA.

    On a CPU device it times a memcpy between two host buffers (what the tests run); the figures
    `fairway profile` saves come from a CUDA device only.
    """
    import torch

    cuda = device.type == "cuda"
    host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=cuda)
    host.fill_(1)  # touch the pages before timing
    gpu = torch.empty(num_bytes, dtype=torch.uint8, device=device)

    def wait() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def h2d() -> None:
        gpu.copy_(host, non_blocking=True)

    def d2h() -> None:
        host.copy_(gpu, non_blocking=True)

    h2d_s = time_copies(h2d, wait, warmup=warmup, repeats=repeats, clock=clock)
    d2h_s = time_copies(d2h, wait, warmup=warmup, repeats=repeats, clock=clock)
    return CopyRates(median_rate(num_bytes, h2d_s), median_rate(num_bytes, d2h_s),
                     num_bytes, repeats, warmup, str(device))


# --- KV bytes per token -------------------------------------------------------------------------


def kv_bytes_per_token_from_config(config: Mapping[str, Any], dtype: str | None = None) -> int:
    """K and V of every layer for one token, from a Hugging Face `config.json`.

    2 x num_hidden_layers x num_key_value_heads x head_dim x dtype bytes; head_dim defaults to
    hidden_size / num_attention_heads and the KV heads to the attention heads (no grouped-query
    attention). A multi-head latent attention model (DeepSeek: `kv_lora_rank`) caches one latent
    vector per layer instead: layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes.
    A multimodal config's `text_config` is read when present.

    Args:
        config: the parsed `config.json`.
        dtype: the KV cache's dtype (vLLM's `--kv-cache-dtype`, else `--dtype`); None or "auto":
            the config's `torch_dtype` (or `dtype`).

    Raises:
        ProfileError: a needed field is missing or not a positive integer, or the dtype is unknown.
    """
    text = config.get("text_config")
    if isinstance(text, Mapping):
        config = {**config, **text}
    if dtype in (None, "auto"):
        dtype = config.get("torch_dtype") or config.get("dtype")
    if not isinstance(dtype, str) or dtype.removeprefix("torch.") not in DTYPE_BYTES:
        raise ProfileError(f"the KV cache's dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}; "
                           "pass --kv-bytes-per-token")
    dtype_bytes = DTYPE_BYTES[dtype.removeprefix("torch.")]
    layers = _positive(config, "num_hidden_layers")
    if "kv_lora_rank" in config:
        latent = _positive(config, "kv_lora_rank") + _positive(config, "qk_rope_head_dim")
        return layers * latent * dtype_bytes
    heads = _positive(config, "num_attention_heads")
    kv_heads = _positive(config, "num_key_value_heads") if "num_key_value_heads" in config \
        else heads
    if config.get("head_dim") is not None:
        head_dim = _positive(config, "head_dim")
    else:
        hidden = _positive(config, "hidden_size")
        if hidden % heads:
            raise ProfileError(f"hidden_size {hidden} is not a multiple of num_attention_heads "
                               f"{heads}; pass --kv-bytes-per-token")
        head_dim = hidden // heads
    return kv_bytes_per_token(layers, kv_heads, head_dim, dtype_bytes)


def _positive(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ProfileError(f"the model's config has no positive integer {key!r} (got {value!r}); "
                           "pass --kv-bytes-per-token")
    return value


def read_model_config(model: str) -> dict[str, Any] | None:
    """The model's `config.json`: from the directory `model`, else from the Hugging Face cache
    (`transformers`, which may download it when the machine is online); None when not found."""
    path = Path(model) / "config.json"
    if path.is_file():
        try:
            loaded = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ProfileError(f"cannot read {path}: {exc}") from None
        if not isinstance(loaded, dict):
            raise ProfileError(f"{path} is not a JSON object")
        return loaded
    try:
        from transformers import AutoConfig

        return dict(AutoConfig.from_pretrained(model).to_dict())
    except Exception:  # not a known name, offline, no transformers: the caller says so
        return None


def load_cost(rates: CopyRates, kv_bytes: int, kv_source: str) -> LoadCost:
    """The measured `LoadCost` (`source: "measured"`) with a note saying how it was measured."""
    gb = 1e9
    return LoadCost(
        kv_bytes_per_token=kv_bytes, h2d_bytes_per_s=rates.h2d_bytes_per_s,
        d2h_bytes_per_s=rates.d2h_bytes_per_s, source="measured",
        note=(f"copy rates on {rates.device}: pinned host <-> device tensors of "
              f"{rates.num_bytes >> 20} MiB, non_blocking copies timed to "
              f"torch.cuda.synchronize, median of {rates.repeats} after {rates.warmup} warm-up "
              f"(h2d {rates.h2d_bytes_per_s / gb:.1f} GB/s, d2h {rates.d2h_bytes_per_s / gb:.1f} "
              f"GB/s); KV bytes per token {kv_source}"),
    )


def cuda_device() -> torch.device:
    """The first CUDA device, which the copy rates are measured on.

    Raises:
        ProfileError: no torch, or `torch.cuda.is_available()` is False (the reason, for the
            line `fairway profile` prints).
    """
    try:
        import torch
    except ImportError:
        raise ProfileError("torch is not installed here") from None
    if not torch.cuda.is_available():
        raise ProfileError("no CUDA device here (torch.cuda.is_available() is False)")
    return torch.device("cuda", torch.cuda.current_device())


def measure_load_cost(
    *,
    model: str | None,
    kv_bytes_per_token: int | None = None,
    kv_dtype: str | None = None,
    device: torch.device | None = None,
) -> LoadCost:
    """What `fairway profile` saves as `metadata["load_cost"]`: copy rates measured on `device`
    (default: `cuda_device()`) and the KV bytes per token of `model`'s config (or as given).

    Args:
        model: the model directory or Hugging Face name whose `config.json` gives the KV size;
            None (a `--url` run): `kv_bytes_per_token` must be given.
        kv_bytes_per_token: the KV size as given (`--kv-bytes-per-token`); wins over the config.
        kv_dtype: the server's `--kv-cache-dtype`, else its `--dtype` (None: the config's).
        device: where to measure; None: the first CUDA device.

    Raises:
        ProfileError: nothing measured, with the reason (no CUDA, no config, the copy failed).
    """
    device = cuda_device() if device is None else device
    if kv_bytes_per_token is not None:
        kv_bytes, kv_source = kv_bytes_per_token, "as given (--kv-bytes-per-token)"
    else:
        config = read_model_config(model) if model is not None else None
        if config is None:
            where = "a --url run names no model" if model is None else \
                f"no config.json found for {model!r}"
            raise ProfileError(f"the KV bytes per token are unknown ({where}); pass "
                               "--kv-bytes-per-token N")
        kv_bytes = kv_bytes_per_token_from_config(config, kv_dtype)
        kv_source = f"from {model}'s config (dtype {kv_dtype or 'of the config'})"
    try:
        rates = measure_copy_rates(device)
    except RuntimeError as exc:  # e.g. out of memory beside a running server
        raise ProfileError(f"the copy on {device} failed: {exc}") from None
    return load_cost(rates, kv_bytes, kv_source)
