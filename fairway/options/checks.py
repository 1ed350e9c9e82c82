"""The checks of `FairwayOptions.from_settings` and their messages.

Every message names the key, the value, its source and what is allowed. The policy is built
once per check (`check_params`); only when that fails and several parameters were given is it
built again with each alone, to name the one at fault.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any

import pydantic

import fairway.policies as policies
from fairway.errors import FairwayConfigError
from fairway.options.fields import OPTION_KEYS, OptionFields
from fairway.policies.base import Policy


def build_policy(policy: str, params: Mapping[str, Any]) -> Policy:
    """A fresh policy object; unknown names or parameters raise (`policies.get`)."""
    return policies.get(policy, **dict(params))


def param_owners() -> dict[str, list[str]]:
    """Parameter name -> the policies that take it."""
    owners: dict[str, list[str]] = {}
    for name in policies.names():
        for param in policies.param_names(name):
            owners.setdefault(param, []).append(name)
    return owners


def where(sources: Mapping[str, str], key: str) -> str:
    """Where the value of `key` came from, for messages."""
    return sources.get(key, "the default")


def check_policy(value: Any, sources: Mapping[str, str]) -> str:
    """`value` if it is a registered policy name; else an error listing the known ones."""
    known = policies.names()
    if not isinstance(value, str) or value not in known:
        raise FairwayConfigError(
            f"Fairway option policy={value!r} (from {where(sources, 'policy')}) is not a known "
            f"policy; known policies: {', '.join(known)}"
        )
    return value


def reject_unknown(
    values: Mapping[str, Any], sources: Mapping[str, str], policy: str, params: list[str]
) -> None:
    """An error for the first key that is neither an option nor a parameter of `policy`."""
    allowed = set(OPTION_KEYS) | set(params)
    for key in values:
        if key not in allowed:
            owners = param_owners().get(key)
            other = f" (a parameter of {', '.join(owners)})" if owners else ""
            raise FairwayConfigError(
                f"unknown Fairway option {key}={values[key]!r} (from {where(sources, key)})"
                f"{other}; options: {', '.join(OPTION_KEYS)}; parameters of policy {policy!r}: "
                f"{', '.join(params) or '(none)'}"
            )


def check_params(policy: str, params: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """Build the policy once; if that fails, name the cause: the first parameter that fails
    alone (with one parameter, that build; with several, a build with each alone), else all."""
    whole = _build_error(policy, params)
    if whole is None:
        return
    for key, value in params.items():
        alone = whole if len(params) == 1 else _build_error(policy, {key: value})
        if alone is not None:
            raise FairwayConfigError(
                f"Fairway option {key}={value!r} (from {where(sources, key)}): {alone}"
            ) from None
    given = ", ".join(f"{k}={v!r} (from {where(sources, k)})" for k, v in params.items())
    raise FairwayConfigError(f"Fairway policy parameters {given}: {whole}") from None


def _build_error(policy: str, params: Mapping[str, Any]) -> FairwayConfigError | None:
    """The error building the policy with `params` raises, or None."""
    try:
        build_policy(policy, params)
    except FairwayConfigError as exc:
        return exc
    return None


def validation_message(
    exc: pydantic.ValidationError, values: Mapping[str, Any], sources: Mapping[str, str]
) -> str:
    """The message of pydantic's error for a serving option (or `__post_init__`'s own)."""
    error = exc.errors()[0]
    if not error["loc"] and isinstance(error.get("ctx", {}).get("error"), FairwayConfigError):
        return str(error["ctx"]["error"])  # raised by __post_init__, already worded
    key = str(error["loc"][0]) if error["loc"] else "?"
    return (
        f"Fairway option {key}={values.get(key)!r} (from {where(sources, key)}) must be "
        f"{allowed_values(key)}"
    )


def allowed_values(key: str) -> str:
    """What a serving option accepts, in words, from its annotation (for messages and help)."""
    hint = typing.get_type_hints(OptionFields, include_extras=True)[key]
    args = typing.get_args(hint) if typing.get_origin(hint) in (types.UnionType, typing.Union) \
        else (hint,)
    words = []
    for arg in args:
        if arg is type(None):
            continue
        if typing.get_origin(arg) is typing.Literal:
            words.append("one of " + ", ".join(str(v) for v in typing.get_args(arg)))
            continue
        base, *meta = typing.get_args(arg) or (arg,)
        bounds = [b for m in meta for b in getattr(m, "metadata", [])]
        limits = [f"{op} {value}" for attr, op in (("gt", ">"), ("ge", ">="), ("le", "<="))
                  for b in bounds if (value := getattr(b, attr, None)) is not None]
        word = {bool: "true or false", int: "an integer", str: "a string", float: "a number"}.get(
            base, getattr(base, "__name__", str(base)))
        words.append(" ".join([word, " and ".join(limits)]) if limits else word)
    text = " or ".join(words)
    return text + ", or null (the default)" if type(None) in args else text


def check_trust(source: str | None, keys: str | None, sources: Mapping[str, str]) -> None:
    """`tenant_keys` goes with `tenant_source: api-key`, and only with it (`fairway.trust`)."""
    if source == "api-key" and keys is None:
        raise FairwayConfigError(
            f"Fairway option tenant_source='api-key' (from {where(sources, 'tenant_source')}) "
            "needs tenant_keys: a JSON file of API key -> tenant, or env:NAME for the JSON in "
            'environment variable NAME (e.g. {"sk-team-a": "team-a"})'
        )
    if keys is not None and source != "api-key":
        raise FairwayConfigError(
            f"Fairway option tenant_keys={keys!r} (from {where(sources, 'tenant_keys')}) is "
            f"read only under tenant_source api-key, and tenant_source is {source!r} (from "
            f"{where(sources, 'tenant_source')})"
        )
