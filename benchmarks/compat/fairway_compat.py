"""pytest plugin: vLLM's own scheduler tests with Fairway's scheduler classes substituted.

Loaded by `run_compat.py` with `-p fairway_compat`. Upstream's harnesses
(`tests/v1/core/utils.py:create_scheduler` and `tests/v1/kv_connector/unit/utils.py:
create_scheduler`) pick `AsyncScheduler if async_scheduling else Scheduler` from their module
globals; this plugin replaces those two globals with Fairway's classes, so every scheduler the
harness builds is a `FairwayScheduler` / `FairwayAsyncScheduler` running policy `FAIRWAY_POLICY`
(default `fcfs`, under which upstream's expected orders still hold).

Upstream's priority-scheduling tests build vLLM's `Scheduler` directly, with `policy="priority"`,
in builders of their own (`PRIORITY_BUILDERS`: `create_scheduler_with_priority` of
`tests/v1/core/test_scheduler.py`, which `test_worker_slot_overflow.py` and
`test_priority_scheduler_random.py` import, and `build_scheduler` of
`test_priority_preemption_bug.py`). The plugin wraps each builder so that, while it runs, its
module's `Scheduler` global is Fairway's class (the rest of the module keeps vLLM's). Under
`--scheduling-policy priority` Fairway swaps vLLM's empty waiting heap for the FCFS deque and
orders it with the priority levels strictly first, each level in the policy's order.

Per test it records how many Fairway schedulers were built (and how many of them under priority
scheduling), so the summary separates "passed with Fairway's class" from "passed without building
a scheduler" (KV-cache-level tests, or tests that pass their own `scheduler_cls`). The tests that
cannot run here are listed by id in `SKIPS`, each with its reason, and skipped before they run.
Tests that run but assert vLLM's internal data structures rather than behaviour are listed by id
in `EXPECTED_DIFFERENCES`, each with its reason, and run as strict xfails (one that passes fails
the run, so a stale entry is noticed). Nothing else is ever turned into a skip or an xfail, so any
other failure (a model that is not available offline, a behaviour difference) is reported as a
failure.
"""

from __future__ import annotations

import functools
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
_QWEN_VL = Skip(
    "needs Hub model Qwen/Qwen2.5-VL-3B-Instruct (not available offline; a stand-in config "
    "cannot help: building its scheduler builds the multimodal processor, and transformers' "
    "Qwen2-VL video processor imports torchvision, which the CPU set-up removes)",
    missing_module="torchvision",
)

