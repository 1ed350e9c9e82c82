"""vLLM platform plugin of the version overlay (`vllm_sources.py`): the release's own CPU platform
over the CPU build, without the triton-cpu requirement.

vLLM 0.34's `CpuPlatform.check_and_update_config` raises on x86 when `triton` cannot be imported
(triton-cpu is not on the package index). The scheduler-level code the matrix runs never starts a
kernel, so while that method runs `vllm.triton_utils.HAS_TRITON` reads True; everything else is
vLLM's own code. Active only where the overlay's entry point is on `sys.path`.
"""

from __future__ import annotations

import functools
from typing import Any


def detect() -> str:
    """The platform class vLLM loads (its `vllm.platform_plugins` entry point)."""
    return "overlay_platform.OverlayCpuPlatform"


@functools.cache
def _platform_class() -> Any:
    from vllm.platforms.cpu import CpuPlatform

    class OverlayCpuPlatform(CpuPlatform):  # type: ignore[misc, valid-type]
        """vLLM's CpuPlatform, configured as if triton-cpu were present."""

        @classmethod
        def check_and_update_config(cls, vllm_config: Any) -> None:
            import vllm.triton_utils as triton_utils

            had = triton_utils.HAS_TRITON
            triton_utils.HAS_TRITON = True  # no kernel runs at the scheduler level
            try:
                super().check_and_update_config(vllm_config)
            finally:
                triton_utils.HAS_TRITON = had

    return OverlayCpuPlatform


def __getattr__(name: str) -> Any:
    # Built on first use: importing vLLM's platform module here at plugin discovery would
    # import `vllm.platforms` while it is resolving the current platform.
    if name == "OverlayCpuPlatform":
        return _platform_class()
    raise AttributeError(name)
