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
Tests that fail by design with Fairway's class substituted (a vLLM feature Fairway refuses at
start-up, an assertion on vLLM's internal data structures rather than behaviour, a documented
difference of Fairway's fcfs) are listed by id in `EXPECTED_DIFFERENCES`, each with its reason
and the vLLM versions it applies to, and run as strict xfails: reported as expected differences;
one that passes is reported as stale and fails the run. Entries carry a version range (`since` /
`until`, the version from run_compat.py's `--vllm-version`), so one table serves every supported
version. Nothing else is ever turned into a skip or an xfail, so any other failure (a model that
is not available offline, a behaviour difference) is reported as a failure.
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
#: The vLLM version whose tests run (set by run_compat.py; else the imported vLLM's). Not a
#: FAIRWAY_ name: a Fairway scheduler refuses to start on FAIRWAY_ variables it does not know.
VERSION_ENV = "COMPAT_VLLM_VERSION"


def _release(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of '0.34.0' / '0.34.0+cpu'; () when it does not parse."""
    try:
        return tuple(int(part) for part in version.split("+")[0].split(".")[:3])
    except ValueError:
        return ()


def vllm_version() -> str:
    """The vLLM version under test: run_compat.py's `--vllm-version`, else the imported one."""
    version = os.environ.get(VERSION_ENV)
    if version:
        return version
    try:
        import vllm

        return str(vllm.__version__).split("+")[0]
    except Exception:  # noqa: BLE001 - no vLLM: every entry applies
        return ""


def _in_range(since: str | None, until: str | None) -> bool:
    """Whether the version under test is in [since, until) (None: unbounded)."""
    if since is None and until is None:
        return True
    got = _release(vllm_version())
    if not got:
        return True
    return (since is None or got >= _release(since)) and (until is None or got < _release(until))


@dataclass(frozen=True)
class Skip:
    """Why an upstream test cannot run here, and (optionally) only when.

    Attributes:
        reason: the skip reason printed and recorded.
        missing_module: skip only while this module is not installed (None: always).
        needs_cuda: skip only where no CUDA device is available.
        since: the first vLLM version whose tests have the entry (None: every version).
        until: the first vLLM version whose tests no longer have it (None: still there).
    """

    reason: str
    missing_module: str | None = None
    needs_cuda: bool = False
    since: str | None = None
    until: str | None = None

    def applies(self) -> bool:
        """True when the test must be skipped on this machine and this vLLM version."""
        if not _in_range(self.since, self.until):
            return False
        if self.needs_cuda:
            import torch

            return not torch.cuda.is_available()
        return self.missing_module is None or importlib.util.find_spec(self.missing_module) is None


@dataclass(frozen=True)
class Difference:
    """Why an upstream test fails by design with Fairway's class substituted, and on which vLLM
    versions (the test exists there; the entry is reported as stale where it passes).

    Attributes:
        reason: printed and recorded as the expected difference's reason.
        since: the first vLLM version whose tests have the difference (None: every version).
        until: the first vLLM version where it no longer applies (None: still there).
    """

    reason: str
    since: str | None = None
    until: str | None = None

    def applies(self) -> bool:
        """True when the version under test has this difference."""
        return _in_range(self.since, self.until)


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

_LLAVA_033 = Skip(_LLAVA.reason, _LLAVA.missing_module, since="0.33.0")
_LLAVA_034 = Skip(_LLAVA.reason, _LLAVA.missing_module, since="0.34.0")

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
    # removed upstream after 0.32
    "tests/v1/core/test_scheduler.py::test_free_encoder_inputs_defers_for_eagle_lookahead": Skip(
        _LLAVA.reason, _LLAVA.missing_module, until="0.33.0"
    ),
    # new in vLLM 0.33
    **{f"tests/v1/core/test_scheduler.py::{name}": _LLAVA_033 for name in (
        "test_cpu_encoder_input_updates_preserve_shm_handles",
        "test_cpu_encoder_input_updates_restore_after_kv_load_failure",
        "test_cpu_encoder_input_updates_resume_and_abort",
        "test_cpu_encoder_input_updates_wait_for_completed_prefill",
        "test_ec_connector_waits_for_embeddings_in_prefix_replay",
        "test_no_mm_input_chunking_at_item_boundary",
        "test_waiting_encoder_stall_does_not_starve_later_requests",
        "test_waiting_encoder_stall_is_counted_as_deferred",
        "test_waiting_encoder_stall_kv_holder_keeps_drain_priority",
    )},
    # new in vLLM 0.34
    **{f"tests/v1/core/test_scheduler.py::{name}": _LLAVA_034 for name in (
        "test_encoder_cache_pressure_respects_disabled_chunked_prefill",
        "test_no_mm_input_chunking_after_prefix_cache_hit_inside_item",
    )},
    "tests/v1/core/test_scheduler.py::"
    "test_async_scheduling_pp_allows_rescheduling_with_output_placeholders": Skip(
        "async scheduling with pipeline parallelism needs vLLM's Model Runner V2, which needs "
        "Triton on a GPU; on the CPU platform vLLM picks the V1 model runner and VllmConfig "
        "refuses the combination before any scheduler is built",
        needs_cuda=True,
        since="0.33.0",
    ),
}

#: Upstream tests that fail by design with Fairway's class substituted, by id as in `SKIPS`, each
#: with its reason (a `Difference`, or a plain reason for every version): tests of a vLLM feature
#: Fairway refuses at start-up, that assert vLLM's internal data structures (the type of
#: `scheduler.waiting`, heap internals) rather than behaviour, or that depend on a documented
#: difference of Fairway's fcfs (arrival time, not add order). A Fairway bug never goes here
#: (vLLM's own scheduler passes every listed test). They run as strict xfails and are counted as
#: "expected differences"; one that passes is reported as a stale expected difference and fails
#: the run (the entry must go). Found by running the selection (README.md).
_CACHE_AWARE = Difference(
    "vLLM 0.34's cache-aware admission (`cache_aware_admission_window`) reorders the waiting "
    "queue itself; a Fairway scheduler refuses it at start-up (FairwayConfigError naming "
    "cache_aware_admission_window): Fairway's policy owns the order",
    since="0.34.0",
)
EXPECTED_DIFFERENCES: dict[str, Difference | str] = {
    **{f"tests/v1/core/test_scheduler.py::{name}": _CACHE_AWARE for name in (
        "test_cache_aware_admission_prefers_cached_prefix",
        # [0] is the control (window 0: admission off), which Fairway accepts; below
        "test_cache_aware_admission_protects_resident_prefix_from_eviction[4]",
        "test_cache_aware_admission_keeps_blocked_and_started_requests_in_place",
        "test_cache_aware_admission_does_not_look_past_the_window",
        "test_cache_aware_admission_skipped_below_threshold",
        "test_cache_aware_admission_is_safe_on_a_mamba_spec",
        "test_cache_aware_admission_requires_fcfs_and_prefix_caching",
    )},
    "tests/v1/core/test_scheduler.py::"
    "test_cache_aware_admission_protects_resident_prefix_from_eviction[0]": Difference(
        "Fairway's fcfs orders by Request.arrival_time (fairway/policies/fcfs.py), vLLM's deque "
        "by add_request order; this control case builds `warm` before `cold` (arrival_time is "
        "stamped at construction) and adds them the other way round, so Fairway admits `warm` "
        "first where the test expects `cold` (vLLM's own scheduler passes it)",
        since="0.34.0",
    ),
}

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


def _difference_entry(nodeid: str) -> Difference | None:
    """The applicable `EXPECTED_DIFFERENCES` entry of a test id (exact id, then function)."""
    for key in (nodeid, nodeid.split("[", 1)[0]):
        entry = EXPECTED_DIFFERENCES.get(key)
        if isinstance(entry, str):
            entry = Difference(entry)
        if entry is not None and entry.applies():
            return entry
    return None


def difference_for(nodeid: str) -> str | None:
    """The `EXPECTED_DIFFERENCES` reason of a test id (exact id first, then ``path::function``),
    if it applies to the vLLM version under test."""
    entry = _difference_entry(nodeid)
    return entry.reason if entry is not None else None


def _applies(entry: Skip | Difference | str) -> bool:
    return isinstance(entry, str) or entry.applies()


def _key(nodeid: str, table: dict[str, Any]) -> str:
    if nodeid in table and _applies(table[nodeid]):
        return nodeid
    return nodeid.split("[", 1)[0]


def unmatched_entries(nodeids: list[str]) -> list[str]:
    """The applicable `SKIPS` / `EXPECTED_DIFFERENCES` keys that match none of `nodeids` though
    their file was collected (stale entries, or a renamed test)."""
    files = {nodeid.split("::", 1)[0] for nodeid in nodeids}
    matched = {_key(n, SKIPS) for n in nodeids} | {_key(n, EXPECTED_DIFFERENCES) for n in nodeids}
    listed = [key for key, entry in SKIPS.items() if entry.applies()] + [
        key for key, entry in EXPECTED_DIFFERENCES.items() if _applies(entry)
    ]
    return sorted(
        key for key in listed if key not in matched and key.split("::", 1)[0] in files
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the listed tests as skipped or expected to fail, with their reasons; remember the
    unmatched entries."""
    for item in items:
        entry = skip_for(item.nodeid)
        difference = difference_for(item.nodeid)
        if entry is not None:
            item.add_marker(pytest.mark.skip(reason=entry.reason))
        elif difference is not None:
            item.add_marker(pytest.mark.xfail(reason=difference, strict=True))
    config.fairway_compat_unmatched = unmatched_entries(  # type: ignore[attr-defined]
        [item.nodeid for item in items]
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Count the Fairway schedulers this test builds (during its call phase)."""
    _built["count"] = _built["priority"] = 0
    yield
    item.user_properties.append(("fairway_schedulers", _built["count"]))
    item.user_properties.append(("fairway_priority_schedulers", _built["priority"]))


def _failure_reason(report: Any) -> str:
    """The exception's message (first line, 300 characters), else the report's last line."""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = str(getattr(crash, "message", "") or "")
    lines = [line for line in message.splitlines() if line.strip()]
    if len(lines) > 1 and "validation error" in lines[0]:
        lines = [f"{lines[0]}: {lines[1].strip()}"]  # pydantic: the error is on the next line
    if lines:
        return lines[0][:300]
    text = str(report.longreprtext).strip() if report.longrepr else ""
    return text.splitlines()[-1][:300] if text else ""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect one row per test: its outcome, the phase that decided it, and the reason."""
    if report.when == "call" or (report.when == "setup" and not report.passed):
        reason = ""
        outcome = report.outcome
        if report.skipped and hasattr(report, "wasxfail"):
            # an expected difference that failed as listed
            outcome, reason = "xfailed", str(report.wasxfail)
        elif report.failed and str(report.longrepr).startswith("[XPASS(strict)]"):
            # an expected difference that passed (pytest fails a strict xfail that passes): its
            # entry is stale, reported as such (and the run fails)
            outcome, reason = "stale", str(report.longrepr).removeprefix("[XPASS(strict)] ")
        elif report.skipped and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        elif report.failed:
            reason = _failure_reason(report)
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
    for test in summary["stale_differences"]:
        lines.append(f"  STALE expected difference (it passed; remove its entry): {test}")
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
    """Counts by outcome, with passes split by whether a Fairway scheduler was built; an expected
    difference that passed is counted (and listed) as stale, not as a pass or a failure."""
    counts = {
        "passed with a Fairway scheduler": 0,
        "passed without building a scheduler": 0,
        "failed": 0,
        "skipped": 0,
        "expected differences (xfailed)": 0,
        "stale expected differences (passed)": 0,
    }
    priority = {"tests": 0, "passed": 0, "failed": 0, "expected differences": 0}
    skip_reasons: dict[str, int] = {}
    difference_reasons: dict[str, int] = {}
    stale: list[str] = []
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
        elif row["outcome"] == "stale":
            counts["stale expected differences (passed)"] += 1
            stale.append(row["test"])
        else:
            counts["failed"] += 1
    return {
        "counts": counts,
        "priority": priority,
        "skip_reasons": dict(sorted(skip_reasons.items())),
        "difference_reasons": dict(sorted(difference_reasons.items())),
        "stale_differences": sorted(stale),
    }
