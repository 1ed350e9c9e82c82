"""Engine-agnostic orderings of the waiting queue. Must not import vllm.

Importing this package registers every policy; `get(name, **params)` builds one by name.
"""

from fairway.policies import (  # noqa: F401
    fairway,
    fairway_step,
    fcfs,
    hrrn,
    lpm,
    peek,
    preble,
    ragcache,
)
from fairway.policies.base import (
    Policy,
    PrefillingRequest,
    QueuedRequest,
    StepBudget,
    StepShare,
    arrival_order,
    get,
    make_policy,
    names,
    param_names,
    register_policy,
)

__all__ = [
    "Policy",
    "PrefillingRequest",
    "QueuedRequest",
    "StepBudget",
    "StepShare",
    "arrival_order",
    "get",
    "make_policy",
    "names",
    "param_names",
    "register_policy",
]
