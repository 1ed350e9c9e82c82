"""Hit/miss queue-time and TTFT histograms and the decision trace, on vLLM's real Scheduler."""

from __future__ import annotations

import json
import os

import pytest
from prometheus_client import REGISTRY

from fairway.errors import FairwayConfigError
from fairway.vllm.metrics import MULTIPROC_ENV

pytestmark = pytest.mark.integration

PREFIX = 640  # 40 blocks of 16 tokens


class Clock:
    """A settable clock for `set_fairway_clock` (arrival times are given explicitly)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _hit_and_miss_run(offline, helpers, sched, clock: Clock) -> None:
    """A warm-up of the prefix, then 3 hits (prefix + 32 own tokens) and 2 misses."""
    sched.set_fairway_clock(clock)
    prefix = helpers.tokens(10_000, PREFIX)
    sched.add_request(offline.make_request("warm", prefix + helpers.tokens(1, 32), 0.0))
    offline.run_until_idle(sched)
    clock.now = 10.0
    for k in range(3):
        own = helpers.tokens(20_000 + 100 * k, 32)
        sched.add_request(offline.make_request(f"hit{k}", prefix + own, 8.0))
    for k in range(2):
        sched.add_request(offline.make_request(f"miss{k}", helpers.tokens(50_000 + 1000 * k, 400),
                                               9.5))
    offline.run_until_idle(sched)


def test_queue_time_and_ttft_by_hit_and_miss(offline, helpers):
    if os.environ.get(MULTIPROC_ENV):
        pytest.skip("in-process registry check; the suite runs in multiprocess mode")
    sched = offline.make_offline_scheduler("fairway", max_num_batched_tokens=4096)
    labels = dict(sched.fairway_metrics.labels)

    def value(name, **extra):
        return REGISTRY.get_sample_value(name, {**labels, **extra}) or 0.0

    def queue(stat, cache):
        return sum(value(f"fairway:queue_time_seconds_{stat}", cache=cache, lane=lane)
                   for lane in ("fast", "fair", "single", "none"))

    before = {(s, c): queue(s, c) for s in ("count", "sum") for c in ("hit", "miss")}
    ttft_before = {c: value("fairway:ttft_seconds_count", cache=c) for c in ("hit", "miss")}
    _hit_and_miss_run(offline, helpers, sched, Clock())
    # warm (miss, waited 0 s), three hits (waited 2 s), two misses (waited 0.5 s)
    assert queue("count", "hit") - before["count", "hit"] == 3
    assert queue("count", "miss") - before["count", "miss"] == 3
    assert queue("sum", "hit") - before["sum", "hit"] == pytest.approx(6.0)
    assert queue("sum", "miss") - before["sum", "miss"] == pytest.approx(1.0)
    # one step admits all five (budget 4096): first tokens in that step's output
    assert value("fairway:ttft_seconds_count", cache="hit") - ttft_before["hit"] == 3
    assert value("fairway:ttft_seconds_count", cache="miss") - ttft_before["miss"] == 3
    # the hits waited 2 s: bucket le=2.5 has them, le=1.0 does not
    hit_le_1 = value("fairway:ttft_seconds_bucket", cache="hit", le="1.0")
    hit_le_2_5 = value("fairway:ttft_seconds_bucket", cache="hit", le="2.5")
    assert hit_le_2_5 - hit_le_1 >= 3
    assert sched.fairway_totals.policy_fallbacks == 0


def test_ttft_checks_reported_requests_and_sweeps_the_aborted(offline, helpers):
    """A first token comes with an output of `update_from_output`, so only the requests reported
    there are checked; a request aborted before its first token is dropped by the sweep within
    SWEEP_EVERY updates; an update result of another shape checks every pending request."""
    from vllm.v1.request import RequestStatus

    from fairway.vllm.observe import SWEEP_EVERY

    sched = offline.make_offline_scheduler(
        "fairway", max_num_batched_tokens=64, max_num_seqs=4, long_prefill_token_threshold=20
    )
    observer = sched.fairway_observer
    seen: list[str] = []
    observer.latency.observe_ttft = lambda cache, seconds: seen.append(cache)
    checked: list[str] = []

    class Watched(dict):  # records which pending entries after_update reads
        def get(self, key, default=None):
            checked.append(key)
            return super().get(key, default)

    observer.pending = Watched()
    for name in ("A", "B", "C"):
        sched.add_request(offline.make_request(name, helpers.tokens(1_000 * ord(name), 120), 1.0))
    offline.step(sched)  # all three admitted (vLLM's cap: 20 tokens each), the rest later
    assert set(observer.pending) == {"A", "B", "C"}
    sched.finish_requests("B", RequestStatus.FINISHED_ABORTED)
    checked.clear()
    for _ in range(10):  # until A's and C's prefills end (at most 64 tokens per step)
        offline.step(sched)
        if len(seen) == 2:
            break
    assert set(checked) <= {"A", "C"} and seen == ["miss", "miss"]
    assert set(observer.pending) == {"B"}  # aborted: no output names it
    request = offline.make_request("D", helpers.tokens(7_000, 8), 1.0)
    sched.add_request(request)
    offline.step(sched)  # D's first token comes, reported as usual
    assert seen == ["miss"] * 3
    for _ in range(SWEEP_EVERY):
        observer.after_update({})
    assert not observer.pending  # swept
    observer.pending["D2"] = (request, "hit")  # D again: a request that has its token
    observer.after_update(None)  # not vLLM's dict of outputs: every pending request checked
    assert seen == ["miss"] * 3 + ["hit"] and not observer.pending


def test_observer_is_off_without_log_stats_and_trace(offline):
    sched = offline.make_offline_scheduler("fairway", log_stats=False)
    assert sched.fairway_observer is None


def test_decision_trace_records_the_head_and_admissions(offline, helpers, tmp_path):
    path = tmp_path / "decisions.jsonl"
    sched = offline.make_offline_scheduler(
        "fairway", log_stats=False, max_num_batched_tokens=512,
        fairway_options={"decision_trace": str(path), "decision_trace_every": 1},
    )
    _hit_and_miss_run(offline, helpers, sched, Clock())
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records, "no record written"
    admitted = [rid for rec in records for rid in rec["admitted"]]
    assert sorted(admitted) == sorted(["warm", "hit0", "hit1", "hit2", "miss0", "miss1"])
    step = next(rec for rec in records if len(rec["head"]) == 5)
    assert step["ordered"] and step["policy"] == "fairway" and step["queue_len"] == 5
    rows = {row["id"]: row for row in step["head"]}
    assert [row["pos"] for row in step["head"]] == list(range(5))
    assert rows["hit0"]["h"] >= PREFIX - 16 and rows["hit0"]["c"] == rows["hit0"]["L"] - rows[
        "hit0"]["h"]
    assert rows["miss0"]["h"] == 0 and rows["miss0"]["c"] == 400
    assert rows["hit0"]["wait_s"] == pytest.approx(2.0) and rows["miss0"]["wait_s"] == 0.5
    assert all(row["lane"] in ("fast", "fair") for row in step["head"])
    assert rows["hit0"]["score"] > rows["miss0"]["score"]  # h / c + wait / SLO
    assert set(step["ledgers"]) >= {"fast", "fair", "steps"}  # the policy's LaneLedgers
    assert step["share"]["front_id"] in rows and "waiting_order" not in step["share"]
    for row in step["head"]:
        assert row["admitted"] == (row["id"] in step["admitted"])
    assert sched.fairway_observer.trace.records == len(records)


def test_decision_trace_every_n_and_rotation(offline, helpers, tmp_path):
    path = tmp_path / "d.jsonl"
    sched = offline.make_offline_scheduler(
        "fairway", log_stats=False, max_num_batched_tokens=64,
        fairway_options={"decision_trace": str(path), "decision_trace_every": 3,
                         "decision_trace_max_bytes": 1200, "decision_trace_head": 4},
    )
    for k in range(24):
        sched.add_request(offline.make_request(f"r{k}", helpers.tokens(1000 * k, 100), float(k)))
    offline.run_until_idle(sched)
    files = sorted(tmp_path.glob("d.jsonl*"))
    assert [f.name for f in files] == ["d.jsonl", "d.jsonl.1", "d.jsonl.2"]  # rotated, 2 kept
    records = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert all(f.stat().st_size <= 1200 for f in files)
    assert all(rec["step"] % 3 == 1 for rec in records)  # steps 1, 4, 7, ...
    assert all(len(rec["head"]) <= 4 for rec in records)


def test_a_failing_observer_never_stops_the_engine(offline, helpers, tmp_path):
    sched = offline.make_offline_scheduler(
        "fairway", fairway_options={"decision_trace": str(tmp_path / "d.jsonl")}
    )

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    sched.fairway_observer.trace.after_step = broken
    if sched.fairway_observer.latency is not None:
        sched.fairway_observer.latency.observe_ttft = broken
    for k in range(4):
        sched.add_request(offline.make_request(f"r{k}", helpers.tokens(1000 * k, 100), 1.0))
    outputs = offline.run_until_idle(sched)
    assert not sched.has_requests() and len(outputs) < 50
    assert sched.fairway_totals.policy_fallbacks + sched.fairway_stats.policy_fallbacks >= 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"decision_trace_every": 0}, "decision_trace_every=0"),
        ({"decision_trace_max_bytes": "big"}, "must be an integer >= 1"),
        ({"decision_trace": ""}, "decision_trace=''"),
    ],
)
def test_bad_trace_options_are_refused(offline, options, message):
    with pytest.raises(FairwayConfigError, match=message):
        offline.make_offline_scheduler("fairway", fairway_options=options)


def test_unwritable_trace_path_is_a_clear_error(offline, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(FairwayConfigError, match="cannot open it for writing"):
        offline.make_offline_scheduler(
            "fairway", fairway_options={"decision_trace": str(blocker / "d.jsonl")}
        )
