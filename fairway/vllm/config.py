"""Fairway's serving options: `--additional-config '{"fairway": {...}}'` and `FAIRWAY_<KEY>`.

Precedence: defaults < JSON (`vllm_config.additional_config["fairway"]`) < environment. The
environment is read here only, when a scheduler is constructed, never at import time. Keys are
the serving options below plus the chosen policy's parameters (the fields of its dataclass, e.g.
`fast_weight` for `fairway`); anything else is an error at start-up that names the key, the value,
where it came from and what is allowed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import fairway.policies as policies
from fairway.errors import FairwayConfigError
from fairway.policies.base import Policy

#: The key of Fairway's section in vLLM's `--additional-config`.
SECTION = "fairway"
#: Prefix of the environment overrides: FAIRWAY_POLICY, FAIRWAY_FAST_WEIGHT, ...
ENV_PREFIX = "FAIRWAY_"
#: Serving options (not policy parameters), with their defaults.
OPTION_DEFAULTS: dict[str, Any] = {
    "policy": "fairway",
    "protect": None,
    "protect_top_k": None,
    "reorder_preempted": False,
    "self_calibrate": False,
    # The decision trace (fairway.vllm.decisions); off unless a path is given.
    "decision_trace": None,
    "decision_trace_every": 10,
    "decision_trace_head": 16,
    "decision_trace_max_bytes": 64 * 1024 * 1024,
}
_JSON_SOURCE = "--additional-config"


@dataclass(frozen=True)
class FairwayOptions:
    """Resolved options of one Fairway scheduler.

    Attributes:
        policy: registry name of the ordering (`fairway`, `fcfs`, `lpm`, ...).
        policy_params: parameters passed to the policy (validated by the policy itself).
        protect: soft eviction protection of the top waiting requests' cached blocks;
            None: on for `peek` (the baseline defines it), off for every other policy.
        protect_top_k: how many of the first waiting requests to protect; None: max_num_seqs.
        reorder_preempted: False (default) keeps vLLM's rule that preempted requests go first,
            in their current order; True lets the policy place them like any other request.
        self_calibrate: learn the prefill-time table T(L) from the engine's own step times
            (`fairway.vllm.calibrate`) and hand it to the policy; off by default.
        decision_trace: path of the decision trace (JSONL, `fairway.vllm.decisions`); None: off.
        decision_trace_every: write a record every this many steps with a waiting queue.
        decision_trace_head: queue positions per record (the head of Fairway's order).
        decision_trace_max_bytes: rotate the file (PATH.1, PATH.2) past this size.
        sources: where each non-default value came from (JSON or env var name), for logs.
    """

    policy: str = "fairway"
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    protect: bool | None = None
    protect_top_k: int | None = None
    reorder_preempted: bool = False
    self_calibrate: bool = False
    decision_trace: str | None = None
    decision_trace_every: int = 10
    decision_trace_head: int = 16
    decision_trace_max_bytes: int = 64 * 1024 * 1024
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def protect_enabled(self) -> bool:
        """Whether soft protection runs (the None default resolved per policy)."""
        return self.policy == "peek" if self.protect is None else self.protect

    def top_k(self, max_num_seqs: int) -> int:
        """Number of waiting requests whose cached blocks are protected."""
        return self.protect_top_k if self.protect_top_k is not None else max_num_seqs

    def build_policy(self) -> Policy:
        """A fresh policy object for one scheduler (policies may keep per-queue state)."""
        return policies.get(self.policy, **self.policy_params)

    def describe(self) -> dict[str, Any]:
        """Plain dict for logs and result files."""
        return {
            "policy": self.policy,
            **dict(self.policy_params),
            "protect": self.protect_enabled,
            "protect_top_k": self.protect_top_k,
            "reorder_preempted": self.reorder_preempted,
            "self_calibrate": self.self_calibrate,
            "decision_trace": self.decision_trace,
        }

    @classmethod
    def from_vllm_config(
        cls, vllm_config: Any, environ: Mapping[str, str] | None = None
    ) -> FairwayOptions:
        """Options from `vllm_config.additional_config["fairway"]` and the environment."""
        additional = getattr(vllm_config, "additional_config", None) or {}
        section = additional.get(SECTION) if isinstance(additional, Mapping) else None
        return cls.resolve(section, os.environ if environ is None else environ)

    @classmethod
    def resolve(cls, json_options: Any, environ: Mapping[str, str] | None = None) -> FairwayOptions:
        """Merge defaults < `json_options` < `environ` and validate.

        Raises:
            FairwayConfigError: unknown key, bad value or unknown policy; the message names the
                key, the value, its source and what is allowed.
        """
        environ = {} if environ is None else environ
        if json_options is None:
            json_options = {}
        if not isinstance(json_options, Mapping):
            raise FairwayConfigError(
                f"{_JSON_SOURCE} {SECTION!r} must be a JSON object, got {json_options!r}; "
                f'e.g. --additional-config \'{{"fairway": {{"policy": "fairway"}}}}\''
            )
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for key, value in json_options.items():
            values[str(key)] = value
            sources[str(key)] = f"{_JSON_SOURCE} {SECTION}.{key}"
        _read_env(environ, ("policy",), values, sources)
        policy = _check_policy(values.get("policy", OPTION_DEFAULTS["policy"]), sources)
        params = policies.param_names(policy)
        _read_env(environ, (*OPTION_DEFAULTS, *params), values, sources)
        _reject_unknown(values, sources, policy, params)
        options = cls(
            policy=policy,
            policy_params={k: values[k] for k in params if k in values},
            protect=_optional_bool(values, sources, "protect"),
            protect_top_k=_optional_positive_int(values, sources, "protect_top_k"),
            reorder_preempted=bool(_optional_bool(values, sources, "reorder_preempted")),
            self_calibrate=bool(_optional_bool(values, sources, "self_calibrate")),
            decision_trace=_optional_path(values, sources, "decision_trace"),
            decision_trace_every=_positive_int(values, sources, "decision_trace_every"),
            decision_trace_head=_positive_int(values, sources, "decision_trace_head"),
            decision_trace_max_bytes=_positive_int(values, sources, "decision_trace_max_bytes"),
            sources=sources,
        )
        _check_params(options)
        return options


def env_name(key: str) -> str:
    """The environment variable that overrides option `key`."""
    return ENV_PREFIX + key.upper()


def _read_env(
    environ: Mapping[str, str],
    keys: tuple[str, ...],
    values: dict[str, Any],
    sources: dict[str, str],
) -> None:
    for key in keys:
        name = env_name(key)
        raw = environ.get(name)
        if raw is None:
            continue
        values[key] = _parse_env(raw)
        sources[key] = name


def _parse_env(raw: str) -> Any:
    """JSON scalars (4, 0.5, true, null); anything else is taken as a string (names, paths)."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _where(sources: Mapping[str, str], key: str) -> str:
    return sources.get(key, "the default")


def _check_policy(value: Any, sources: Mapping[str, str]) -> str:
    known = policies.names()
    if not isinstance(value, str) or value not in known:
        raise FairwayConfigError(
            f"Fairway option policy={value!r} (from {_where(sources, 'policy')}) is not a known "
            f"policy; known policies: {', '.join(known)}"
        )
    return value


def _reject_unknown(
    values: Mapping[str, Any], sources: Mapping[str, str], policy: str, params: list[str]
) -> None:
    allowed = set(OPTION_DEFAULTS) | set(params)
    for key in values:
        if key not in allowed:
            raise FairwayConfigError(
                f"unknown Fairway option {key}={values[key]!r} (from {_where(sources, key)}); "
                f"options: {', '.join(OPTION_DEFAULTS)}; parameters of policy {policy!r}: "
                f"{', '.join(params) or '(none)'}"
            )


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _optional_bool(values: Mapping[str, Any], sources: Mapping[str, str], key: str) -> bool | None:
    value = values.get(key, OPTION_DEFAULTS[key])
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    raise FairwayConfigError(
        f"Fairway option {key}={value!r} (from {_where(sources, key)}) must be true or false"
        + (" or null (the per-policy default)" if OPTION_DEFAULTS[key] is None else "")
    )


def _optional_positive_int(
    values: Mapping[str, Any], sources: Mapping[str, str], key: str
) -> int | None:
    value = values.get(key, OPTION_DEFAULTS[key])
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise FairwayConfigError(
        f"Fairway option {key}={value!r} (from {_where(sources, key)}) must be an integer >= 1 "
        "or null (default: max_num_seqs)"
    )


def _positive_int(values: Mapping[str, Any], sources: Mapping[str, str], key: str) -> int:
    value = values.get(key, OPTION_DEFAULTS[key])
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise FairwayConfigError(
        f"Fairway option {key}={value!r} (from {_where(sources, key)}) must be an integer >= 1 "
        f"(default {OPTION_DEFAULTS[key]})"
    )


def _optional_path(values: Mapping[str, Any], sources: Mapping[str, str], key: str) -> str | None:
    value = values.get(key, OPTION_DEFAULTS[key])
    if value is None or (isinstance(value, str) and value):
        return value
    raise FairwayConfigError(
        f"Fairway option {key}={value!r} (from {_where(sources, key)}) must be a file path "
        "or null (off)"
    )


def _check_params(options: FairwayOptions) -> None:
    """Build the policy once per parameter so an error names the parameter that caused it."""
    for key, value in options.policy_params.items():
        try:
            policies.get(options.policy, **{key: value})
        except FairwayConfigError as exc:
            raise FairwayConfigError(
                f"Fairway option {key}={value!r} (from {_where(options.sources, key)}): {exc}"
            ) from None
    try:
        options.build_policy()
    except FairwayConfigError as exc:
        given = ", ".join(
            f"{k}={v!r} (from {_where(options.sources, k)})"
            for k, v in options.policy_params.items()
        )
        raise FairwayConfigError(f"Fairway policy parameters {given}: {exc}") from None
