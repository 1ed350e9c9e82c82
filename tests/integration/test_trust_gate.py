"""The trust gate on vLLM's real Scheduler (`fairway.vllm.identity`): under tenant_source api-key
a tenant the client names itself is served as the default tenant (its prefill counts under
`default`, not under the tenant it named) and counted; the middleware's sealed identity is
believed; a priority below the floor is raised, which vLLM's priority order then follows.
"""

from __future__ import annotations

import os

import pytest
from prometheus_client import REGISTRY

from fairway.trust import SEAL_ENV, Identity, Sealer, stamp
from fairway.vllm.metrics import MULTIPROC_ENV

pytestmark = pytest.mark.integration

SECRET = "0123456789abcdef" * 4
ENFORCED = {"tenants": ["heavy", "light"], "tenant_source": "api-key",
            "tenant_keys": "env:UNUSED"}  # the scheduler never reads the key map


def _xargs(tenant: str | None = None, *, sealed: str | None = None, floor: int | None = None,
           secret: str = SECRET) -> dict:
    out = {"tenant": tenant} if tenant is not None else {}
    if sealed is not None:
        out |= stamp(None, Identity(sealed, floor), Sealer(secret))
    return out


def _nonzero(tally: dict[str, int]) -> dict[str, int]:
    return {k: n for k, n in tally.items() if n}


def test_only_sealed_tenants_count_and_claims_are_counted(offline, helpers, monkeypatch):
    monkeypatch.setenv(SEAL_ENV, SECRET)
    sched = offline.make_offline_scheduler(
        "fairway", max_num_batched_tokens=64, fairway_options=ENFORCED)
    requests = {  # id: (extra_args, prompt tokens)
        "trusted": (_xargs(sealed="light"), 100),
        "claim": (_xargs("light"), 120),  # names light itself: default
        "forged": (_xargs("light", sealed="light", secret="e" * 64), 80),  # another secret
        "overridden": (_xargs("heavy", sealed="light"), 60),  # light's key, naming heavy
        "plain": (_xargs(), 40),
    }
    for k, (extra, n) in enumerate(requests.values()):
        request = offline.make_request(
            list(requests)[k], helpers.tokens(10_000 * (k + 1), n), 1.0, max_tokens=2,
            extra_args=extra)
        sched.add_request(request)
    served = {rid: r.sampling_params.extra_args for rid, r in sched.requests.items()}
    assert served == {"trusted": {"tenant": "light"}, "claim": {}, "forged": {},
                      "overridden": {"tenant": "light"}, "plain": {}}
    offline.run_until_idle(sched)
    totals = sched.fairway_totals
    assert _nonzero(totals.tenant_prefill_tokens) == {"default": 120 + 80 + 40,
                                                      "light": 100 + 60}
    assert _nonzero(totals.untrusted_tenant_claims) == {"heavy": 1, "light": 2}
    assert totals.untrusted_priority_claims == 0
    assert totals.policy_fallbacks == 0
    if not os.environ.get(MULTIPROC_ENV):  # the series, in this process's registry
        labels = dict(sched.fairway_metrics.labels)
        value = REGISTRY.get_sample_value(
            "fairway:untrusted_tenant_claims_total", {**labels, "tenant": "light"})
        assert value is not None and value >= 2


def test_priorities_below_the_floor_are_raised(offline, helpers, monkeypatch):
    """One request slot, priority scheduling: a client asking for priority -10 would jump the
    queue; under enforced trust (floor 0) it waits its turn, and a sealed floor of -5 lets the
    operator's key go first."""
    monkeypatch.setenv(SEAL_ENV, SECRET)
    sched = offline.make_offline_scheduler(
        "fcfs", max_num_seqs=1, scheduling_policy="priority", fairway_options=ENFORCED)
    order = []
    for k, (rid, priority, extra) in enumerate([
        ("first", 0, {}), ("greedy", -10, _xargs("heavy")), ("ops", -5, _xargs(sealed="heavy",
                                                                              floor=-5)),
        ("late", 0, {}),
    ]):
        sched.add_request(offline.make_request(
            rid, helpers.tokens(1000 * (k + 1), 30), 1.0 + k, max_tokens=1,
            priority=priority, extra_args=extra))
    assert {rid: r.priority for rid, r in sched.requests.items()} == {
        "first": 0, "greedy": 0, "ops": -5, "late": 0}
    while sched.has_requests():
        output, _ = offline.step(sched)
        order += list(output.num_scheduled_tokens)
    assert order == ["ops", "first", "greedy", "late"]
    assert sched.fairway_totals.untrusted_priority_claims == 1
    assert _nonzero(sched.fairway_totals.untrusted_tenant_claims) == {"heavy": 1}


def test_client_source_is_todays_rule_with_no_gate(offline, helpers):
    sched = offline.make_offline_scheduler(
        "fairway", fairway_options={"tenants": ["light"], "tenant_source": "client"})
    assert sched.fairway_gate is None
    sched.add_request(offline.make_request("a", helpers.tokens(1, 40), 1.0, tenant="light",
                                           priority=-3))
    assert sched.requests["a"].sampling_params.extra_args == {"tenant": "light"}
    assert sched.requests["a"].priority == -3
    offline.run_until_idle(sched)
    assert _nonzero(sched.fairway_totals.tenant_prefill_tokens) == {"light": 40}
    capped = offline.make_offline_scheduler("fairway", fairway_options={"priority_floor": 0})
    assert capped.fairway_gate is not None
    capped.add_request(offline.make_request("a", helpers.tokens(1, 40), 1.0, priority=-3))
    assert capped.requests["a"].priority == 0


def test_enforced_trust_without_the_secret_stops_the_scheduler(offline, monkeypatch):
    from fairway.errors import FairwayConfigError

    monkeypatch.delenv(SEAL_ENV, raising=False)
    with pytest.raises(FairwayConfigError, match=SEAL_ENV):
        offline.make_offline_scheduler("fairway", fairway_options=ENFORCED)
