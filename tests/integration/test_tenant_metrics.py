"""Per-tenant series (`fairway:tenant_*`) and the trace's tenant counters, on vLLM's real Scheduler.

With the `tenants` option: prompt tokens per tenant label equal what vLLM scheduled for each
tenant's requests, an unlisted tenant name counts under `other`, a request without one under
`default`; the waiting gauge counts vLLM's waiting queue per label; TTFT is observed per label.
Without the option no tenant series exists at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess

from fairway.vllm.metrics import MULTIPROC_ENV, prepare_server_env

pytestmark = pytest.mark.integration

TENANTS = {"a": 1, "b": 2}
#: (request id, tenant it names, prompt tokens); "zz" is not listed: label `other`.
REQUESTS = [("a1", "a", 300), ("a2", "a", 90), ("b1", "b", 200), ("x1", "zz", 120),
            ("d1", None, 70)]
LABEL = {"a": "a", "b": "b", "zz": "other", None: "default"}


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _in_process_only() -> None:
    if os.environ.get(MULTIPROC_ENV):
        pytest.skip("in-process registry check; the suite runs in multiprocess mode")


def _scheduler(offline, policy: str, **kwargs):
    return offline.make_offline_scheduler(
        policy, max_num_batched_tokens=64, fairway_options={"tenants": TENANTS}, **kwargs
    )


def _add(offline, helpers, sched, arrival: float = 1.0) -> None:
    for k, (rid, tenant, n) in enumerate(REQUESTS):
        sched.add_request(offline.make_request(rid, helpers.tokens(10_000 * (k + 1), n), arrival,
                                               max_tokens=40, tenant=tenant))


def _expected_prefill(sched) -> dict[str, int]:
    """Prompt tokens computed so far per label (distinct prompts: no cache hits, no preemption;
    every request is still live: 40 output tokens each)."""
    out = dict.fromkeys(("default", "a", "b", "other"), 0)
    for rid, tenant, n in REQUESTS:
        request = sched.requests[rid]
        out[LABEL[tenant]] += min(request.num_computed_tokens, n)
    return out


@pytest.mark.parametrize("policy", ["fairway", "fcfs", "lpm"])
def test_prefill_tokens_and_waiting_per_tenant(offline, helpers, policy):
    _in_process_only()
    sched = _scheduler(offline, policy)
    labels = dict(sched.fairway_metrics.labels)

    def value(name, tenant):
        return REGISTRY.get_sample_value(name, {**labels, "tenant": tenant})

    # every label exists from the start, at 0 (before any request), and only these
    for tenant in ("default", "a", "b", "other"):
        assert value("fairway:tenant_prefill_tokens_total", tenant) is not None
        assert value("fairway:tenant_waiting_requests", tenant) == 0
    before = {t: value("fairway:tenant_prefill_tokens_total", t) for t in LABEL.values()}
    _add(offline, helpers, sched)
    for step in range(4):  # 64 tokens a step: some prefills done, some not started
        offline.step(sched)
        expected = _expected_prefill(sched)
        got = {t: value("fairway:tenant_prefill_tokens_total", t) - before[t] for t in before}
        assert got == expected, (step, got, expected)
        waiting = dict.fromkeys(before, 0)
        for request in sched.waiting:
            waiting[LABEL[(request.sampling_params.extra_args or {}).get("tenant")]] += 1
        assert {t: value("fairway:tenant_waiting_requests", t) for t in before} == waiting
    assert 0 < sum(got.values()) <= 4 * 64
    offline.run_until_idle(sched)
    got = {t: value("fairway:tenant_prefill_tokens_total", t) - before[t] for t in before}
    assert got == {"a": 390, "b": 200, "other": 120, "default": 70}
    assert sched.fairway_totals.tenant_prefill_tokens == got
    assert {t: value("fairway:tenant_waiting_requests", t) for t in before} == dict.fromkeys(
        before, 0)
    assert sched.fairway_totals.policy_fallbacks == 0
    assert len(sched.fairway_prepass.tenant_labels.cache) <= 64 + 2 * len(sched.requests)


def test_ttft_per_tenant(offline, helpers):
    _in_process_only()
    sched = _scheduler(offline, "fairway", max_num_seqs=8)
    sched.fairway_clock = clock = Clock(5.0)  # arrivals at 1.0: every TTFT is 4 s
    labels = dict(sched.fairway_metrics.labels)

    def value(name, tenant, **extra):
        return REGISTRY.get_sample_value(name, {**labels, "tenant": tenant, **extra}) or 0.0

    name = "fairway:tenant_time_to_first_token_seconds"
    before = {t: (value(f"{name}_count", t), value(f"{name}_sum", t)) for t in LABEL.values()}
    _add(offline, helpers, sched)
    offline.run_until_idle(sched)
    assert clock.now == 5.0
    counts = {t: value(f"{name}_count", t) - before[t][0] for t in before}
    sums = {t: value(f"{name}_sum", t) - before[t][1] for t in before}
    assert counts == {"a": 2, "b": 1, "other": 1, "default": 1}
    assert sums == {t: pytest.approx(4.0 * n) for t, n in counts.items()}
    # same buckets as vLLM's TTFT: 4 s lies in (2.5, 5.0]
    assert value(f"{name}_bucket", "a", le="5.0") - value(f"{name}_bucket", "a", le="2.5") >= 2
    assert not sched.fairway_observer.pending_tenants


def test_without_tenants_no_tenant_series(offline, helpers):
    sched = offline.make_offline_scheduler("fairway", max_num_batched_tokens=64)
    assert sched.fairway_metrics.tenants is None
    assert sched.fairway_prepass.tenant_labels is None
    sched.add_request(offline.make_request("t", helpers.tokens(1, 100), 1.0, tenant="a"))
    offline.run_until_idle(sched)
    assert sched.fairway_totals.tenant_prefill_tokens == {}
    assert sched.fairway_totals.tenant_waiting is None
    assert not sched.fairway_observer.pending_tenants
    # (the registry of this process may hold other tests' tenant series: the process check is
    # the next test)


def test_no_tenant_series_in_a_process_without_tenants(tmp_path):
    """A server without the option: neither its registry nor /metrics (multiprocess files)
    shows any tenant series or HELP line; with it, every label is there at 0."""
    child = textwrap.dedent(
        """
        import sys
        from prometheus_client import REGISTRY, generate_latest
        from fairway.tenants import TenantTable
        from fairway.vllm.metrics import FairwayMetrics, FairwayStats
        metrics = FairwayMetrics(model_name="tiny", engine="0", policy="fairway")
        table = TenantTable.parse({"a": 1, "b": 2} if sys.argv[1] == "on" else None)
        metrics.enable_tenants(table)
        stats = FairwayStats(steps_ordered=1)
        if table.enabled:
            stats.tenant_prefill_tokens.update({"a": 64, "other": 5})
            stats.tenant_waiting = {"default": 0, "a": 2, "b": 1, "other": 0}
        metrics.record(stats)
        if sys.argv[1] == "off":
            assert "tenant" not in generate_latest(REGISTRY).decode()
        """
    )
    texts = {}
    for mode in ("off", "on"):
        path = tmp_path / mode
        env = prepare_server_env(dict(os.environ), multiproc_dir=str(path))
        subprocess.run([sys.executable, "-c", child, mode], env=env, check=True, timeout=120)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=str(path))
        texts[mode] = generate_latest(registry).decode()
    assert "fairway:steps_ordered_total" in texts["off"] and "tenant" not in texts["off"]
    on = texts["on"]
    base = 'engine="0",model_name="tiny",policy="fairway"'
    for line in (
        f'fairway:tenant_prefill_tokens_total{{{base},tenant="a"}} 64.0',
        f'fairway:tenant_prefill_tokens_total{{{base},tenant="other"}} 5.0',
        f'fairway:tenant_prefill_tokens_total{{{base},tenant="b"}} 0.0',
        f'fairway:tenant_waiting_requests{{{base},tenant="a"}} 2.0',
        f'fairway:tenant_time_to_first_token_seconds_count{{{base},tenant="default"}} 0.0',
    ):
        assert line in on, (line, on)


def test_decision_trace_records_tenant_counters(offline, helpers, tmp_path):
    path = tmp_path / "trace.jsonl"
    sched = offline.make_offline_scheduler(
        "fairway", max_num_batched_tokens=64, log_stats=False,
        fairway_options={"tenants": TENANTS, "decision_trace": str(path),
                         "decision_trace_every": 1})
    _add(offline, helpers, sched)
    offline.run_until_idle(sched)
    sched.fairway_observer.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    with_counters = [r for r in records if "tenant_counters" in r]
    assert with_counters, records[:2]
    for record in with_counters:
        counters = record["tenant_counters"]
        assert counters and set(counters) <= {"default", "a", "b"}  # `other` pools in default
        assert min(counters.values()) >= 0
    from fairway import inspection

    last = inspection.trace_tenant_counters(path)
    assert last is not None and last["step"] == with_counters[-1]["step"]
    assert last["counters"] == {t: with_counters[-1]["tenant_counters"][t]
                                for t in inspection.tenant_order(last["counters"])}


def test_decision_trace_has_no_tenant_counters_without_tenants(offline, helpers, tmp_path):
    path = tmp_path / "trace.jsonl"
    sched = offline.make_offline_scheduler(
        "fairway", max_num_batched_tokens=64, log_stats=False,
        fairway_options={"decision_trace": str(path), "decision_trace_every": 1})
    for k in range(3):
        sched.add_request(offline.make_request(f"r{k}", helpers.tokens(1000 * (k + 1), 100),
                                               1.0, tenant="a"))
    offline.run_until_idle(sched)
    sched.fairway_observer.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records and not any("tenant_counters" in r for r in records)


def test_a_failing_tenant_lookup_is_a_counted_fallback(offline, helpers):
    sched = _scheduler(offline, "fairway")
    labels = sched.fairway_prepass.tenant_labels

    def broken(request):
        raise RuntimeError("boom")

    labels._tenant_of = broken
    _add(offline, helpers, sched)
    offline.run_until_idle(sched)
    assert not sched.has_requests()  # the engine served every request
    assert sched.fairway_totals.policy_fallbacks >= 1
    assert RuntimeError in sched.fairway_prepass.failed_types
