"""pytest plugin: vLLM's own scheduler tests with Fairway's scheduler classes substituted.

Loaded by `run_compat.py` with `-p fairway_compat`. Upstream's harnesses
(`tests/v1/core/utils.py:create_scheduler` and `tests/v1/kv_connector/unit/utils.py:
create_scheduler`) pick `AsyncScheduler if async_scheduling else Scheduler` from their module
globals; this plugin replaces those two globals with Fairway's classes, so every scheduler the
harness builds is a `FairwayScheduler` / `FairwayAsyncScheduler` running policy `FAIRWAY_POLICY`
(default `fcfs`, under which upstream's expected orders still hold).

Per test it records how many Fairway schedulers were built, so the summary separates "passed with
Fairway's class" from "passed without building a scheduler" (KV-cache-level tests, or tests that
pass their own `scheduler_cls`). The tests that cannot run here are listed by id in `SKIPS`, each
with its reason, and skipped before they run; nothing else is ever turned into a skip, so any
other failure (a priority queue reaching Fairway's class, a model that is not available offline)
is reported as a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from typing import Any

import pytest

#: Where the JSON results go (set by run_compat.py).
REPORT_ENV = "FAIRWAY_COMPAT_REPORT"


@dataclass(frozen=True)
class Skip:
    """Why an upstream test cannot run here, and (optionally) only when.

    Attributes:
        reason: the skip reason printed and recorded.
        missing_module: skip only while this module is not installed (None: always).
    """

    reason: str
    missing_module: str | None = None

    def applies(self) -> bool:
        """True when the test must be skipped on this machine."""
        return self.missing_module is None or importlib.util.find_spec(self.missing_module) is None


_LLAVA = Skip(
    "needs Hub model llava-hf/llava-1.5-7b-hf (not available offline; a stand-in config cannot "
    "help: vLLM's Llava module imports transformers' pixtral image processor, which needs "
    "torchvision, and the CPU set-up removes it)",
    missing_module="torchvision",
)
_PRIORITY = Skip("priority queue: Fairway refuses --scheduling-policy priority by design")

#: Upstream tests that cannot run here, by id: ``path::function`` (every parametrization) or a
#: full node id (one parametrization). Found by running the selection (README.md); a listed id
#: the selection no longer collects is reported in the summary.
SKIPS: dict[str, Skip] = {
    "tests/v1/core/test_deferred_block_free.py::"
    "test_allocation_retry_waits_for_fence_then_succeeds[priority-2]": _PRIORITY,
    **{f"tests/v1/core/test_scheduler.py::{name}": _LLAVA for name in (
        "test_eagle3_mm_encoder_cache_with_shift",
        "test_ec_connector_allocate_encoder_tokens_with_external_load",
        "test_ec_connector_cache_hit_external_load",
        "test_ec_connector_cache_miss_computes_locally",
        "test_ec_connector_defers_running_request_for_async_reload",
        "test_ec_connector_ensure_cache_available_defers_request",
        "test_ec_connector_schedule_multiple_requests",
        "test_ec_connector_text_only_request",
        "test_ec_connector_unable_to_allocate",
        "test_ec_connector_update_connector_output_called",
        "test_ec_connector_with_partial_cache_hit_multi_round",
        "test_encoder_cache_accepts_matching_embed_count",
        "test_encoder_cache_embed_count_mismatch_restores_prior_hit_state",
        "test_encoder_cache_recomputed_when_evicted_during_preemption",
        "test_encoder_cache_rejects_mismatched_embed_count",
        "test_encoder_cache_rejects_mismatched_embed_count_within_request",
        "test_encoder_cache_retained_across_preemption_and_resume",
        "test_encoder_only_prompt_longer_than_budget_is_chunked",
        "test_free_encoder_inputs_defers_for_eagle_lookahead",
        "test_free_encoder_inputs_notifies_the_ec_connector",
        "test_free_encoder_inputs_respects_unconfirmed_placeholders",
        "test_free_encoder_inputs_unchanged_without_spec_decode",
        "test_no_mm_input_chunking",
        "test_no_mm_input_chunking_for_same_step_duplicate",
        "test_priority_scheduling_ec_connector_preemption_and_resumption",
        "test_same_step_duplicate_encoder_input_stays_cached",
        "test_schedule_multimodal_requests",
        "test_schedule_partial_requests",
        "test_unavailable_encoder_input_fails_the_request_as_retryable",
    )},
}

_built = {"count": 0}
_results: list[dict[str, Any]] = []


def _fairway_classes() -> tuple[type, type]:
    """Fairway's two classes, counting the instances built."""
    from fairway.vllm.scheduler import FairwayAsyncScheduler, FairwayScheduler

    def init(base: type) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            base.__init__(self, *args, **kwargs)
            _built["count"] += 1

        return __init__

    sync = type("FairwayScheduler", (FairwayScheduler,), {"__init__": init(FairwayScheduler)})
    asyn = type(
        "FairwayAsyncScheduler", (FairwayAsyncScheduler,), {"__init__": init(FairwayAsyncScheduler)}
    )
    return sync, asyn


