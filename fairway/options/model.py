"""The options object: `FairwayOptions`, its views and its constructors.

The fields (with their docs) are in `fairway.options.fields`; the checks and messages in
`checks`; the JSON and environment sources in `sources`. `from_settings` is the one constructor
at the edge; the others feed it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Any

import pydantic
from pydantic.dataclasses import dataclass as pydantic_dataclass

import fairway.policies as policies
from fairway.errors import FairwayConfigError
from fairway.options.checks import (
    build_policy,
    check_params,
    check_policy,
    check_trust,
    reject_unknown,
    validation_message,
)
from fairway.options.fields import DEFAULTS, FIELDS_CONFIG, SERVING_OPTIONS, OptionFields
from fairway.options.settings import Setting
from fairway.options.sources import ENV_PREFIX, SECTION, env_settings, json_settings
from fairway.policies.base import Policy
from fairway.tenants import TenantTable
from fairway.trust import TenantSource

#: The options of the trust model (`fairway.trust`), shown by `describe` when given.
TRUST_OPTIONS = ("tenant_source", "tenant_keys", "tenant_header", "priority_floor")

#: The policies whose `protect` default (null) is on: `peek` (the baseline defines it) and
#: `fairway`, whose rule has two halves, the order and the cache: a queued request's cached prefix
#: is evicted only after every free block no queued request needs (docs/design.md, "Cache reuse
#: under load"). On E2 it turns MuSiQue's sustained overload from 1.21 x the least prefill
#: tokens of any policy to 1.00 x (p99 0.56 x the best baseline's).
PROTECTED_BY_DEFAULT = ("peek", "fairway")

#: True while `from_settings` constructs an object whose policy and parameters it has just
#: checked by building the policy (`check_params`): `__post_init__` then does not build it again.
_POLICY_CHECKED: ContextVar[bool] = ContextVar("fairway_options_policy_checked", default=False)


@pydantic_dataclass(frozen=True, config=FIELDS_CONFIG)
class FairwayOptions(OptionFields):
    """Resolved options of one Fairway scheduler (one per engine or per replay)."""

    def __post_init__(self) -> None:
        if not _POLICY_CHECKED.get():
            build_policy(self.policy, self.policy_params)  # an object is valid, however built
        try:
            TenantTable.parse(self.tenants)
        except FairwayConfigError as exc:
            source = self.sources.get("tenants", "the default")
            raise FairwayConfigError(f"{exc} (set by {source})") from None
        check_trust(self.tenant_source, self.tenant_keys, self.sources)

    @property
    def tenant_table(self) -> TenantTable:
        """The configured tenants (`fairway.tenants`)."""
        return TenantTable.parse(self.tenants)

    @property
    def trust_source(self) -> TenantSource:
        """`tenant_source` resolved: null is `client` (in-process; a server checks it is set,
        `check_server`)."""
        return self.tenant_source or "client"

    def check_server(self) -> None:
        """The checks of a server's options beyond the object's own: listing tenants needs a
        `tenant_source` (a server does not trust its clients unless told to).

        Raises:
            FairwayConfigError: the option to set, and what each value means.
        """
        if self.tenant_table.enabled and self.tenant_source is None:
            raise FairwayConfigError(
                f"Fairway option tenants (from {self.sources.get('tenants', 'the default')}) "
                "lists tenants but tenant_source is not set: say who may name a request's "
                "tenant. api-key: Fairway's middleware maps API keys to tenants (also set "
                "tenant_keys); header: a gateway in front of the node sets header "
                f"{self.tenant_header}; client: any client names its own tenant in vllm_xargs "
                "and can take any listed tenant's share (what Fairway did before the option)"
            )

    @property
    def protect_enabled(self) -> bool:
        """Whether soft protection runs (the null default resolved per policy)."""
        return self.policy in PROTECTED_BY_DEFAULT if self.protect is None else self.protect

    def top_k(self, max_num_seqs: int) -> int:
        """Number of waiting requests whose cached blocks are protected."""
        return self.protect_top_k if self.protect_top_k is not None else max_num_seqs

    def build_policy(self) -> Policy:
        """A fresh policy object for one scheduler (policies may keep per-queue state)."""
        return build_policy(self.policy, self.policy_params)

    def describe(self) -> dict[str, Any]:
        """Plain dict for logs and result files (the tier rule only when not the default: it
        acts only with an offload tier, and result files without one stay as they were)."""
        tier = {} if (self.tier, self.tier_weight) == ("priced", 0.75) else {
            "tier": self.tier, "tier_weight": self.tier_weight,
        }
        trust = {  # only the given ones: result files without them stay as they were
            k: getattr(self, k) for k in TRUST_OPTIONS if k in self.sources
        }
        return {
            "policy": self.policy,
            **dict(self.policy_params),
            "protect": self.protect_enabled,
            "protect_top_k": self.protect_top_k,
            "reorder_preempted": self.reorder_preempted,
            "self_calibrate": self.self_calibrate,
            "decision_trace": self.decision_trace,
            "step_log": self.step_log,
            "tenants": self.tenants,
            **trust,
            **tier,
        }

    def to_json(self, *, skip_env: bool = False) -> dict[str, Any]:
        """The given values as a `"fairway"` section of `--additional-config` (JSON-safe).

        Args:
            skip_env: leave out values that came from `FAIRWAY_*` (the server reads them itself).
        """
        given = {"policy": self.policy, **dict(self.policy_params)}
        given |= {k: getattr(self, k) for k in SERVING_OPTIONS if k in self.sources}
        out = {
            k: v for k, v in given.items()
            if k in self.sources and not (skip_env and self.sources[k].startswith(ENV_PREFIX))
        }
        for key, value in out.items():
            if key == "tenants":  # a JSON object or list, checked by TenantTable
                continue
            if not isinstance(value, str | int | float | bool | type(None)):
                raise FairwayConfigError(
                    f"Fairway option {key}={value!r} cannot be sent to a server (give a path or "
                    "a name)"
                )
        return out

    @classmethod
    def from_settings(cls, settings: Iterable[Setting]) -> FairwayOptions:
        """The one constructor at the edge: later settings win; everything is checked here.

        The policy is built once (by `check_params`, which names a bad parameter).

        Raises:
            FairwayConfigError: unknown key, bad value or unknown policy; the message names the
                key, the value, its source and what is allowed.
        """
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for s in settings:
            values[s.key] = s.value
            sources[s.key] = s.source
        policy = check_policy(values.get("policy", DEFAULTS["policy"]), sources)
        params = policies.param_names(policy)
        reject_unknown(values, sources, policy, params)
        given_params = {k: values[k] for k in params if k in values}
        check_params(policy, given_params, sources)
        serving = {k: values[k] for k in SERVING_OPTIONS if k in values}
        checked = _POLICY_CHECKED.set(True)
        try:
            return cls(policy=policy, policy_params=given_params, sources=sources, **serving)
        except pydantic.ValidationError as exc:
            raise FairwayConfigError(validation_message(exc, values, sources)) from None
        finally:
            _POLICY_CHECKED.reset(checked)

    @classmethod
    def from_vllm_config(
        cls, vllm_config: Any, environ: Mapping[str, str] | None = None
    ) -> FairwayOptions:
        """A server's options: `additional_config["fairway"]`, then `FAIRWAY_*` (os.environ);
        checked as a server's (`check_server`)."""
        additional = getattr(vllm_config, "additional_config", None) or {}
        section = additional.get(SECTION) if isinstance(additional, Mapping) else None
        options = cls.resolve(section, os.environ if environ is None else environ)
        options.check_server()
        return options

    @classmethod
    def resolve(cls, json_options: Any, environ: Mapping[str, str] | None = None) -> FairwayOptions:
        """Defaults < `json_options` (the `"fairway"` section) < `environ` (FAIRWAY_*)."""
        return cls.from_settings([*json_settings(json_options), *env_settings(environ or {})])

    @classmethod
    def for_replay(
        cls,
        policy: str | FairwayOptions,
        policy_params: Mapping[str, Any] | None = None,
        serving: Mapping[str, Any] | None = None,
        source: str = "the replay",
    ) -> FairwayOptions:
        """Options of an in-process scheduler (replay, sweeps, tests): arguments only, no env.

        `policy` may already be an object; `policy_params` and `serving` are then added to it.
        """
        base = policy.settings() if isinstance(policy, FairwayOptions) else [
            Setting("policy", policy, f"{source} policy")
        ]
        extra = {**(policy_params or {}), **(serving or {})}
        if not extra and isinstance(policy, FairwayOptions):
            return policy
        return cls.from_settings([
            *base, *(Setting(k, v, f"{source} {k}") for k, v in extra.items())
        ])

    def settings(self) -> list[Setting]:
        """The given values as settings (to extend the object with more)."""
        values = {"policy": self.policy, **dict(self.policy_params)}
        values |= {k: getattr(self, k) for k in SERVING_OPTIONS}
        return [Setting(k, v, self.sources[k]) for k, v in values.items() if k in self.sources]
