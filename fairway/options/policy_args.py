"""`--policy-arg [POLICY.]KEY=VALUE`: one grammar for every command that takes policy parameters.

The parameter names come from the policy registry (`policies.param_names`); no policy is built
here: the values are checked where the options are built (`FairwayOptions.from_settings`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fairway.policies as policies
from fairway.errors import FairwayConfigError
from fairway.options.settings import Setting, parse_value


@dataclass(frozen=True)
class PolicyArg:
    """One `--policy-arg [POLICY.]KEY=VALUE`: for POLICY only, or for every chosen policy."""

    policy: str | None
    key: str
    value: Any
    text: str


def parse_key_value(item: str, flag: str) -> tuple[str, Any]:
    """`KEY=VALUE` -> (key, value), the value read by `parse_value`."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise FairwayConfigError(f"{flag} must be KEY=VALUE, got {item!r}")
    return key.strip(), parse_value(raw)


def parse_policy_args(items: Sequence[str]) -> list[PolicyArg]:
    """`--policy-arg` strings: `KEY=VALUE` or `POLICY.KEY=VALUE` (policy names have no dot)."""
    out = []
    for item in items:
        key, sep, raw = item.partition("=")
        name, dot, param = key.strip().rpartition(".")
        if not sep or not param or (dot and not name):
            raise FairwayConfigError(
                f"--policy-arg must be KEY=VALUE or POLICY.KEY=VALUE (e.g. fast_weight=2 or "
                f"fairway.fast_weight=2), got {item!r}"
            )
        out.append(PolicyArg(name or None, param, parse_value(raw.strip()), item))
    return out


def policy_arg_settings(
    args: Sequence[PolicyArg], selected: Sequence[str]
) -> dict[str, list[Setting]]:
    """Assign parsed `--policy-arg`s to the chosen policies -> {policy: [Setting, ...]}.

    `KEY=VALUE` applies to every chosen policy that has parameter KEY and is an error if none
    has it; `POLICY.KEY=VALUE` applies to POLICY only, which must be chosen and have KEY.
    """
    out: dict[str, list[Setting]] = {name: [] for name in selected}
    for arg in args:
        source = f"--policy-arg {arg.key}"
        if arg.policy is not None:
            if arg.policy not in selected:
                raise FairwayConfigError(
                    f"--policy-arg {arg.text!r}: policy {arg.policy!r} is not in this run "
                    f"(policies: {', '.join(selected)})"
                )
            targets = [arg.policy]
            if arg.key not in policies.param_names(arg.policy):
                raise FairwayConfigError(
                    f"--policy-arg {arg.text!r}: policy {arg.policy!r} has no parameter "
                    f"{arg.key!r}; its parameters: "
                    f"{', '.join(policies.param_names(arg.policy)) or '(none)'}"
                )
        else:
            targets = [p for p in selected if arg.key in policies.param_names(p)]
            if not targets:
                raise FairwayConfigError(
                    f"--policy-arg {arg.text!r}: "
                    + _no_param_message(arg.key, selected)
                )
        for name in targets:
            out[name].append(Setting(arg.key, arg.value, source))
    return out


def _no_param_message(key: str, selected: Sequence[str]) -> str:
    if len(selected) == 1:
        name = selected[0]
        return (
            f"policy {name!r} has no parameter {key!r}; its parameters: "
            f"{', '.join(policies.param_names(name)) or '(none)'}"
        )
    listing = "; ".join(
        f"{p}: {', '.join(policies.param_names(p)) or '(none)'}" for p in selected
    )
    return f"no policy of this run has a parameter {key!r} (parameters: {listing})"
