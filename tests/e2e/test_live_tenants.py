"""Tenants on a live `fairway serve`: the `tenants` option from the command line, requests that
name their tenant (`vllm_xargs.tenant`, sent by the live replay client) and vLLM's priority queue.

One tiny CPU server (the e2e tests' settings), started with `--fairway-option tenants=[...]` and
`--scheduling-policy priority` (kept by `fairway serve` since the scheduler orders vLLM's
priority levels): requests of both listed tenants, one of an unlisted tenant and one with a
priority other than 0 all get a first token, and the scheduler's start line shows the option.
A server start is ~40-60 s on a small CPU box, so the test is marked e2e and slow.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from fairway import supervisor
from fairway.traces.format import Trace, TraceHeader, make_request

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STARTUP_TIMEOUT_S = float(os.environ.get("TEST_FAIRWAY_E2E_STARTUP_TIMEOUT_S", "240"))
TENANTS = '["heavy", "light"]'
#: (request id, arrival s, tenant, priority, prompt tokens)
REQUESTS = [("heavy-0", 0.0, "heavy", 0, 600), ("light-0", 0.0, "light", 0, 300),
            ("light-1", 0.05, "light", 1, 200), ("other-0", 0.1, "zz", 0, 100)]
SERVER_ARGS = (
    "--policy", "fairway", "--fairway-option", f"tenants={TENANTS}",
    # the replay client names each request's tenant in vllm_xargs: trusted here (fairway.trust;
    # tests/e2e/test_live_trust.py runs the api-key source)
    "--fairway-option", "tenant_source=client",
    "--scheduling-policy", "priority",
    "--gpu-memory-utilization", "0.2", "--max-model-len", "2048",
    "--max-num-batched-tokens", "512", "--max-num-seqs", "16", "--enforce-eager",
    "--dtype", "bfloat16",
)


def _trace() -> Trace:
    requests = [
        make_request(rid, at, [(f"lt-{rid}", n)], phase="live", tenant=tenant, priority=prio)
        for rid, at, tenant, prio, n in REQUESTS
    ]
    header = TraceHeader(family="test-live-tenants", seed=0, shape=None, params={},
                         num_requests=len(requests), duration_s=0.1)
    return Trace(header, requests)


def test_two_tenants_and_a_priority_on_a_live_server(tmp_path: Path) -> None:
    from fairway.replay.live import run_live
    from fairway.tiny_model import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny", max_len=2048, seed=0)
    script = Path(sys.executable).parent / "fairway"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "fairway.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRWAY_")}
    env["HF_HUB_OFFLINE"] = "1"
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log_path = tmp_path / "server.log"
    try:
        with supervisor.running_server(
            [*command, "serve", str(model)], SERVER_ARGS, log_path=log_path, env=env,
            startup_timeout_s=STARTUP_TIMEOUT_S, name="fairway serve (tenants)",
        ) as server:
            result = run_live(_trace(), server.url, policy="fairway", vocab_size=512,
                              progress=False, timeout_s=120.0)
    except supervisor.ServerStartError as exc:
        pytest.fail(str(exc))
    log = log_path.read_text(errors="replace")
    got = {r.request_id: r for r in result.requests}
    assert set(got) == {rid for rid, *_ in REQUESTS}
    failed = {rid: r.error for rid, r in got.items() if r.ttft_s is None}
    assert not failed, f"failed: {failed}\nlog tail:\n{supervisor.log_tail(log_path, 60)}"
    assert {got[rid].tenant for rid in got} == {"heavy", "light", "zz"}
    assert got["light-1"].priority == 1
    assert "--scheduling-policy priority" in log  # the command `fairway serve` ran
    assert "'tenants': ['heavy', 'light']" in log, supervisor.log_tail(log_path, 60)
