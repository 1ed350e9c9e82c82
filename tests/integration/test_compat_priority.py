"""`make compat`'s priority-scheduling part, without vLLM's sdist.

* the plugin's logic (`benchmarks/compat/fairway_compat.py`): the priority builders are wrapped so
  that only they build Fairway's class, expected differences are matched by id like the skips,
  and the summary counts the tests that started a Fairway scheduler under priority scheduling;
* the one upstream priority test that fails against Fairway
  (`tests/v1/core/test_worker_slot_overflow.py::
  test_reset_prefix_cache_priority_does_not_over_admit_worker_slot`, vLLM 0.32.0), replayed on
  the offline harness, and the same fault reached by vLLM's own preemption after a step Fairway
  skipped (a stale slot in `QueueTable._match`, now fixed).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import pytest

PLUGIN = Path(__file__).resolve().parents[2] / "benchmarks" / "compat" / "fairway_compat.py"


@pytest.fixture(scope="module")
def compat() -> Any:
    spec = importlib.util.spec_from_file_location("fairway_compat_under_test", PLUGIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[spec.name]
        raise
    return module


def test_builder_wrapper_swaps_scheduler_only_while_building(compat):
    """A wrapped builder builds the given class; the module's global is restored after, also
    when the builder raises."""
    module = types.ModuleType("upstream_tests")

    class VllmScheduler:
        pass

    class FairwayScheduler:
        pass

    module.Scheduler = VllmScheduler
    exec(  # a builder that reads its module's `Scheduler` global, as upstream's do
        "def build(fail=False):\n"
        "    if fail:\n"
        "        raise RuntimeError('boom')\n"
        "    return Scheduler()\n",
        module.__dict__,
    )
    wrapped = compat._with_scheduler(module, module.build, FairwayScheduler)
    assert wrapped.__name__ == "build" and wrapped.fairway_compat_wrapped
    assert isinstance(wrapped(), FairwayScheduler)
    assert module.Scheduler is VllmScheduler
    with pytest.raises(RuntimeError):
        wrapped(fail=True)
    assert module.Scheduler is VllmScheduler
    assert isinstance(module.build(), VllmScheduler)  # the unwrapped builder is unchanged


def test_expected_differences_match_like_skips(compat, monkeypatch):
    monkeypatch.setattr(compat, "EXPECTED_DIFFERENCES", {
        "tests/a.py::test_x": "whole function",
        "tests/a.py::test_y[1]": "one parametrization",
    })
    assert compat.difference_for("tests/a.py::test_x[p-2]") == "whole function"
    assert compat.difference_for("tests/a.py::test_y[1]") == "one parametrization"
    assert compat.difference_for("tests/a.py::test_y[2]") is None
    assert compat.difference_for("tests/a.py::test_z") is None


def test_summary_counts_priority_tests_and_expected_differences(compat):
    def row(outcome, built=1, priority=1, reason=""):
        return {"test": "t", "outcome": outcome, "phase": "call", "fairway_schedulers": built,
                "fairway_priority_schedulers": priority, "reason": reason}

    summary = compat.summarize([
        row("passed"), row("passed"), row("failed"),
        row("failed", built=0),  # a refused start-up: counted as a priority test that failed
        row("xfailed", reason="asserts the heap"),
        row("passed", priority=0), row("passed", built=0, priority=0),
        row("skipped", built=0, priority=0, reason="offline"),
    ])
    assert summary["counts"] == {
        "passed with a Fairway scheduler": 3,
        "passed without building a scheduler": 1,
        "failed": 2,
        "skipped": 1,
        "expected differences (xfailed)": 1,
        "stale expected differences (passed)": 0,
    }
    assert summary["priority"] == {
        "tests": 5, "passed": 2, "failed": 2, "expected differences": 1,
    }
    assert summary["difference_reasons"] == {"asserts the heap": 1}
    assert summary["skip_reasons"] == {"offline": 1}


def test_priority_builders_and_tables_name_upstream_ids(compat):
    """Ids are `path::function[params]` under upstream's `tests/`; builders are module names."""
    for key in [*compat.SKIPS, *compat.EXPECTED_DIFFERENCES]:
        assert key.startswith("tests/") and "::" in key
    assert compat.PRIORITY_BUILDERS["tests.v1.core.test_scheduler"] == (
        "create_scheduler_with_priority"
    )


#: The fault these two tests guard against (fixed in `QueueTable._match`): a request admitted at
#: step N (its slot released) that vLLM puts back at the head before Fairway arranges the queue
#: again (reset_prefix_cache(reset_running_requests=True) between steps; or a preemption in step
#: N+1 when Fairway skipped N+1 for want of a free request slot) made the queue equal to the last
#: arranged one, so `_match` gave it its released slot (priority zeroed, or the columns of the new
#: arrival that reused the slot) and it was never registered again.


@pytest.mark.integration
def test_reset_prefix_cache_then_higher_priority_arrival(offline):
    """Upstream's scenario: A (priority 10) runs; a prefix-cache reset preempts it out of band
    (vLLM prepends it to the waiting deque); B (priority 0) arrives; with one request slot, B
    must be admitted, as vLLM's priority heap does."""
    sched = offline.make_offline_scheduler(
        "fcfs", max_num_seqs=1, scheduling_policy="priority",
    )
    sched.add_request(offline.make_request("A", list(range(4)), 1.0, 100, priority=10))
    offline.step(sched)
    assert sched.reset_prefix_cache(reset_running_requests=True)
    sched.add_request(offline.make_request("B", list(range(100, 104)), 2.0, 100, priority=0))
    out = sched.schedule()
    assert "A" in out.preempted_req_ids
    assert list(out.num_scheduled_tokens) == ["B"]  # with the fault: ["A"] (A resumed first)


@pytest.mark.integration
def test_preempted_after_skipped_step_keeps_its_level(offline):
    """No out-of-band call: Y (priority 5) takes the last request slot; the next step Fairway
    skips (no free slot) and vLLM preempts Y for X's new block; Z (priority 1) arrives. vLLM's
    heap admits Z (Y, at its head otherwise, needs two blocks and does not fit); Fairway, under
    `fcfs` (its order is vLLM's there: levels, then arrival), must decide the same."""

    def run(policy):
        sched = offline.make_offline_scheduler(
            policy, max_num_seqs=2, num_blocks=5, scheduling_policy="priority",
            enable_prefix_caching=False,
        )
        sched.add_request(offline.make_request("X", list(range(1000, 1031)), 0.0, 100))
        offline.step(sched)
        sched.add_request(offline.make_request("A", list(range(2000, 2016)), 1.0, 100,
                                               priority=10))
        sched.add_request(offline.make_request("Y", list(range(3000, 3016)), 2.0, 100,
                                               priority=5))
        first, _ = offline.step(sched)
        second, _ = offline.step(sched)
        sched.add_request(offline.make_request("Z", list(range(4000, 4008)), 3.0, 100,
                                               priority=1))
        third = sched.schedule()
        return (sorted(first.num_scheduled_tokens), sorted(second.preempted_req_ids),
                sorted(third.num_scheduled_tokens))

    vllm = run(None)
    assert vllm == (["X", "Y"], ["Y"], ["X", "Z"])  # the scenario as built
    assert run("fcfs") == vllm  # with the fault: third step ["X"] (Y ordered with Z's level)
