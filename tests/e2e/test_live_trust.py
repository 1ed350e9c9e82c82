"""Who a tenant is, on a live `fairway serve` (`fairway.trust`): with `tenant_source=api-key`
a client that names another tenant in `vllm_xargs` gets the default tenant's share, not that
tenant's, and is counted; only the API key's tenant counts; a priority below the floor is
raised; `fairway:queued_uncached_tokens` is exported and reads 0 once the node is idle.

One tiny CPU server (the e2e tests' settings), `--scheduling-policy priority`, tenants heavy and
light, the key map in a file; `fairway serve` adds Fairway's middleware itself. Observed on the
API server's `/metrics`: `fairway:tenant_prefill_tokens_total` by tenant (each prompt is its
own, so its prefill is its whole length) and the untrusted-claims counters. A server start is
~40-60 s on a small CPU box, so the test is marked e2e and slow.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from fairway import supervisor

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STARTUP_TIMEOUT_S = float(os.environ.get("TEST_FAIRWAY_E2E_STARTUP_TIMEOUT_S", "240"))
KEYS = {"sk-light": "light", "sk-ops": {"tenant": "heavy", "priority_floor": -5}}
_LOW, _HIGH = 3, 512  # inside the tiny model's vocabulary


def prompt(k: int, n: int) -> list[int]:
    """n tokens of their own (no two prompts share a block)."""
    return [_LOW + (97 * k + 31 * j + 7) % (_HIGH - _LOW) for j in range(n)]


#: (name, API key, vllm_xargs tenant, priority, prompt tokens)
REQUESTS = [
    ("trusted", "sk-light", "light", 0, 300),  # light's key: light
    ("claim", None, "light", 0, 200),  # names light, no key: default
    ("other-key", "sk-ops", "light", -5, 150),  # heavy's key naming light: heavy, floor -5 kept
    ("greedy", None, "heavy", -20, 120),  # no key: default, priority raised to 0
    ("unknown-key", "sk-nobody", None, 0, 90),  # a key the map does not know: default
]


def _sample(text: str, name: str, **labels: str) -> float:
    """Sum of the series `name` whose labels include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def test_a_client_naming_another_tenant_gets_the_default_share(
    tiny_model: Path, tmp_path: Path, e2e
) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps(KEYS))
    args = (
        "--policy", "fairway", "--fairway-option", 'tenants=["heavy", "light"]',
        "--fairway-option", "tenant_source=api-key", "--fairway-option", f"tenant_keys={keys}",
        "--scheduling-policy", "priority", *e2e.cpu_server_args,
    )
    log_path = tmp_path / "server.log"
    try:
        with supervisor.running_server(
            [*e2e.fairway_command(), "serve", str(tiny_model)], args, log_path=log_path,
            env=e2e.server_env(), startup_timeout_s=STARTUP_TIMEOUT_S,
            name="fairway serve (trust)",
        ) as server, httpx.Client(base_url=server.url, timeout=120.0) as client:
            before = client.get("/metrics").text
            for k, (name, key, tenant, priority, n) in enumerate(REQUESTS):
                body = {"model": str(tiny_model), "prompt": prompt(k, n), "max_tokens": 1,
                        "priority": priority}
                if tenant is not None:
                    body["vllm_xargs"] = {"tenant": tenant}
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                response = client.post("/v1/completions", json=body, headers=headers)
                assert response.status_code == 200, (name, response.text)
            after = client.get("/metrics").text
    except supervisor.ServerStartError as exc:
        pytest.fail(str(exc))
    log = log_path.read_text(errors="replace")
    context = supervisor.log_tail(log_path, 60)

    def moved(name: str, **labels: str) -> float:
        return _sample(after, name, **labels) - _sample(before, name, **labels)

    prefill = {t: moved("fairway:tenant_prefill_tokens_total", tenant=t)
               for t in ("default", "heavy", "light", "other")}
    assert prefill == {"default": 200 + 120 + 90, "heavy": 150, "light": 300, "other": 0}, context
    claims = {t: moved("fairway:untrusted_tenant_claims_total", tenant=t)
              for t in ("default", "heavy", "light", "other")}
    assert claims == {"default": 0, "heavy": 1, "light": 2, "other": 0}, context
    assert moved("fairway:untrusted_priority_claims_total") == 1, context
    assert _sample(after, "fairway:queued_uncached_tokens") == 0, context  # idle: no work left
    assert "fairway:queued_uncached_tokens" in before  # exported from the start
    assert "--middleware fairway.middleware.TenantMiddleware" in log, context
    assert "TenantMiddleware gives tenants from 2 API keys" in log, context
    # three ignored claims and one raised priority, each logged once
    assert log.count("fairway:untrusted_tenant_claims_total; logged once") == 1, context
    assert log.count("fairway:untrusted_priority_claims_total; logged once") == 1, context
    assert "sk-light" not in log.replace(str(keys), "")  # no key in the log
