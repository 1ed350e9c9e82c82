"""The registry, the shared properties of every policy, and the import boundary (no vllm)."""

from __future__ import annotations

import ast
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fairway.policies as policies
from fairway.errors import FairwayConfigError
from fairway.policies.base import QueuedRequest, register_policy

REQUIRED = {
    "fcfs", "lpm", "klpm", "klpm-4", "klpm-8", "ragcache", "preble", "peek", "hrrn", "spf", "suf",
    "wspt", "vllm-window", "fairway", "fairway-step", "fairway-abswait", "fairway-nofair",
}
PACKAGE = pathlib.Path(policies.__file__).resolve().parent.parent


def test_every_required_name_is_registered() -> None:
    assert set(policies.names()) >= REQUIRED
    assert policies.names() == sorted(policies.names())


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(FairwayConfigError, match="unknown policy 'nope'.*fairway.*lpm"):
        policies.get("nope")


def test_duplicate_registration_raises() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_policy("fcfs")(type("Dup", (policies.Policy,), {}))


def test_get_returns_fresh_objects_named_by_registry_name() -> None:
    a, b = policies.get("klpm-4"), policies.get("klpm-4")
    assert a is not b
    assert a.name == "klpm-4" and policies.get("klpm").name == "klpm"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"request_id": "", "arrival": 0.0, "prompt_tokens": 1, "cached_tokens": 0},
        {"request_id": "r", "arrival": float("nan"), "prompt_tokens": 1, "cached_tokens": 0},
        {"request_id": "r", "arrival": 0.0, "prompt_tokens": -1, "cached_tokens": 0},
        {"request_id": "r", "arrival": 0.0, "prompt_tokens": 10, "cached_tokens": 11},
        {"request_id": "r", "arrival": 0.0, "prompt_tokens": 10, "cached_tokens": -1},
    ],
)
def test_queued_request_validation(kwargs) -> None:
    with pytest.raises(ValueError, match="QueuedRequest"):
        QueuedRequest(**kwargs)


def test_remaining_is_at_least_one() -> None:
    assert QueuedRequest("r", 0.0, 100, 100).remaining == 1
    assert QueuedRequest("r", 0.0, 100, 36).remaining == 64


queues = st.lists(
    st.tuples(st.floats(0, 50, allow_nan=False), st.integers(0, 16000), st.floats(0, 1)),
    max_size=40,
).map(
    lambda rows: [
        QueuedRequest(f"q{k}", a, n, int(n * f)) for k, (a, n, f) in enumerate(rows)
    ]
)


@settings(max_examples=60, deadline=None)
@given(queue=queues, now=st.floats(50, 100))
def test_every_policy_returns_a_permutation_over_several_steps(queue, now) -> None:
    for name in policies.names():
        policy = policies.get(name)
        for step in range(3):
            order = policy.order(queue, now + step)
            assert sorted(order) == list(range(len(queue))), name
            policy.on_step_end([queue[order[0]].request_id] if order else [], 2048)


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_one_request_gives_zero(name) -> None:
    assert policies.get(name).order([QueuedRequest("only", 0.0, 100, 0)], 1.0) == [0]


def test_fcfs_is_arrival_order() -> None:
    queue = [QueuedRequest(f"r{k}", a, 100, 90) for k, a in enumerate([3.0, 1.0, 2.0, 1.0])]
    assert policies.get("fcfs").order(queue, 5.0) == [1, 3, 2, 0]


def test_policies_do_not_import_vllm() -> None:
    """Only fairway/vllm may import vllm (the engine-agnostic layers must stay importable)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "vllm" in path.relative_to(PACKAGE).parts[:-1]:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods = [node.module]
            offenders += [f"{path.name}: {m}" for m in mods if m.split(".")[0] == "vllm"]
    assert offenders == []
