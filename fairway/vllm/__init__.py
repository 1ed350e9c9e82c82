"""Fairway inside vLLM: the only package that imports vllm.

Kept light on purpose: importing `fairway.vllm` does not import vLLM. vLLM resolves
`--scheduler-cls fairway.vllm.FairwayScheduler` by attribute, so the classes are loaded lazily.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FairwayAsyncScheduler", "FairwayScheduler"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from fairway.vllm import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
