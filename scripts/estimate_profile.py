"""Regenerate fairway/profiles/a6000-llama3.1-8b-estimate.json (an analytic estimate).

T(L) = overhead_s + FLOPs(L) / (mfu * peak_flops), with
FLOPs(L) = 2 * params * L + 2 * layers * hidden * L^2   (dense matmuls + causal attention).
"""

from fairway.profiling.table import from_points

PARAMS = 8.03e9  # Llama-3.1-8B parameters
LAYERS = 32
HIDDEN = 4096
PEAK_FLOPS = 154.8e12  # RTX A6000 dense BF16 tensor peak (sparsity not counted)
MFU = 0.5  # assumed model FLOPs utilisation during prefill
OVERHEAD_S = 0.015  # assumed fixed per-step cost (scheduling, launch, sampling)
LENGTHS = [128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384, 24576, 32768, 65536, 131072]


def estimate(length: int) -> float:
    flops = 2 * PARAMS * length + 2 * LAYERS * HIDDEN * length**2
    return OVERHEAD_S + flops / (MFU * PEAK_FLOPS)


if __name__ == "__main__":
    profile = from_points(
        [(n, round(estimate(n), 6)) for n in LENGTHS],
        source="estimate",
        hardware="NVIDIA RTX A6000 (48 GB)",
        model="meta-llama/Llama-3.1-8B",
        note="Analytic estimate, NOT a measurement. Replace with `fairway profile` on your GPU.",
        formula="T(L) = overhead_s + (2*params*L + 2*layers*hidden*L^2) / (mfu * peak_flops)",
        constants={
            "params": PARAMS, "layers": LAYERS, "hidden": HIDDEN, "peak_flops": PEAK_FLOPS,
            "mfu": MFU, "overhead_s": OVERHEAD_S,
        },
        generated_by="scripts/estimate_profile.py",
    )
    profile.save("fairway/profiles/a6000-llama3.1-8b-estimate.json")
    for n, t in profile.points:
        print(f"{n:>7} {t:.4f} s")
