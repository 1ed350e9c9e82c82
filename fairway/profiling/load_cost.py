"""What a hit in vLLM's CPU offload tier costs: a host-to-device load, not a recompute.

A prefix held in the offload tier (vLLM's `--kv-offloading-size`, the `OffloadingConnector`) is
copied back to the GPU instead of computed. Its price in the order's unit (tokens of prefill) is
the load time over the compute time of the same tokens: `load_to_compute(profile)`. The load time
is the model's KV bytes per token over the host-to-device copy rate.

Where the figures come from, in this order: the profile's `metadata["load_cost"]` (written by
`fairway profile` on a GPU: the model's KV bytes per token from its config and the copy rates
measured with pinned host tensors), else an estimate for the profile's GPU class (`ESTIMATES`,
marked `source: "estimate"`, from the link's nominal rate and the model named in the profile).
An estimate is labelled as one wherever it is printed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from fairway.errors import ProfileError
from fairway.profiling.table import PrefillProfile

#: Tokens of the step the ratio is taken at (vLLM's default token budget per step).
RATIO_CHUNK_TOKENS = 2048


@dataclass(frozen=True)
class LoadCost:
    """Copy figures of one GPU + model.

    Attributes:
        kv_bytes_per_token: K and V of every layer for one token (2 x layers x KV heads x head
            size x dtype bytes).
        h2d_bytes_per_s: host-to-device copy rate (loads from the tier).
        d2h_bytes_per_s: device-to-host copy rate (stores into the tier).
        source: "measured" or "estimate".
        note: how the figures were obtained.
    """

    kv_bytes_per_token: int
    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    source: str = "estimate"
    note: str = ""

    def __post_init__(self) -> None:
        if self.kv_bytes_per_token <= 0 or self.h2d_bytes_per_s <= 0 or self.d2h_bytes_per_s <= 0:
            raise ProfileError(f"load cost figures must be positive: {self}")

    def load_s(self, tokens: float) -> float:
        """Seconds to copy `tokens` tokens of KV from the tier to the GPU."""
        return tokens * self.kv_bytes_per_token / self.h2d_bytes_per_s

    def store_s(self, tokens: float) -> float:
        """Seconds to copy `tokens` tokens of KV from the GPU to the tier."""
        return tokens * self.kv_bytes_per_token / self.d2h_bytes_per_s

    def load_to_compute(self, profile: PrefillProfile,
                        chunk_tokens: int = RATIO_CHUNK_TOKENS) -> float:
        """Load time over prefill time of one full step's tokens (the tier's price per token,
        in tokens of prefill). Taken at a full step because that is how the tokens would be
        computed otherwise: in the engine's chunks."""
        return self.load_s(chunk_tokens) / profile.prefill_s(chunk_tokens)

    def tokens_per_gib(self) -> float:
        """Tokens of KV one GiB of the tier holds (sizing `--kv-offloading-size`)."""
        return (1 << 30) / self.kv_bytes_per_token

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def kv_bytes_per_token(layers: int, kv_heads: int, head_size: int, dtype_bytes: int) -> int:
    """K and V of every layer for one token."""
    return 2 * layers * kv_heads * head_size * dtype_bytes


#: Llama-3.1-8B in bf16: 32 layers, 8 KV heads of 128 (grouped-query attention).
LLAMA31_8B_KV_BYTES = kv_bytes_per_token(32, 8, 128, 2)
#: Fairway's tiny random-weight Llama in fp32 on the CPU engine: 2 layers, 4 KV heads of 64.
TINY_LLAMA_KV_BYTES = kv_bytes_per_token(2, 4, 64, 4)

#: Estimates per hardware class, matched by a substring of the profile's `metadata.hardware`
#: (first match wins). Rates are effective pinned-memory copy rates, not the link's peak:
#: PCIe 4.0 x16 peaks at 32 GB/s per direction and pinned `cudaMemcpyAsync` reaches ~24-26 GB/s;
#: PCIe 5.0 x16 (H100/H200 PCIe hosts) ~50 GB/s; on a CPU engine the "tier" copy is a memcpy
#: between two host buffers (~5 GB/s on one core, a conservative figure for a shared VM).
ESTIMATES: tuple[tuple[str, float, str], ...] = (
    ("A6000", 24e9, "PCIe 4.0 x16, pinned copies ~24 GB/s (nominal 32 GB/s)"),
    ("A100", 24e9, "PCIe 4.0 x16, pinned copies ~24 GB/s (nominal 32 GB/s)"),
    ("L40", 24e9, "PCIe 4.0 x16, pinned copies ~24 GB/s (nominal 32 GB/s)"),
    ("H100", 50e9, "PCIe 5.0 x16, pinned copies ~50 GB/s (nominal 64 GB/s)"),
    ("H200", 50e9, "PCIe 5.0 x16, pinned copies ~50 GB/s (nominal 64 GB/s)"),
    ("CPU", 5e9, "host memcpy, ~5 GB/s on one core of a shared VM"),
)
#: When the hardware matches none of the classes: PCIe 4.0's figure.
FALLBACK_RATE = 24e9


def _model_kv_bytes(metadata: Mapping[str, Any]) -> tuple[int, str]:
    model = str(metadata.get("model", ""))
    if "tiny" in model.lower():
        return TINY_LLAMA_KV_BYTES, "the tiny Llama's fp32 KV (2 layers x 4 heads x 64)"
    return LLAMA31_8B_KV_BYTES, "Llama-3.1-8B's bf16 KV (32 layers x 8 KV heads x 128)"


def estimate(profile: PrefillProfile) -> LoadCost:
    """The documented estimate for the profile's hardware class and model (not a measurement)."""
    metadata = profile.metadata
    hardware = str(metadata.get("hardware", ""))
    rate, link = FALLBACK_RATE, "unknown hardware: PCIe 4.0 x16's ~24 GB/s"
    for name, class_rate, class_link in ESTIMATES:
        if name.lower() in hardware.lower():
            rate, link = class_rate, class_link
            break
    kv_bytes, kv_note = _model_kv_bytes(metadata)
    return LoadCost(
        kv_bytes_per_token=kv_bytes, h2d_bytes_per_s=rate, d2h_bytes_per_s=rate,
        source="estimate",
        note=f"ESTIMATE, not a measurement: {link}; {kv_note}. Measure with `fairway profile` "
             "on the GPU.",
    )


def for_profile(profile: PrefillProfile) -> LoadCost:
    """The profile's measured load figures (`metadata.load_cost`), else the estimate."""
    saved = profile.metadata.get("load_cost")
    if saved is None:
        return estimate(profile)
    if not isinstance(saved, Mapping):
        raise ProfileError(f"metadata.load_cost must be an object, not {saved!r}")
    try:
        return LoadCost(
            kv_bytes_per_token=int(saved["kv_bytes_per_token"]),
            h2d_bytes_per_s=float(saved["h2d_bytes_per_s"]),
            d2h_bytes_per_s=float(saved["d2h_bytes_per_s"]),
            source=str(saved.get("source", "measured")),
            note=str(saved.get("note", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"metadata.load_cost is not readable ({exc!r}): {saved!r}") from None
