"""The six targets: per phase calm / burst / spike, median <= 1.1 x LPM's and p99 <= 1.1 x FCFS's.

A policy with errored requests in a phase fails that phase's targets (its percentiles, over the
requests that produced a first token, would flatter it otherwise); a missing reference or phase
gives "n/a", never "pass". The statistics come from `fairway.replay.summary`.
"""

from __future__ import annotations

from typing import Any

from fairway.replay.summary import Summary

#: Phases that carry targets, and the reference policy of each statistic.
TARGET_PHASES = ("calm", "burst", "spike")
MEDIAN_REFERENCE = "lpm"
P99_REFERENCE = "fcfs"
#: A target is met when the policy's value is <= TARGET_FACTOR x the reference's value.
TARGET_FACTOR = 1.1

PASS, FAIL, NA = "pass", "fail", "n/a"


def _target(
    summary: Summary, trace_name: str, policy: str, phase: str, statistic: str, reference: str
) -> dict[str, Any]:
    """One target: the policy's `statistic` in `phase` <= TARGET_FACTOR x the reference's.

    "n/a" (never "pass") when the reference or the phase is missing or has no TTFT; "fail" when the
    policy has errored requests in the phase, since their TTFT is unknown and at least the timeout.
    """
    attr = f"{statistic}_s"
    own = summary.row(trace_name, policy, phase)
    ref = summary.row(trace_name, reference, phase)
    value = getattr(own, attr) if own else None
    ref_value = getattr(ref, attr) if ref else None
    limit = TARGET_FACTOR * ref_value if ref_value is not None else None
    record = {
        "phase": phase, "statistic": statistic, "reference": reference, "value_s": value,
        "reference_s": ref_value, "limit_s": limit, "n_errors": own.n_errors if own else None,
    }
    if own is None or own.n == 0:
        return {**record, "status": NA, "reason": f"no {phase!r} requests for {policy!r}"}
    if ref is None or ref.n == 0:
        return {**record, "status": NA, "reason": f"no {phase!r} requests for {reference!r}"}
    if limit is None:
        return {**record, "status": NA, "reason": f"{reference!r} has no TTFT in {phase!r}"}
    if own.n_errors:
        return {**record, "status": FAIL, "reason": f"{own.n_errors} errored requests"}
    if value is None:
        return {**record, "status": NA, "reason": f"{policy!r} has no TTFT in {phase!r}"}
    status = PASS if value <= limit else FAIL
    return {**record, "status": status, "reason": f"{value:.6g} s vs limit {limit:.6g} s"}


def six_targets(summary: Summary, trace_name: str) -> dict[str, Any]:
    """The six targets of every policy on one trace.

    For each phase in `TARGET_PHASES`: median <= 1.1 x `lpm`'s median, p99 <= 1.1 x `fcfs`'s p99.

    Returns:
        {"trace_name", "factor", "references": {"median": "lpm", "p99": "fcfs"},
         "policies": {policy: {"met": int, "n_a": int, "total": 6,
                               "targets": {"calm.median": {... "status": "pass"|"fail"|"n/a"}}}}}

    Raises:
        ValueError: `trace_name` is not in the summary (the message lists the traces).
    """
    if trace_name not in summary.policies:
        raise ValueError(f"no trace {trace_name!r} in the summary; traces: {summary.traces}")
    checks = (("median", MEDIAN_REFERENCE), ("p99", P99_REFERENCE))
    per_policy: dict[str, Any] = {}
    for policy in summary.policies[trace_name]:
        targets = {
            f"{phase}.{stat}": _target(summary, trace_name, policy, phase, stat, ref)
            for phase in TARGET_PHASES
            for stat, ref in checks
        }
        statuses = [t["status"] for t in targets.values()]
        per_policy[policy] = {
            "met": statuses.count(PASS), "n_a": statuses.count(NA), "total": len(targets),
            "targets": targets,
        }
    return {
        "trace_name": trace_name,
        "factor": TARGET_FACTOR,
        "references": {"median": MEDIAN_REFERENCE, "p99": P99_REFERENCE},
        "policies": per_policy,
    }