#: Upstream tests that cannot run here, by id: ``path::function`` (every parametrization) or a
#: full node id (one parametrization). Found by running the selection (README.md); a listed id
#: the selection no longer collects is reported in the summary.
SKIPS: dict[str, Skip] = {
    "tests/v1/core/test_priority_scheduler_random.py::test_priority_scheduling_blast": _QWEN_VL,
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

#: Upstream tests that run with Fairway's class but assert vLLM's internal data structures (the
#: type of `scheduler.waiting`, heap internals) rather than behaviour, by id as in `SKIPS`, each
#: with the reason. They run as strict xfails: the failure is expected, a pass fails the run (the
#: entry is then stale and must go). Found by running the selection (README.md); empty when every
#: test that runs passes.
EXPECTED_DIFFERENCES: dict[str, str] = {}

#: Upstream modules whose scheduler builders read `Scheduler` / `AsyncScheduler` from their own
#: globals: both are Fairway's classes for the whole run. The offloading connector's harness
#: builds a scheduler with vLLM's `OffloadingConnector` (and its CPU tier), so its tests run
#: Fairway's tier probe over vLLM's own offloading scenarios.
HARNESS_MODULES = (
    "tests.v1.core.utils",
    "tests.v1.kv_connector.unit.utils",
    "tests.v1.kv_connector.unit.offloading_connector.utils",
)

#: Upstream builders that construct vLLM's `Scheduler` directly (not through the harnesses), all
#: with `policy="priority"`: module -> function. While one runs, its module's `Scheduler` global
#: is Fairway's class; the module's other uses of `Scheduler` (type hints, `object.__new__`, the
#: encoder-decoder and hybrid builders) keep vLLM's. Tests importing a builder from its module
#: (`from .test_scheduler import create_scheduler_with_priority`) get the wrapped one, because
#: the modules are imported (and wrapped) at configure time, before collection.
PRIORITY_BUILDERS: dict[str, str] = {
    "tests.v1.core.test_scheduler": "create_scheduler_with_priority",
    "tests.v1.core.test_priority_preemption_bug": "build_scheduler",
}

_built = {"count": 0, "priority": 0}
_results: list[dict[str, Any]] = []


def _fairway_classes() -> tuple[type, type]:
    """Fairway's two classes, counting the instances built, and the ones started under
    `--scheduling-policy priority` (counted before start-up, so a refused start-up counts)."""
    from fairway.vllm.scheduler import FairwayAsyncScheduler, FairwayScheduler

    def init(base: type) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            vllm_config = kwargs.get("vllm_config", args[0] if args else None)
            scheduler_config = getattr(vllm_config, "scheduler_config", None)
            if str(getattr(scheduler_config, "policy", "")) == "priority":
                _built["priority"] += 1
            base.__init__(self, *args, **kwargs)
            _built["count"] += 1

        return __init__

    sync = type("FairwayScheduler", (FairwayScheduler,), {"__init__": init(FairwayScheduler)})
    asyn = type(
        "FairwayAsyncScheduler", (FairwayAsyncScheduler,), {"__init__": init(FairwayAsyncScheduler)}
    )
    return sync, asyn


def _with_scheduler(module: Any, builder: Any, cls: type) -> Any:
    """`builder` with `module.Scheduler` set to `cls` while it runs (restored after)."""

    @functools.wraps(builder)
    def build(*args: Any, **kwargs: Any) -> Any:
        saved = module.Scheduler
        module.Scheduler = cls
        try:
            return builder(*args, **kwargs)
        finally:
            module.Scheduler = saved

    build.fairway_compat_wrapped = True  # type: ignore[attr-defined]
    return build


def pytest_configure(config: pytest.Config) -> None:
    """Substitute the classes in upstream's harness modules and wrap the priority builders (all
    imported here, before collection)."""
    os.environ.setdefault("FAIRWAY_POLICY", "fcfs")
    sync, asyn = _fairway_classes()
    patched = []
    for name in HARNESS_MODULES:
        try:
            module = __import__(name, fromlist=["create_scheduler"])
        except Exception as exc:  # noqa: BLE001 - reported, the other module may still work
            print(f"fairway_compat: cannot import {name}: {exc!r}")
            continue
        module.Scheduler, module.AsyncScheduler = sync, asyn
        patched.append(name)
    for name, function in PRIORITY_BUILDERS.items():
        try:
            module = __import__(name, fromlist=[function])
            builder = getattr(module, function)
        except Exception as exc:  # noqa: BLE001 - reported, the harnesses may still work
            print(f"fairway_compat: cannot import {name}.{function}: {exc!r}")
            continue
        if not getattr(builder, "fairway_compat_wrapped", False):
            setattr(module, function, _with_scheduler(module, builder, sync))
        patched.append(f"{name}.{function}")
    config.fairway_compat_patched = patched  # type: ignore[attr-defined]


def skip_for(nodeid: str) -> Skip | None:
    """The `SKIPS` entry of a test id (exact id first, then ``path::function``), if it applies."""
    entry = SKIPS.get(nodeid) or SKIPS.get(nodeid.split("[", 1)[0])
    return entry if entry is not None and entry.applies() else None


def difference_for(nodeid: str) -> str | None:
    """The `EXPECTED_DIFFERENCES` reason of a test id (exact id first, then ``path::function``)."""
    return EXPECTED_DIFFERENCES.get(nodeid) or EXPECTED_DIFFERENCES.get(nodeid.split("[", 1)[0])


def _key(nodeid: str, table: dict[str, Any]) -> str:
    return nodeid if nodeid in table else nodeid.split("[", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the listed tests as skipped or expected to fail, with their reasons; remember the
    unmatched entries."""
    matched: set[str] = set()
    for item in items:
        entry = skip_for(item.nodeid)
        difference = difference_for(item.nodeid)
        if entry is not None:
            item.add_marker(pytest.mark.skip(reason=entry.reason))
            matched.add(_key(item.nodeid, SKIPS))
        elif difference is not None:
            item.add_marker(pytest.mark.xfail(reason=difference, strict=True))
            matched.add(_key(item.nodeid, EXPECTED_DIFFERENCES))
    files = {item.nodeid.split("::", 1)[0] for item in items}
    listed = [key for key, entry in SKIPS.items() if entry.applies()] + list(EXPECTED_DIFFERENCES)
    config.fairway_compat_unmatched = sorted(  # type: ignore[attr-defined]
        key for key in listed if key not in matched and key.split("::", 1)[0] in files
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Count the Fairway schedulers this test builds (during its call phase)."""
    _built["count"] = _built["priority"] = 0
    yield
    item.user_properties.append(("fairway_schedulers", _built["count"]))
    item.user_properties.append(("fairway_priority_schedulers", _built["priority"]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect one row per test: its outcome, the phase that decided it, and the reason."""
    if report.when == "call" or (report.when == "setup" and not report.passed):
        reason = ""
        outcome = report.outcome
        if report.skipped and hasattr(report, "wasxfail"):
            # an expected difference that failed as listed (one that passes is a strict xfail's
            # failure, "[XPASS(strict)] reason": its entry is stale)
            outcome, reason = "xfailed", str(report.wasxfail)
        elif report.skipped and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        elif report.failed:
            reason = report.longreprtext.strip().splitlines()[-1][:300] if report.longrepr else ""
        props = dict(report.user_properties)
        _results.append(
            {
                "test": report.nodeid,
                "outcome": outcome,
                "phase": report.when,
                "fairway_schedulers": props.get("fairway_schedulers", 0),
                "fairway_priority_schedulers": props.get("fairway_priority_schedulers", 0),
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
    for reason, count in summary["difference_reasons"].items():
        lines.append(f"  expected difference x{count}: {reason}")
    lines.append(
        "  tests starting a Fairway scheduler with --scheduling-policy priority: "
        + ", ".join(f"{key} {value}" for key, value in summary["priority"].items())
    )
    for key in getattr(config, "fairway_compat_unmatched", []):
        lines.append(f"  listed but not collected (stale entry?): {key}")
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
        "expected differences (xfailed)": 0,
    }
    priority = {"tests": 0, "passed": 0, "failed": 0, "expected differences": 0}
    skip_reasons: dict[str, int] = {}
    difference_reasons: dict[str, int] = {}
    for row in rows:
        if row.get("fairway_priority_schedulers"):
            priority["tests"] += 1
            key = {"passed": "passed", "xfailed": "expected differences"}.get(
                row["outcome"], "failed"
            )
            priority[key] += 1
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
        elif row["outcome"] == "xfailed":
            counts["expected differences (xfailed)"] += 1
            difference_reasons[row["reason"]] = difference_reasons.get(row["reason"], 0) + 1
        else:
            counts["failed"] += 1
    return {
        "counts": counts,
        "priority": priority,
        "skip_reasons": dict(sorted(skip_reasons.items())),
        "difference_reasons": dict(sorted(difference_reasons.items())),
    }
