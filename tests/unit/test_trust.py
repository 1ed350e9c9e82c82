"""The trust model (`fairway.trust`) and its options: seals, key maps, headers, the middleware's
edit of `vllm_xargs`, the scheduler's verdict, and the options' checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairway.errors import FairwayConfigError
from fairway.options import FairwayOptions
from fairway.trust import (
    SEAL_ENV,
    SEAL_KEY,
    TRUSTED_FLOOR_KEY,
    TRUSTED_TENANT_KEY,
    Identity,
    KeyMap,
    Sealer,
    TrustRule,
    bearer_key,
    ensure_seal_secret,
    parse_header,
    stamp,
)

SECRET = "0123456789abcdef" * 4
ENV = {SEAL_ENV: SECRET}


def sealed(tenant: str | None, floor: int | None = None, secret: str = SECRET) -> dict:
    return stamp(None, Identity(tenant, floor), Sealer(secret))


# --- the seal -----------------------------------------------------------------------------------


def test_a_valid_seal_is_remembered_an_invalid_one_never() -> None:
    sealer = Sealer(SECRET)
    seal = sealer.seal(Identity("team-a"))
    assert not sealer.verify(Identity("team-a"), seal[:-1] + ("1" if seal[-1] == "0" else "0"))
    assert not sealer._known
    assert sealer.verify(Identity("team-a"), seal) and sealer.verify(Identity("team-a"), seal)
    assert len(sealer._known) == 1
    assert not sealer.verify(Identity("team-b"), seal)  # remembered with its identity


def test_a_seal_verifies_its_identity_only() -> None:
    sealer = Sealer(SECRET)
    seal = sealer.seal(Identity("team-a", -2))
    assert sealer.verify(Identity("team-a", -2), seal)
    assert not sealer.verify(Identity("team-b", -2), seal)  # another tenant
    assert not sealer.verify(Identity("team-a", -9), seal)  # a lower floor
    assert not sealer.verify(Identity("team-a", None), seal)
    assert not Sealer("f" * 64).verify(Identity("team-a", -2), seal)  # another node's secret
    assert not sealer.verify(Identity("team-a", -2), 12345)  # not even a string
    # the fields cannot be shifted into each other
    assert sealer.seal(Identity("a", None)) != sealer.seal(Identity(None, None))


def test_the_secret_must_be_there_and_long_enough() -> None:
    with pytest.raises(FairwayConfigError, match=f"needs the secret {SEAL_ENV}"):
        Sealer.from_env({})
    with pytest.raises(FairwayConfigError, match="at least 32"):
        Sealer("short")
    env: dict[str, str] = {}
    assert ensure_seal_secret(env) and len(env[SEAL_ENV]) == 64
    drawn = env[SEAL_ENV]
    assert not ensure_seal_secret(env) and env[SEAL_ENV] == drawn  # kept once set
    assert ensure_seal_secret(other := {}) and other[SEAL_ENV] != drawn  # drawn at random


# --- sources of identity ------------------------------------------------------------------------


def test_key_map_from_a_file_and_from_the_environment(tmp_path: Path) -> None:
    entries = {"sk-a": "team-a", "sk-ops": {"tenant": "ops", "priority_floor": -5},
               "sk-urgent": {"priority_floor": -1}}
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(entries))
    for keys in (KeyMap.load(str(path)), KeyMap.load("env:KEYS", {"KEYS": json.dumps(entries)})):
        assert len(keys) == 3
        assert keys.identity_of("sk-a") == Identity("team-a")
        assert keys.identity_of("sk-ops") == Identity("ops", -5)
        assert keys.identity_of("sk-urgent") == Identity(None, -1)
        assert keys.identity_of("sk-b") is None
        assert keys.identity_of("sk-a ") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not JSON"),
        ("[]", "non-empty JSON object"),
        ("{}", "non-empty JSON object"),
        ('{"sk-a": 3}', "is not an identity"),
        ('{"sk-a": ""}', "is not an identity"),
        ('{"sk-a": {"tenant": "a", "weight": 2}}', "is not an identity"),
        ('{"sk-a": {"priority_floor": 1.5}}', "is not an identity"),
        ('{"sk-a": {"priority_floor": true}}', "is not an identity"),
        ('{"": "a"}', "an API key is empty"),
    ],
)
def test_bad_key_maps_name_the_option_and_hide_the_key(text: str, message: str) -> None:
    with pytest.raises(FairwayConfigError, match="option tenant_keys") as info:
        KeyMap.load("env:KEYS", {"KEYS": text})
    assert message in str(info.value)
    assert "sk-a\"" not in str(info.value) and "'sk-a'" not in str(info.value)


def test_key_map_that_cannot_be_read() -> None:
    with pytest.raises(FairwayConfigError, match="cannot read the file"):
        KeyMap.load("/nonexistent/keys.json")
    with pytest.raises(FairwayConfigError, match="variable is not set"):
        KeyMap.load("env:KEYS", {})


def test_bearer_keys_and_gateway_headers() -> None:
    assert bearer_key("Bearer sk-a") == "sk-a"
    assert bearer_key("bearer  sk-a ") == "sk-a"
    assert bearer_key("Basic sk-a") is None
    assert bearer_key("Bearer") is None
    assert bearer_key(None) is None
    assert parse_header("team-a") == Identity("team-a")
    assert parse_header(" team-a ; priority_floor=-3") == Identity("team-a", -3)
    assert parse_header("; priority_floor=2") == Identity(None, 2)
    assert parse_header("") == Identity(None)
    assert parse_header(None) is None
    assert parse_header("team-a; weight=3") is None  # malformed: no trusted identity
    assert parse_header("team-a; priority_floor=high") is None


# --- the middleware's edit ----------------------------------------------------------------------


def test_stamp_deletes_what_the_client_wrote_and_seals_the_identity() -> None:
    sealer = Sealer(SECRET)
    client = {"tenant": "team-b", "session_id": "s1", TRUSTED_TENANT_KEY: "team-b",
              TRUSTED_FLOOR_KEY: -100, SEAL_KEY: "forged"}
    out = stamp(client, None, sealer)
    assert out == {"tenant": "team-b", "session_id": "s1"}  # the claim stays, to be counted
    out = stamp(client, Identity("team-a", -2), sealer)
    assert out[TRUSTED_TENANT_KEY] == "team-a" and out[TRUSTED_FLOOR_KEY] == -2
    assert sealer.verify(Identity("team-a", -2), out[SEAL_KEY])
    assert out["tenant"] == "team-b" and out["session_id"] == "s1"
    assert TRUSTED_FLOOR_KEY not in stamp(None, Identity("team-a"), sealer)
    assert stamp(None, None, sealer) == {}


# --- the scheduler's verdict --------------------------------------------------------------------


def test_client_source_trusts_the_client_and_caps_only_with_a_floor() -> None:
    rule = TrustRule.build("client", None, {})
    assert not rule.acts and not rule.enforced
    verdict = rule.judge({"tenant": "team-a"}, -50)
    assert (verdict.tenant, verdict.claimed, verdict.priority, verdict.raised) == (
        "team-a", None, -50, False)
    capped = TrustRule.build("client", -1, {})
    assert capped.acts and not capped.enforced
    verdict = capped.judge({"tenant": "team-a"}, -50)
    assert (verdict.tenant, verdict.priority, verdict.raised) == ("team-a", -1, True)
    assert not capped.judge(None, 3).raised  # less urgency is always allowed


@pytest.mark.parametrize("source", ["api-key", "header"])
def test_enforced_sources_believe_only_sealed_identities(source: str) -> None:
    rule = TrustRule.build(source, None, ENV)
    assert rule.enforced and rule.floor == 0
    # a client naming a tenant: the default tenant, the claim reported, priority floored at 0
    verdict = rule.judge({"tenant": "team-a"}, -5)
    assert (verdict.tenant, verdict.claimed, verdict.priority, verdict.raised) == (
        None, "team-a", 0, True)
    # the middleware's identity
    verdict = rule.judge(sealed("team-a"), 0)
    assert (verdict.tenant, verdict.claimed, verdict.raised) == ("team-a", None, False)
    # the same identity, and the client naming it too: nothing ignored
    assert rule.judge({**sealed("team-a"), "tenant": "team-a"}, 0).claimed is None
    # the identity, and the client naming another tenant: the identity, the claim reported
    verdict = rule.judge({**sealed("team-a"), "tenant": "team-b"}, 0)
    assert (verdict.tenant, verdict.claimed) == ("team-a", "team-b")
    # forgeries: the client writes the keys itself, with a made-up or another node's seal
    for forged in ({TRUSTED_TENANT_KEY: "team-a", SEAL_KEY: "0" * 64},
                   sealed("team-a", secret="e" * 64),
                   {**sealed("team-b"), TRUSTED_TENANT_KEY: "team-a"},
                   {**sealed("team-a"), TRUSTED_FLOOR_KEY: -100},
                   {**sealed("team-a"), TRUSTED_TENANT_KEY: 7},
                   {**sealed("team-a"), TRUSTED_FLOOR_KEY: [1]}):
        verdict = rule.judge(forged, -100)
        assert verdict.tenant is None and verdict.priority == 0, forged
    # a sealed floor replaces the node's
    assert rule.judge(sealed("ops", -5), -5).priority == -5
    verdict = rule.judge(sealed("ops", -5), -9)
    assert (verdict.priority, verdict.raised) == (-5, True)
    assert rule.judge(sealed(None, 2), 1).priority == 2  # a floor above the default, too
    assert rule.judge(None, 0) == rule.judge({}, 0)
    assert rule.judge({"tenant": ""}, 0).claimed is None  # an empty name claims nothing


def test_an_explicit_floor_holds_under_enforced_trust() -> None:
    rule = TrustRule.build("api-key", 5, ENV)
    assert rule.judge(None, 0).priority == 5
    assert rule.judge(sealed("a", -1), -1).priority == -1


def test_enforced_trust_without_the_secret_refuses() -> None:
    with pytest.raises(FairwayConfigError, match=SEAL_ENV):
        TrustRule.build("header", None, {})


# --- the options ------------------------------------------------------------------------------


def test_trust_options_resolve_from_json_and_environment() -> None:
    options = FairwayOptions.resolve(
        {"tenant_source": "api-key", "tenant_keys": "env:KEYS", "priority_floor": -2},
        {"FAIRWAY_TENANT_HEADER": "x-team", SEAL_ENV: SECRET},  # the secret is no option
    )
    assert (options.trust_source, options.tenant_keys, options.priority_floor) == (
        "api-key", "env:KEYS", -2)
    assert options.tenant_header == "x-team"
    described = options.describe()
    assert described["tenant_source"] == "api-key" and described["priority_floor"] == -2
    assert SECRET not in json.dumps(described)
    plain = FairwayOptions.resolve(None, {})
    assert plain.trust_source == "client" and plain.tenant_source is None
    assert "tenant_source" not in plain.describe()  # result files stay as they were


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"tenant_source": "anyone"}, "tenant_source='anyone'"),
        ({"tenant_source": "api-key"}, "needs tenant_keys"),
        ({"tenant_keys": "keys.json"}, "read only under tenant_source api-key"),
        ({"tenant_source": "header", "tenant_keys": "k.json"}, "read only under tenant_source"),
        ({"tenant_header": "x tenant"}, "tenant_header='x tenant'"),
        ({"tenant_header": ""}, "tenant_header=''"),
        ({"priority_floor": 1.5}, "priority_floor=1.5"),
        ({"priority_floor": "-1"}, "priority_floor='-1'"),
        ({"tenant_keys": ""}, "tenant_keys=''"),
    ],
)
def test_bad_trust_options_name_the_key_and_what_is_allowed(given: dict, message: str) -> None:
    with pytest.raises(FairwayConfigError) as info:
        FairwayOptions.resolve(given, {})
    assert message in str(info.value)
    assert "--additional-config fairway." in str(info.value)


def test_a_server_listing_tenants_must_say_whom_it_trusts() -> None:
    options = FairwayOptions.resolve({"tenants": ["a", "b"]}, {})
    with pytest.raises(FairwayConfigError, match="tenant_source is not set") as info:
        options.check_server()
    for choice in ("api-key", "header", "client"):
        assert choice in str(info.value)
    FairwayOptions.resolve({"tenants": ["a"], "tenant_source": "client"}, {}).check_server()
    FairwayOptions.resolve(None, {}).check_server()  # no tenants: nothing to trust
    # in-process (a replay) the null default trusts the trace's tenants
    assert FairwayOptions.for_replay("fairway", serving={"tenants": ["a"]}).trust_source == (
        "client")
