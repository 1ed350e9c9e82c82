"""Offload internals no other test reads on vLLM's real Scheduler: a request's
`max_load_tokens` is read as vLLM's offloading connector reads it (`internals.max_load_tokens`;
the probe's cap against the connector's load: `test_tier_probe.py`), and the finished ids that
`offload_worker.order_finished_ids` orders are the set vLLM adds to between steps and hands over,
replacing it, in `schedule()` (`internals.finished_request_ids`).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_max_load_tokens_is_read_as_the_connector_reads_it(offline, helpers):
    """A non-negative int is the cap; anything else is no cap (vLLM warns and ignores it)."""
    from fairway.vllm import internals

    def request(params):
        extra = {} if params is None else {"extra_args": {"kv_transfer_params": params}}
        return offline.make_request("r", helpers.tokens(1, 40), 0.0, **extra)

    assert internals.max_load_tokens(request({"max_load_tokens": 128})) == 128
    assert internals.max_load_tokens(request({"max_load_tokens": 0})) == 0
    for ignored in (None, {}, {"max_load_tokens": -1}, {"max_load_tokens": "64"},
                    {"max_load_tokens": 64.0}, {"max_load_tokens": True}):
        assert internals.max_load_tokens(request(ignored)) is None, ignored


def test_finished_ids_are_a_set_vllm_adds_to_and_replaces_in_schedule(offline, helpers):
    """What `offload_worker.order_finished_ids` relies on, with the tier's connector in the
    engine: between steps vLLM only adds the ids of finishing requests to the scheduler's set
    (so a `FinishOrder` put there keeps their order), and `schedule()` hands that very set to
    the connector and starts a new plain one."""
    from fairway.vllm import internals, offload_worker

    sched = offline.make_offline_scheduler(
        "fcfs", num_blocks=40, log_stats=False,
        kv_transfer_config=offload_worker.transfer_config(400),
    )
    for i, name in enumerate(("r2", "r10", "r1")):
        sched.add_request(offline.make_request(name, helpers.tokens(1_000 * (i + 1), 40),
                                               float(i)))
    output = sched.schedule()
    assert set(output.num_scheduled_tokens) == {"r2", "r10", "r1"}
    offload_worker.order_finished_ids(sched)  # as the replay does after each schedule()
    ordered = internals.finished_request_ids(sched)
    assert isinstance(ordered, offload_worker.FinishOrder) and not ordered
    # each prefill gets its one token: all finish (the step's stores are reported done)
    transfers = internals.offload_transfers(offload_worker.step_metadata(output))
    model_output = offline.fake_model_output(sched, output)
    model_output.kv_connector_output = internals.offload_worker_output(
        [], [(job, req, blocks, 0.0) for job, (req, blocks) in transfers.stores.items()])
    sched.update_from_output(output, model_output)
    assert internals.finished_request_ids(sched) is ordered
    assert list(ordered) == ["r2", "r10", "r1"]  # the order vLLM finished them in
    output = sched.schedule()
    assert output.finished_req_ids is ordered  # handed to the connector as it is
    fresh = internals.finished_request_ids(sched)
    assert fresh is not ordered and type(fresh) is set and not fresh