def pytest_configure(config: pytest.Config) -> None:
    """Substitute the classes in upstream's harness modules (imported here, before collection)."""
    os.environ.setdefault("FAIRWAY_POLICY", "fcfs")
    sync, asyn = _fairway_classes()
    patched = []
    for name in ("tests.v1.core.utils", "tests.v1.kv_connector.unit.utils"):
        try:
            module = __import__(name, fromlist=["create_scheduler"])
        except Exception as exc:  # noqa: BLE001 - reported, the other module may still work
            print(f"fairway_compat: cannot import {name}: {exc!r}")
            continue
        module.Scheduler, module.AsyncScheduler = sync, asyn
        patched.append(name)
    config.fairway_compat_patched = patched  # type: ignore[attr-defined]


def skip_for(nodeid: str) -> Skip | None:
    """The `SKIPS` entry of a test id (exact id first, then ``path::function``), if it applies."""
    entry = SKIPS.get(nodeid) or SKIPS.get(nodeid.split("[", 1)[0])
    return entry if entry is not None and entry.applies() else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the listed tests as skipped, with their reasons; remember the unmatched entries."""
    matched: set[str] = set()
    for item in items:
        entry = skip_for(item.nodeid)
        if entry is not None:
            item.add_marker(pytest.mark.skip(reason=entry.reason))
            matched.add(item.nodeid if item.nodeid in SKIPS else item.nodeid.split("[", 1)[0])
    files = {item.nodeid.split("::", 1)[0] for item in items}
    config.fairway_compat_unmatched = sorted(  # type: ignore[attr-defined]
        key for key, entry in SKIPS.items()
        if key not in matched and entry.applies() and key.split("::", 1)[0] in files
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Count the Fairway schedulers this test builds (during its call phase)."""
    _built["count"] = 0
    yield
    item.user_properties.append(("fairway_schedulers", _built["count"]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect one row per test: its outcome, the phase that decided it, and the reason."""
    if report.when == "call" or (report.when == "setup" and not report.passed):
        reason = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        elif report.failed:
            reason = report.longreprtext.strip().splitlines()[-1][:300] if report.longrepr else ""
        props = dict(report.user_properties)
        _results.append(
            {
                "test": report.nodeid,
                "outcome": report.outcome,
                "phase": report.when,
                "fairway_schedulers": props.get("fairway_schedulers", 0),
                "reason": reason,
            }
        )


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print the Fairway view of the run and write the JSON results."""
    summary = summarize(_results)
    patched = getattr(config, "fairway_compat_patched", [])
    lines = [
        f"Fairway compat (policy {os.environ.get('FAIRWAY_POLICY')}; patched: "
        f"{', '.join(patched) or 'nothing'})",
        *(f"  {key}: {value}" for key, value in summary["counts"].items()),
    ]
    for reason, count in summary["skip_reasons"].items():
        lines.append(f"  skipped x{count}: {reason}")
    for key in getattr(config, "fairway_compat_unmatched", []):
        lines.append(f"  listed in SKIPS but not collected (stale entry?): {key}")
    terminalreporter.write_line("\n".join(lines))
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "w") as f:
            json.dump({"summary": summary, "tests": _results}, f, indent=1)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts by outcome, with passes split by whether a Fairway scheduler was built."""
    counts = {
        "passed with a Fairway scheduler": 0,
        "passed without building a scheduler": 0,
        "failed": 0,
        "skipped": 0,
    }
    skip_reasons: dict[str, int] = {}
    for row in rows:
        if row["outcome"] == "passed":
            key = (
                "passed with a Fairway scheduler"
                if row["fairway_schedulers"]
                else ("passed without building a scheduler")
            )
            counts[key] += 1
        elif row["outcome"] == "skipped":
            counts["skipped"] += 1
            skip_reasons[row["reason"]] = skip_reasons.get(row["reason"], 0) + 1
        else:
            counts["failed"] += 1
    return {"counts": counts, "skip_reasons": dict(sorted(skip_reasons.items()))}
