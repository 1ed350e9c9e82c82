"""`fairway.middleware.TenantMiddleware` as ASGI, without a server: what the app behind it
receives, and the server start's checks (`prepare_server`, `serve_flags`)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from fairway.errors import FairwayConfigError
from fairway.middleware import (
    MIDDLEWARE_NAME,
    TenantMiddleware,
    middleware_flags,
    prepare_server,
    serve_flags,
    server_options,
)
from fairway.options import FairwayOptions
from fairway.trust import (
    SEAL_ENV,
    SEAL_KEY,
    TRUSTED_FLOOR_KEY,
    TRUSTED_TENANT_KEY,
    TrustRule,
)

SECRET = "0123456789abcdef" * 4
KEYS = {"sk-light": "light", "sk-ops": {"tenant": "ops", "priority_floor": -5}}
ENV = {SEAL_ENV: SECRET, "KEYS": json.dumps(KEYS)}


class App:
    """The app behind the middleware: records the scope and the body it read."""

    def __init__(self) -> None:
        self.scope: dict[str, Any] | None = None
        self.body = b""
        self.after: dict[str, Any] | None = None

    async def __call__(self, scope, receive, send) -> None:
        self.scope = scope
        while True:
            message = await receive()
            if message["type"] != "http.request":
                self.after = message
                return
            self.body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.after = await receive()  # what comes next: the connection's own (a disconnect)


def middleware(source: str = "api-key", **options: Any) -> tuple[TenantMiddleware, App]:
    given = {"tenant_source": source, **options}
    if source == "api-key":
        given.setdefault("tenant_keys", "env:KEYS")
    app = App()
    return TenantMiddleware(app, options=FairwayOptions.resolve(given, {}), environ=ENV), app


def call(mw: TenantMiddleware, body: bytes | list[bytes], *, path: str = "/v1/completions",
         method: str = "POST", headers: dict[str, str] | None = None,
         disconnect: bool = False) -> None:
    chunks = [body] if isinstance(body, bytes) else body
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                for i, c in enumerate(chunks)]
    if disconnect:
        messages[-1]["more_body"] = True
        messages.append({"type": "http.disconnect"})
    messages.append({"type": "http.disconnect"})
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    raw.append((b"content-length", str(sum(map(len, chunks))).encode()))
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": raw}

    async def receive():
        return messages.pop(0)

    async def send(message):
        raise AssertionError("the app sends nothing here")

    asyncio.run(mw(scope, receive, send))


def body(xargs: dict | None = None, **fields: Any) -> bytes:
    data: dict[str, Any] = {"model": "m", "prompt": "hi", **fields}
    if xargs is not None:
        data["vllm_xargs"] = xargs
    return json.dumps(data).encode()


def received(app: App) -> dict[str, Any]:
    assert app.scope is not None
    length = dict(app.scope["headers"])[b"content-length"]
    assert int(length) == len(app.body)  # the header follows the rewritten body
    return json.loads(app.body)


def verdict(app: App, priority: int = 0):
    """What the scheduler makes of the request the app received."""
    return TrustRule.build("api-key", None, ENV).judge(received(app).get("vllm_xargs"), priority)


def test_a_known_key_gets_its_tenant_whatever_the_client_names() -> None:
    mw, app = middleware()
    call(mw, body({"tenant": "heavy", "session_id": "s"}),
         headers={"Authorization": "Bearer sk-light"})
    xargs = received(app)["vllm_xargs"]
    assert xargs[TRUSTED_TENANT_KEY] == "light" and xargs["session_id"] == "s"
    assert xargs["tenant"] == "heavy"  # left for the scheduler to count
    judged = verdict(app)
    assert (judged.tenant, judged.claimed) == ("light", "heavy")
    assert received(app)["prompt"] == "hi" and app.after == {"type": "http.disconnect"}


def test_a_key_with_a_floor_and_a_chat_request_without_xargs() -> None:
    mw, app = middleware()
    call(mw, body(messages=[]), path="/v1/chat/completions",
         headers={"authorization": "Bearer sk-ops"})
    xargs = received(app)["vllm_xargs"]
    assert (xargs[TRUSTED_TENANT_KEY], xargs[TRUSTED_FLOOR_KEY]) == ("ops", -5)
    assert verdict(app, -5).priority == -5


def test_an_unknown_key_or_none_gets_no_identity_and_loses_forged_keys() -> None:
    forged = {"tenant": "light", TRUSTED_TENANT_KEY: "light", SEAL_KEY: "x" * 64,
              TRUSTED_FLOOR_KEY: -9}
    for headers in ({"Authorization": "Bearer sk-nobody"}, {}, {"Authorization": "sk-light"}):
        mw, app = middleware()
        call(mw, body(forged), headers=headers)
        assert received(app)["vllm_xargs"] == {"tenant": "light"}, headers
        judged = verdict(app, -9)
        assert (judged.tenant, judged.claimed, judged.priority) == (None, "light", 0)


def test_an_escaped_reserved_key_is_found_too() -> None:
    mw, app = middleware()
    call(mw, b'{"prompt": "hi", "vllm_xargs": {"fairway\\u005fseal": "x"}}')
    assert received(app)["vllm_xargs"] == {}


def test_what_it_leaves_alone() -> None:
    plain = body({"tenant": "light"})
    for kwargs in ({"path": "/v1/models", "method": "GET"}, {"path": "/tokenize"},
                   {"path": "/v1/completions", "headers": {}}):
        mw, app = middleware()
        call(mw, plain, **kwargs)
        assert app.body == plain, kwargs  # byte for byte: no identity, nothing to delete
    for raw in (b"not json", b"[1, 2]", body(None, vllm_xargs="x")):
        mw, app = middleware()
        call(mw, raw, headers={"Authorization": "Bearer sk-light"})
        assert app.body == raw  # vLLM answers these itself


def test_a_body_in_chunks_and_a_client_that_leaves() -> None:
    mw, app = middleware()
    whole = body({"tenant": "x"})
    call(mw, [whole[:10], whole[10:30], whole[30:]], headers={"Authorization": "Bearer sk-light"})
    assert received(app)["vllm_xargs"][TRUSTED_TENANT_KEY] == "light"
    mw, app = middleware()
    call(mw, [whole[:10]], headers={"Authorization": "Bearer sk-light"}, disconnect=True)
    assert app.body == whole[:10] and app.after == {"type": "http.disconnect"}


def test_header_source() -> None:
    mw, app = middleware("header", tenant_header="X-Team")
    call(mw, body({"tenant": "ops"}), headers={"x-team": "light; priority_floor=-2",
                                               "Authorization": "Bearer sk-ops"})
    xargs = received(app)["vllm_xargs"]
    assert (xargs[TRUSTED_TENANT_KEY], xargs[TRUSTED_FLOOR_KEY]) == ("light", -2)
    mw, app = middleware("header")
    call(mw, body({"tenant": "ops"}), headers={"x-team": "light"})  # not the configured header
    assert received(app)["vllm_xargs"] == {"tenant": "ops"}
    mw, app = middleware("header")
    call(mw, body(), headers={"x-fairway-tenant": "light; weight=9"})  # malformed: nothing
    assert app.body == body()


def test_the_middleware_refuses_to_run_without_enforced_trust() -> None:
    for given in ({}, {"tenant_source": "client"}):
        with pytest.raises(FairwayConfigError, match="tenant_source is 'client'"):
            TenantMiddleware(App(), options=FairwayOptions.resolve(given, {}), environ=ENV)
    with pytest.raises(FairwayConfigError, match=SEAL_ENV):
        TenantMiddleware(App(), options=FairwayOptions.resolve({"tenant_source": "header"}, {}),
                         environ={})


SERVE = ["vllm", "serve", "m", "--scheduler-cls", "fairway.vllm.scheduler.FairwayScheduler"]


def _argv(section: dict, *extra: str) -> list[str]:
    return [*SERVE, "--additional-config", json.dumps({"fairway": section}), *extra]


def test_the_middleware_reads_the_servers_options_from_its_command_line() -> None:
    section = {"tenant_source": "api-key", "tenant_keys": "env:KEYS"}
    assert server_options(_argv(section), ENV).trust_source == "api-key"
    with pytest.raises(FairwayConfigError, match="cannot read Fairway's options"):
        server_options(["vllm", "serve", "m"], ENV)


def test_prepare_server_checks_and_draws_the_secret() -> None:
    section = {"tenant_source": "api-key", "tenant_keys": "env:KEYS", "tenants": ["light"]}
    options = FairwayOptions.resolve(section, {})
    env = {"KEYS": json.dumps(KEYS)}
    with pytest.raises(FairwayConfigError, match=f"add --middleware {MIDDLEWARE_NAME}"):
        prepare_server(options, _argv(section), env)
    argv = _argv(section, "--middleware", "other.Mw", f"--middleware={MIDDLEWARE_NAME}")
    assert middleware_flags(argv) == ["other.Mw", MIDDLEWARE_NAME]
    prepare_server(options, argv, env)
    assert len(env[SEAL_ENV]) == 64
    with pytest.raises(FairwayConfigError, match="not JSON"):
        prepare_server(options, argv, {"KEYS": "{"})
    with pytest.raises(FairwayConfigError, match="tenant_source is not set"):
        prepare_server(FairwayOptions.resolve({"tenants": ["a"]}, {}), SERVE, {})
    client: dict[str, str] = {}
    prepare_server(FairwayOptions.resolve({"tenants": ["a"], "tenant_source": "client"}, {}),
                   SERVE, client)
    assert SEAL_ENV not in client  # nothing to seal


def test_fairway_serve_adds_the_middleware_once() -> None:
    enforced = FairwayOptions.resolve({"tenant_source": "header"}, {})
    assert serve_flags([], enforced) == ["--middleware", MIDDLEWARE_NAME]
    assert serve_flags(["--middleware", MIDDLEWARE_NAME], enforced) == []
    assert serve_flags([], FairwayOptions.resolve(None, {})) == []


def test_fairway_serve_plans_the_middleware_and_refuses_tenants_without_a_source() -> None:
    from fairway import cli
    from fairway.cli.serve import plan_serve

    def plan(*argv: str):
        args = cli.build_parser().parse_args(["serve", "m", *argv])
        return plan_serve(args, environ={}, launcher=["VLLM"])

    argv = plan("--fairway-option", "tenants=[\"a\"]", "--fairway-option", "tenant_source=header",
                "--max-model-len", "64").argv
    assert argv.count("--middleware") == 1
    assert argv[argv.index("--middleware") + 1] == MIDDLEWARE_NAME
    assert json.loads(argv[argv.index("--additional-config") + 1])["fairway"][
        "tenant_source"] == "header"
    assert "--middleware" not in plan("--fairway-option", "tenant_source=client").argv
    with pytest.raises(FairwayConfigError, match="tenant_source is not set"):
        plan("--fairway-option", "tenants=[\"a\"]")
