"""The start-up self-test (`fairway.vllm.selftest`) on the running vLLM: it passes, and each way
an earlier Fairway read vLLM (before 0.33 and 0.34 changed what the names hold) is caught, by
name, exactly on the releases that changed it. The matrix (`make matrix`) runs this file on
each supported vLLM's code, so together they are the break table of the 0.33/0.34 rebase."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.integration


def _running() -> tuple[int, int]:
    import vllm

    from fairway.vllm_versions import release

    found = release(vllm.__version__)
    assert found is not None
    return found[:2]


def _old_started_ids(output: Any) -> Any:
    """Before: every scheduled request when the output has no `resumed_req_ids` (0.34)."""
    resumed = getattr(output.scheduled_cached_reqs, "resumed_req_ids", None)
    if resumed is None:
        return output.num_scheduled_tokens.keys()
    return [*(data.req_id for data in output.scheduled_new_reqs), *resumed]


def _old_report_request_error(scheduler: Any, request_id: str, reason: str) -> None:
    """Before: only a set of ids was understood; anything else did nothing (0.33's dict)."""
    errors = getattr(scheduler, "grammar_compile_error_reqs", None)
    if isinstance(errors, set):
        errors.add(request_id)


def _old_entry_block_reader(pool: Any) -> Any:
    """Before: an entry was a block or a dict of duplicate blocks (0.34 keeps block ids)."""
    return lambda entry: next(iter(entry.values())) if isinstance(entry, dict) else entry


def _old_skips_external_kv(request: Any) -> bool:
    """Before: a `getattr` default on the 0.32 flag, which 0.34 removed."""
    return bool(getattr(request, "skip_reading_prefix_cache", False))


def _old_model_runner_output(req_ids: list[str], sampled: list[list[int]]) -> Any:
    """Before: `req_id_to_index` always passed (0.34 removed the field)."""
    from vllm.v1.outputs import ModelRunnerOutput

    return ModelRunnerOutput(
        req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={}, pooler_output=[],
    )


#: (internals function, its reading before the rebase, the first release it is wrong on, a word
#: the self-test's finding names).
OLD_READINGS = [
    ("started_ids", _old_started_ids, (0, 34), "started"),
    ("report_request_error", _old_report_request_error, (0, 33), "grammar_compile_error_reqs"),
    ("entry_block_reader", _old_entry_block_reader, (0, 34), "BlockHashToBlockMap._cache"),
    ("skips_external_kv", _old_skips_external_kv, (0, 34), "skip_reading"),
    ("model_runner_output", _old_model_runner_output, (0, 34), "TypeError"),
]


def test_the_self_test_passes_on_this_vllm():
    from fairway.vllm import selftest

    assert selftest.find_problems() == ()


@pytest.mark.parametrize(("name", "old", "broken_since", "named"), OLD_READINGS,
                         ids=[r[0] for r in OLD_READINGS])
def test_the_old_reading_is_caught_where_vllm_changed(monkeypatch, name, old, broken_since,
                                                      named):
    from fairway.vllm import internals, selftest

    monkeypatch.setattr(internals, name, old)
    found = selftest.find_problems()
    if _running() >= broken_since:
        assert found, f"the pre-rebase {name} passed the self-test on vLLM {_running()}"
        assert any(named in problem for problem in found), found
    else:
        assert found == (), f"the pre-rebase {name} was right on vLLM {_running()}: {found}"


def test_a_scheduler_refuses_to_start_on_a_changed_meaning(offline, monkeypatch):
    """The finding reaches the user: the scheduler does not start, and says which internal and
    what it found."""
    from fairway.errors import FairwayError
    from fairway.vllm import internals, selftest

    monkeypatch.setattr(selftest, "problems", lambda: ("X.y: found z",))
    with pytest.raises(FairwayError, match=r"missing or changed: X\.y: found z.*make rebase"):
        offline.make_offline_scheduler("fcfs", num_blocks=64)
    monkeypatch.setattr(internals, "check_internals", lambda scheduler: ["Scheduler.gone"])
    with pytest.raises(FairwayError, match=r"Scheduler\.gone"):
        offline.make_offline_scheduler("fcfs", num_blocks=64)


def test_a_window_that_would_undo_the_order_is_refused(offline):
    """vLLM 0.34's `--cache-aware-admission-window` re-sorts the queue's head inside its step,
    after Fairway ordered it: the scheduler refuses it (the CLI check too: tests/unit)."""
    from vllm.config import SchedulerConfig

    from fairway.errors import FairwayConfigError

    if "cache_aware_admission_window" not in SchedulerConfig.__dataclass_fields__:
        pytest.skip("vLLM before 0.34 has no cache-aware admission window")
    with pytest.raises(FairwayConfigError, match="cache-aware-admission-window.*vllm-window"):
        offline.make_offline_scheduler("fcfs", num_blocks=64, cache_aware_admission_window=8)
    sched = offline.make_offline_scheduler("fcfs", num_blocks=64, cache_aware_admission_window=0)
    assert sched.fairway_policy.name == "fcfs"
