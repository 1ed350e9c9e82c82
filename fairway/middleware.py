"""`TenantMiddleware`: the ASGI middleware that tells Fairway's scheduler who a caller is.

Load it with vLLM's own flag: `vllm serve ... --middleware fairway.middleware.TenantMiddleware`
(`fairway serve` adds the flag when option `tenant_source` is `api-key` or `header`). The trust
model, and why the identity it writes cannot be forged, is `fairway.trust`'s docstring; this
module is the API-server half: for every POST to a generation endpoint it finds the caller's
identity (the API key's entry in `tenant_keys`, or the gateway's header) and rewrites the JSON
body's `vllm_xargs`: the keys only it may write are deleted from what the client sent, and the
identity is written under them with its seal (`fairway.trust.stamp`). vLLM copies `vllm_xargs`
into `SamplingParams.extra_args`, where the scheduler checks the seal.

vLLM adds each `--middleware` class with Starlette's `app.add_middleware(cls)`, which builds it
with the app alone, so the middleware reads Fairway's options itself, from the server's command
line and environment (`fairway.vllm_argv.options_from_vllm_argv`, the plugin's early check). A
middleware that cannot find options that enforce trust refuses to start: loaded, it must be
doing its job.

Pure ASGI (no Starlette import): it runs outside vLLM's own middleware (vLLM adds
`--middleware` classes last), so before `--api-key`'s check, which still rejects a wrong key. Must
not import vllm.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

from fairway.errors import FairwayConfigError
from fairway.options import FairwayOptions
from fairway.trust import (
    ENFORCED_SOURCES,
    Identity,
    KeyMap,
    Sealer,
    bearer_key,
    ensure_seal_secret,
    parse_header,
    stamp,
)

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The endpoints whose JSON body carries `vllm_xargs` (completions, chat, responses, vLLM's
#: Anthropic messages). Any other way into the engine carries no seal: its requests get the
#: default tenant and the floor.
GENERATION_PATHS = frozenset(
    {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"}
)
#: The dotted name to give `--middleware`.
MIDDLEWARE_NAME = "fairway.middleware.TenantMiddleware"


class TenantMiddleware:
    """Writes the caller's sealed identity into the body of every generation request.

    Args:
        app: the ASGI app it wraps (vLLM's).
        options: Fairway's options (default: the server's, from `sys.argv` and the environment).
        environ: where the seal's secret and an `env:` key map are read (default: os.environ).
    """

    def __init__(
        self, app: ASGIApp, *, options: FairwayOptions | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.app = app
        environ = os.environ if environ is None else environ
        if options is None:
            options = server_options(sys.argv, environ)
        source = options.trust_source
        if source not in ENFORCED_SOURCES:
            raise FairwayConfigError(
                f"{MIDDLEWARE_NAME} is loaded but Fairway option tenant_source is {source!r}: "
                "the middleware gives tenants only under api-key or header (drop the "
                "--middleware flag, or set tenant_source)"
            )
        self.source = source
        self.sealer = Sealer.from_env(environ)
        self.keys: KeyMap | None = None
        #: The header's name as ASGI gives it (lower case, bytes).
        self.header = options.tenant_header.lower().encode("latin-1")
        if source == "api-key":
            assert options.tenant_keys is not None  # the options' own check
            self.keys = KeyMap.load(options.tenant_keys, environ)
        logger.info(
            "Fairway: %s gives tenants from %s; a tenant a client names in vllm_xargs is "
            "ignored.", MIDDLEWARE_NAME,
            f"{len(self.keys)} API keys" if self.keys is not None else
            f"header {options.tenant_header}",
        )

    def identify(self, headers: Sequence[tuple[bytes, bytes]]) -> Identity | None:
        """The caller's identity from the request's headers (None: no trusted identity)."""
        wanted = b"authorization" if self.keys is not None else self.header
        value = next((v.decode("latin-1") for k, v in headers if k == wanted), None)
        if self.keys is None:
            return parse_header(value)
        key = bearer_key(value)
        return self.keys.identity_of(key) if key is not None else None

    def rewrite(self, body: bytes, identity: Identity | None) -> bytes:
        """The body with its `vllm_xargs` stamped (`fairway.trust.stamp`); `body` itself when
        there is nothing to change or it is not a JSON object (vLLM answers that one)."""
        # no identity to write and no reserved key to delete: a reserved key holds "fairway",
        # written out or with a \\u escape
        if identity is None and b"fairway" not in body and b"\\u" not in body:
            return body
        try:
            data = json.loads(body)
        except ValueError:
            return body
        if not isinstance(data, dict):
            return body
        xargs = data.get("vllm_xargs")
        if xargs is not None and not isinstance(xargs, dict):
            return body  # vLLM rejects it
        stamped = stamp(xargs, identity, self.sealer)
        if stamped == (xargs if xargs is not None else {}):
            return body
        data["vllm_xargs"] = stamped
        return json.dumps(data, separators=(",", ":")).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or not _generation(scope):
            await self.app(scope, receive, send)
            return
        messages, complete = await _read_body(receive)
        if not complete:  # the client left while sending: vLLM sees what it sent
            await self.app(scope, _replay(messages, receive), send)
            return
        body = b"".join(m.get("body", b"") for m in messages)
        headers = scope.get("headers", [])
        new = self.rewrite(body, self.identify(headers))
        if new is body:
            await self.app(scope, _replay(messages, receive), send)
            return
        scope = dict(scope)
        scope["headers"] = [(k, v) for k, v in headers if k != b"content-length"] + [
            (b"content-length", str(len(new)).encode())
        ]
        message = {"type": "http.request", "body": new, "more_body": False}
        await self.app(scope, _replay([message], receive), send)


def _generation(scope: Scope) -> bool:
    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", ""))
    return path.removeprefix(root) in GENERATION_PATHS


async def _read_body(receive: Receive) -> tuple[list[Message], bool]:
    """The request's body messages, and whether the body is complete (no disconnect first)."""
    messages: list[Message] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, False
        if not message.get("more_body", False):
            return messages, True


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A `receive` that gives `messages` first, then the connection's own (disconnects)."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def server_options(argv: Sequence[str], environ: Mapping[str, str]) -> FairwayOptions:
    """Fairway's options on this `vllm serve` command line and environment (raises if the line
    names no Fairway scheduler: the middleware would not know which options the engine runs)."""
    from fairway.vllm_argv import options_from_vllm_argv

    options = options_from_vllm_argv(list(argv), environ)
    if options is None:
        raise FairwayConfigError(
            f"{MIDDLEWARE_NAME}: cannot read Fairway's options from the command line (it names "
            "no Fairway --scheduler-cls, or its --additional-config is not one JSON object); "
            "give the options as --additional-config '{\"fairway\": {...}}' or FAIRWAY_* "
            "variables"
        )
    return options


