"""Integration tests: vLLM's real V1 Scheduler on CPU, built offline by `fairway.vllm.offline`.

No model, no download: a tiny local config.json stands in for the model and a fake KV cache of a
given number of blocks for GPU memory. vLLM is imported once per session (~5-10 s).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def offline() -> Any:
    """The offline harness module (imports vLLM)."""
    from fairway.vllm import offline as harness

    return harness


def tokens(start: int, n: int) -> list[int]:
    """n distinct token ids from `start` (prompts that share nothing unless their ranges do)."""
    return list(range(start, start + n))


def queue_ids(scheduler: Any) -> list[str]:
    """Request ids of vLLM's waiting deque, in order."""
    return [r.request_id for r in scheduler.waiting]


def check_queues(scheduler: Any, expected_live: Iterable[str] | None = None) -> None:
    """Every live request sits in exactly one of waiting / kv_holding_waiting / running (and
    vLLM 0.34's async_kv_waiting)."""
    placed = (
        queue_ids(scheduler)
        + [r.request_id for r in scheduler.kv_holding_waiting]
        + [r.request_id for r in getattr(scheduler, "async_kv_waiting", ())]
        + [r.request_id for r in scheduler.running]
    )
    dupes = [rid for rid, n in Counter(placed).items() if n > 1]
    assert not dupes, f"requests in two places or twice: {dupes}"
    live = {rid for rid, r in scheduler.requests.items() if not r.is_finished()}
    assert set(placed) == live, (
        f"lost: {sorted(live - set(placed))}, unknown: {sorted(set(placed) - live)}"
    )
    if expected_live is not None:
        assert live == set(expected_live)


@pytest.fixture()
def helpers() -> SimpleNamespace:
    """Small helpers shared by the test modules (conftest is not importable as a module)."""
    return SimpleNamespace(tokens=tokens, queue_ids=queue_ids, check_queues=check_queues)
