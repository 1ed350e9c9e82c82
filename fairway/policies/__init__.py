"""Engine-agnostic orderings of the waiting queue. Must not import vllm.

Importing this package registers every policy; `get(name, **params)` builds one by name.
"""

from fairway.policies import fairway, fcfs, hrrn, lpm, peek, preble, ragcache  # noqa: F401
from fairway.policies.base import (
    Policy,
    QueuedRequest,
    arrival_order,
    get,
    make_policy,
    names,
    param_names,
    register_policy,
)

__all__ = [
    "Policy",
    "QueuedRequest",
    "arrival_order",
    "get",
    "make_policy",
    "names",
    "param_names",
    "register_policy",
]