# --- the server's start: checks and set-up before vLLM starts its engines ----------------------


def middleware_flags(argv: Sequence[str]) -> list[str]:
    """The values of every `--middleware` on a vLLM command line (vLLM appends them)."""
    found = []
    for i, arg in enumerate(argv):
        key, sep, value = arg.partition("=")
        if key == "--middleware":
            found.append(value if sep else (argv[i + 1] if i + 1 < len(argv) else ""))
    return found


def serve_flags(argv: Sequence[str], options: FairwayOptions) -> list[str]:
    """What `fairway serve` adds to the vLLM command: the middleware, when the options enforce
    trust and the command does not load it yet."""
    if options.trust_source in ENFORCED_SOURCES and MIDDLEWARE_NAME not in middleware_flags(argv):
        return ["--middleware", MIDDLEWARE_NAME]
    return []


def prepare_server(
    options: FairwayOptions, argv: Sequence[str], environ: MutableMapping[str, str]
) -> None:
    """A server's trust set-up, in vLLM's API-server process before the engines start (the
    plugin's early check): the options' server checks; under api-key or header, the middleware
    on the command line, the key map readable, and the seal's secret in `environ` (drawn if
    unset; the engine processes inherit it).

    Raises:
        FairwayConfigError: what is missing, and how to give it.
    """
    options.check_server()
    if options.trust_source not in ENFORCED_SOURCES:
        return
    if MIDDLEWARE_NAME not in middleware_flags(argv):
        raise FairwayConfigError(
            f"Fairway option tenant_source={options.trust_source!r} needs Fairway's middleware: "
            f"add --middleware {MIDDLEWARE_NAME} (fairway serve adds it); without it no "
            "request would carry a trusted tenant"
        )
    if options.tenant_keys is not None:
        KeyMap.load(options.tenant_keys, environ)
    ensure_seal_secret(environ)
