"""vLLM 0.34's `--max-num-inflight-kv-loads` with Fairway: the composition, specified.

With the option set and a KV connector that may load a request's KV asynchronously (P/D: a
decode node's `do_remote_prefill` requests), vLLM keeps those requests in a second queue,
`async_kv_waiting`, and at each admission takes the head of whichever queue arrived first.
Fairway orders `waiting` only: a load is not a prefill, and on a prefill node (Fairway's place)
the second queue stays empty. So, as these tests hold on vLLM's real scheduler:

* the loads keep their arrival order, untouched by Fairway;
* the plain waiting requests are admitted in Fairway's order;
* vLLM interleaves the two by the arrival of their heads;
* every request stays in exactly one queue.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

REMOTE_PREFILL = {
    "kv_transfer_params": {
        "do_remote_prefill": True, "remote_engine_id": "prefiller",
        "remote_block_ids": list(range(4)), "remote_request_id": "remote",
        "remote_host": "127.0.0.1", "remote_port": 1, "tp_size": 1,
    }
}


def _scheduler(offline):
    from vllm.config import SchedulerConfig

    if "max_num_inflight_kv_loads" not in SchedulerConfig.__dataclass_fields__:
        pytest.skip("vLLM before 0.34 has no --max-num-inflight-kv-loads")
    return offline.make_offline_scheduler(
        "lpm", kv_transfer_config={"kv_connector": "NixlConnector", "kv_role": "kv_both"},
        num_blocks=600, max_num_seqs=3, max_num_batched_tokens=4_096, max_num_inflight_kv_loads=8,
    )


def test_loads_keep_arrival_order_and_the_rest_fairways(offline, helpers):
    sched = _scheduler(offline)
    doc = helpers.tokens(1, 512)
    sched.add_request(offline.make_request("warm", doc, 0.0))  # caches the document
    offline.step(sched)
    offline.step(sched)
    arrivals = [
        ("load1", helpers.tokens(10_000, 64), 10.0, True),
        ("cold", helpers.tokens(20_000, 300), 11.0, False),
        ("load2", helpers.tokens(30_000, 64), 12.0, True),
        ("hit", doc + helpers.tokens(40_000, 20), 13.0, False),  # lpm: before "cold"
        ("load3", helpers.tokens(50_000, 64), 14.0, True),
        ("cold2", helpers.tokens(60_000, 300), 15.0, False),
    ]
    for name, prompt, arrival, load in arrivals:
        extra = {"extra_args": REMOTE_PREFILL} if load else {}
        sched.add_request(offline.make_request(name, prompt, arrival, **extra))
    assert [r.request_id for r in sched.async_kv_waiting] == ["load1", "load2", "load3"]
    started: list[str] = []
    left: list[str] = []  # loads in the order they left their queue
    for _ in range(6):
        before = [r.request_id for r in sched.async_kv_waiting]
        output, _ = offline.step(sched)
        started += [d.req_id for d in output.scheduled_new_reqs]
        after = [r.request_id for r in sched.async_kv_waiting]
        assert after == before[len(before) - len(after):]  # taken from the head only
        left += before[: len(before) - len(after)]
        helpers.check_queues(sched)
    assert left == ["load1", "load2", "load3"]
    plain = [n for n in started if not n.startswith("load")]
    assert plain == ["hit", "cold", "cold2"], started  # Fairway's (lpm's) order
    assert sched.fairway_totals.policy_fallbacks == 0
