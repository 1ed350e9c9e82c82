"""Engine-agnostic orderings of the waiting queue. Must not import vllm.

Importing this package registers every policy; `get(name, **params)` builds one by name. The
contract is `Policy` (`base`); the queue and ordering types are in `queue`.
"""

from fairway.policies import (  # noqa: F401
    dlpm,
    fairway,
    fairway_step,
    fcfs,
    hrrn,
    lpm,
    peek,
    preble,
    ragcache,
    spf,
    suf,
    vllm_window,
    vtc,
    wspt,
)
from fairway.policies.base import (
    Policy,
    arrival_order,
    get,
    names,
    param_names,
    register_policy,
)
from fairway.policies.queue import (
    UNPLACED_LANE,
    Ordering,
    PrefillingRequest,
    QueueColumns,
    QueuedRequest,
    Step,
    StepBudget,
    StepPlan,
)

__all__ = [
    "UNPLACED_LANE",
    "Ordering",
    "Policy",
    "PrefillingRequest",
    "QueueColumns",
    "QueuedRequest",
    "Step",
    "StepBudget",
    "StepPlan",
    "arrival_order",
    "get",
    "names",
    "param_names",
    "register_policy",
]
