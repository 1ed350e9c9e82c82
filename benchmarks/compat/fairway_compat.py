"""pytest plugin: vLLM's own scheduler tests with Fairway's scheduler classes substituted.

Loaded by `run_compat.py` with `-p fairway_compat`. Upstream's harnesses
(`tests/v1/core/utils.py:create_scheduler` and `tests/v1/kv_connector/unit/utils.py:
create_scheduler`) pick `AsyncScheduler if async_scheduling else Scheduler` from their module
globals; this plugin replaces those two globals with Fairway's classes, so every scheduler the
harness builds is a `FairwayScheduler` / `FairwayAsyncScheduler` running policy `FAIRWAY_POLICY`
(default `fcfs`, under which upstream's expected orders still hold).

Per test it records how many Fairway schedulers were built, so the summary separates "passed with
Fairway's class" from "passed without building a scheduler" (KV-cache-level tests, or tests that
pass their own `scheduler_cls`). Two kinds of test cannot run and are skipped with the reason:
a priority queue (Fairway refuses `--scheduling-policy priority` by design) and a model config
that is neither on this machine nor reachable (offline Hub).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest

#: Where the JSON results go (set by run_compat.py).
REPORT_ENV = "FAIRWAY_COMPAT_REPORT"
#: Substrings of errors that mean "this model's files are not available offline".
_OFFLINE_MARKERS = (
    "offline mode is enabled",
    "LocalEntryNotFoundError",
    "outgoing traffic has been disabled",
    "Cannot find the requested files in the local cache",
    "We couldn't connect to 'https://huggingface.co'",
    "is not a local folder and is not a valid model identifier",
    "Invalid repository ID or local directory specified",
)
#: A quoted Hub model id ('org/name') in an error message.
_MODEL_ID = re.compile(r"'([A-Za-z0-9_-][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+)'")

_built = {"count": 0}
_results: list[dict[str, Any]] = []


def _fairway_classes() -> tuple[type, type]:
    """Fairway's two classes, each refusing (by skipping the test) a priority queue."""
    from fairway.vllm.scheduler import FairwayAsyncScheduler, FairwayScheduler

    def init(base: type) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            config = kwargs.get("vllm_config", args[0] if args else None)
            if getattr(getattr(config, "scheduler_config", None), "policy", "fcfs") != "fcfs":
                pytest.skip("priority queue: Fairway requires --scheduling-policy fcfs")
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Count the Fairway schedulers this test builds (during its call phase)."""
    _built["count"] = 0
    yield
    item.user_properties.append(("fairway_schedulers", _built["count"]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    """Turn "model files not available offline" failures into skips that name the model."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        message = call.excinfo.exconly()
        text = f"{message}\n{report.longreprtext}"
        if any(marker in text for marker in _OFFLINE_MARKERS):
            model = (
                _first_model_id(message) if _MODEL_ID.search(message) else (_first_model_id(text))
            )
            report.outcome = "skipped"
            report.longrepr = (
                str(item.path),
                item.location[1] or 0,
                f"Skipped: needs Hub model {model} (offline)",
            )


def _first_model_id(text: str) -> str:
    match = _MODEL_ID.search(text)
    return match.group(1) if match else "(unknown)"


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
