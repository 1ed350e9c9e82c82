"""What accelerator or CPU this machine has, in words, for a profile table's `hardware` entry.

Why apart from `fairway.profiling.profiler`: the profiler measures a server over HTTP, which may
run anywhere; this reads the local machine (`nvidia-smi`, `/proc/cpuinfo`), and is used only
when the server is started here (`fairway profile --model`) or by a benchmark on this machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from fairway.machine import cpu_model


def detect_local_hardware() -> str | None:
    """This machine's accelerator (`nvidia-smi`) or CPU model and usable cores; None if unknown."""
    gpus = _nvidia_gpus()
    if gpus:
        names = sorted(set(gpus))
        return ", ".join(f"{gpus.count(n)} x {n}" for n in names)
    model = cpu_model()
    if model is None:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"CPU: {model}, {cores} cores usable"


def _nvidia_gpus() -> list[str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [" (".join(part.strip() for part in line.split(",", 1)) + ")"
            for line in out.splitlines() if line.strip()]
