"""What the options are: the fields of `FairwayOptions`, with their types, defaults and docs.

The schema alone, so that what reads it (the checks and their messages, the environment's
names, the help) sits below the object and its constructors (`fairway.options.model`), which
extend `OptionFields`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

#: The ordering a server uses when none is given: `fairway`, the paper's work charges carried
#: across steps (docs/results.md has the measurements behind the choice).
DEFAULT_POLICY = "fairway"
#: The pydantic configuration of the options (of `OptionFields` and of `FairwayOptions`).
FIELDS_CONFIG = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

_PositiveInt = Annotated[int, Field(strict=True, ge=1)]


@pydantic_dataclass(frozen=True, config=FIELDS_CONFIG)
class OptionFields:
    """The fields of `FairwayOptions` (the policy, its parameters, the serving options)."""

    policy: str = DEFAULT_POLICY
    """The ordering of the waiting queue: a registered policy name (`fairway`, the default;
    `fairway-step`, the paper's per-step rule, and its ablations `fairway-abswait` and
    `fairway-nofair`; or a baseline such as `fcfs`, `lpm`, `peek`)."""
    policy_params: dict[str, Any] = field(default_factory=dict)
    """The policy's parameters (fields of its dataclass, e.g. `fast_weight` for `fairway`);
    given ones only, the policy's defaults apply to the rest."""
    protect: bool | None = None
    """Soft eviction protection: the cached blocks of the first `protect_top_k` waiting requests
    move to the most-recently-used end of vLLM's free list, so they are evicted last. null: on
    for `fairway` (the cache half of its rule) and `peek` (the baseline defines it), off for
    every other policy."""
    protect_top_k: _PositiveInt | None = None
    """How many of the first waiting requests are protected; null: vLLM's max_num_seqs."""
    reorder_preempted: bool = False
    """false keeps vLLM's rule that preempted requests go first, in their current order; true
    lets the policy place them like any other request."""
    self_calibrate: bool = False
    """Learn the prefill-time table T(L) from the engine's own step times and give it to the
    policy once the fit is good (off by default)."""
    step_log: Annotated[str, Field(min_length=1)] | None = None
    """Path of the step log (JSONL): for every engine step, its measured seconds and the
    (new tokens, tokens before) of each scheduled request; for checking a step-time model
    against the live engine (`benchmarks/fidelity.py --step-log`). null: off."""
    decision_trace: Annotated[str, Field(min_length=1)] | None = None
    """Path of the decision trace (JSONL, `fairway.vllm.decisions`): every
    `decision_trace_every` steps, the head of the order with each request's h, c, wait, score,
    lane, the ledgers and what vLLM admitted; null: off (no cost)."""
    decision_trace_every: _PositiveInt = 10
    """Write a decision-trace record every this many steps that have a waiting queue."""
    decision_trace_head: _PositiveInt = 16
    """Queue positions per decision-trace record (the head of Fairway's order)."""
    decision_trace_max_bytes: _PositiveInt = 64 * 1024 * 1024
    """Rotate the decision trace (PATH.1, PATH.2) once it is larger than this."""
    tenants: Any = None
    """The tenants this node shares its prefill between: a JSON object of tenant name -> weight
    (a number > 0; `{"team-a": 2, "team-b": 1}`) or a list of names (weight 1 each). A request
    names its tenant with `"vllm_xargs": {"tenant": NAME}`; requests without one, or naming an
    unlisted tenant, share the `default` tenant (list `default` to weigh it). Under contention
    `fairway` gives each backlogged tenant its weight's share of the prefill tokens; null: one
    tenant (the plain rule)."""
    tenant_source: Literal["client", "api-key", "header"] | None = None
    """Who may say which tenant a request belongs to (`fairway.trust`): `client`, the client
    itself in `vllm_xargs.tenant` (every client is trusted: any client can take any listed
    tenant's share); `api-key`, Fairway's middleware (`--middleware
    fairway.middleware.TenantMiddleware`) from the caller's API key and the map `tenant_keys`;
    `header`, the middleware from header `tenant_header`, which a gateway in front of the node
    must set on every request. Under `api-key` and `header` a tenant a client names itself is
    ignored (the default tenant), counted and logged once. null: `client` in-process (replays,
    offline schedulers: no clients); a server that lists `tenants` refuses to start until it is
    set."""
    tenant_keys: Annotated[str, Field(min_length=1)] | None = None
    """Under `tenant_source: api-key`: the JSON object of API key -> tenant name, or -> `{"tenant":
    NAME, "priority_floor": N}`; a file path, or `env:NAME` to read it from environment variable
    NAME. Read by the middleware in vLLM's API-server process."""
    tenant_header: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9-]+$")] = (
        "x-fairway-tenant"
    )
    """Under `tenant_source: header`: the header a gateway names the tenant in, `NAME` or `NAME;
    priority_floor=N`."""
    priority_floor: Annotated[int, Field(strict=True)] | None = None
    """The lowest (most urgent) vLLM priority a request may have under `--scheduling-policy
    priority`; a lower one is raised to it, counted and logged once. A key's or the gateway's
    `priority_floor` replaces it for that caller. null: 0 (vLLM's default priority) under
    `tenant_source` api-key or header, no floor under `client`."""
    tier: Literal["priced", "equal", "fixed", "blind"] = "priced"
    """How a prefix held in vLLM's CPU offload tier (`--kv-offloading-size`) counts in the order:
    `priced`, as a load (its tokens cost load time over compute time, from the profile's load
    figures or the estimate for its GPU class); `equal`, as a GPU hit (SGLang HiCache's rule);
    `fixed`, as `tier_weight` of a GPU hit (Dynamo's router: 0.75); `blind`, as a miss. Without a
    tier, no effect."""
    tier_weight: Annotated[float, Field(gt=0.0, le=1.0)] = 0.75
    """The share of a GPU hit one tier token counts as under `tier: fixed`."""
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    """Where each given value came from (JSON key, flag or variable), for logs and errors."""


#: The policy and the serving options (not policy parameters) with their defaults.
DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(OptionFields) if f.name != "sources"
    and f.default is not dataclasses.MISSING
}
#: The serving options: every option but the policy and its parameters.
SERVING_OPTIONS: tuple[str, ...] = tuple(k for k in DEFAULTS if k != "policy")
#: Every option key that is not a policy parameter.
OPTION_KEYS: tuple[str, ...] = ("policy", *SERVING_OPTIONS)
