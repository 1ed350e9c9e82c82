"""The one HTTP client of an OpenAI-compatible server (aiohttp) and its one SSE reader.

Used by the live replay (`fairway.replay.live`), the profiler (`fairway.profiling.profiler`), the
server supervisor's health check (`fairway.supervisor`) and `fairway inspect`'s /metrics reads.
aiohttp because the live replay is open-loop async (thousands of requests in flight) and vLLM's
own benchmark client uses it too.
The functions take a session so that a caller keeps one connection pool for a whole run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

import aiohttp

from fairway.tenants import TENANT_KEY

#: Error bodies and stream excerpts are cut to this many characters in messages.
MAX_ERROR_CHARS = 200
#: Headers of a POST with a JSON body.
JSON_HEADERS = {"Content-Type": "application/json"}


class StreamError(Exception):
    """The server answered 200 but its SSE stream cannot be measured; the message says why."""


class HTTPStatusError(Exception):
    """A non-200 answer; `status` and the (shortened) `body` are kept for the caller's message."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


def base_url(url: str) -> str:
    """`http://host:port` from a URL given with or without a trailing `/` or `/v1`."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def short(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """`text` on one line, cut to `limit` characters (for error messages)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(exc: BaseException) -> str:
    """An exception as `Type: message` (or just `Type`), shortened."""
    return short(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


#: Seconds an idle connection is kept for reuse (below vLLM's server-side 5 s; see new_session).
KEEPALIVE_S = 2.0


def new_session() -> aiohttp.ClientSession:
    """A session for measuring; create it inside the running event loop.

    No pool cap (`limit=0`): queued sends would silently add pool wait to a measured TTFT. No
    total timeout: callers bound each request with `asyncio.timeout`. aiohttp ignores proxy
    variables by default (`trust_env=False`), so a proxy cannot add its latency to samples.

    Idle connections are reused for at most `KEEPALIVE_S`, below the 5 s after which vLLM's
    server closes them (VLLM_HTTP_TIMEOUT_KEEP_ALIVE): a POST sent on a connection the server is
    closing fails ("Cannot write to closing transport"), which is how `vllm bench serve`, whose
    client keeps idle connections for 60 s, loses requests after a pause in a trace.
    """
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=KEEPALIVE_S)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


def completion_body(
    model: str,
    prompt: Sequence[int],
    max_tokens: int,
    *,
    stream: bool = True,
    include_usage: bool = False,
    priority: int = 0,
    tenant: str | None = None,
) -> bytes:
    """The JSON body of a greedy token-id `/v1/completions` request.

    `include_usage`: the last streamed chunk then carries usage, where vLLM reports the
    prefix-cache hit (`cached_tokens`). `priority`: vLLM's per-request ``priority`` field, sent
    when not 0 (a vLLM server refuses it unless it runs ``--scheduling-policy priority``).
    `tenant`: sent as ``{"vllm_xargs": {"tenant": tenant}}`` when given (`fairway.tenants`).
    """
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": stream,
    }
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    if priority != 0:
        body["priority"] = priority
    if tenant is not None:
        body["vllm_xargs"] = {TENANT_KEY: tenant}
    return json.dumps(body, separators=(",", ":")).encode()


async def get_json(session: aiohttp.ClientSession, endpoint: str, timeout_s: float) -> Any:
    """GET `endpoint` and parse its JSON body.

    Raises:
        HTTPStatusError: a non-200 answer.
        aiohttp.ClientError, TimeoutError: unreachable or too slow.
        ValueError: the body is not JSON.
    """
    async with asyncio.timeout(timeout_s), session.get(endpoint) as resp:
        if resp.status != 200:
            raise HTTPStatusError(resp.status, short(await resp.text(errors="replace")))
        return await resp.json(content_type=None)


async def get_text(session: aiohttp.ClientSession, endpoint: str, timeout_s: float) -> str:
    """GET `endpoint` and return its body as text.

    Raises:
        HTTPStatusError: a non-200 answer.
        aiohttp.ClientError, TimeoutError: unreachable or too slow.
    """
    async with asyncio.timeout(timeout_s), session.get(endpoint) as resp:
        body = await resp.text(errors="replace")
        if resp.status != 200:
            raise HTTPStatusError(resp.status, short(body))
        return body


def fetch_text(endpoint: str, timeout_s: float) -> str:
    """`get_text` from synchronous code, with a session of its own (a poll every few seconds).

    Raises:
        As `get_text`.
    """

    async def once() -> str:
        async with new_session() as session:
            return await get_text(session, endpoint, timeout_s)

    return asyncio.run(once())


async def is_healthy(session: aiohttp.ClientSession, url: str, timeout_s: float = 5.0) -> bool:
    """Whether `GET /health` answers 200 now (vLLM: the engine is up); never raises."""
    try:
        async with asyncio.timeout(timeout_s), session.get(f"{base_url(url)}/health") as resp:
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False


async def stream_chunks(
    resp: aiohttp.ClientResponse, clock: Callable[[], float]
) -> AsyncGenerator[tuple[dict[str, Any], float], None]:
    """The JSON chunks of an SSE completion stream, each with `clock()` when its line arrived.

    Reads `data:` lines up to `data: [DONE]` (blank separators, comments and event:/id:/retry:
    fields are skipped). The time is taken before parsing: parse time is not the server's
    latency.

    Raises:
        StreamError: a chunk is not a JSON object or carries an error, a line is beyond
            aiohttp's buffer, or the stream ends without [DONE].
    """
    seen = False
    try:
        async for raw in resp.content:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                return
            now = clock()
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError:
                raise StreamError(f"malformed stream: chunk is not JSON: {short(data)}") from None
            if not isinstance(chunk, dict):
                raise StreamError(f"malformed stream: chunk is not an object: {short(data)}")
            if "error" in chunk:
                raise StreamError(f"error in stream: {short(json.dumps(chunk['error']))}")
            seen = True
            yield chunk, now
    except ValueError as exc:  # aiohttp: a line beyond its buffer limit
        raise StreamError(f"malformed stream: {exc}") from exc
    what = "no [DONE]" if seen else "no data chunk"
    raise StreamError(f"malformed stream: ended with {what} (content-type {resp.content_type})")


def cached_tokens(chunk: dict[str, Any]) -> int | None:
    """The prefix-cache hit a usage chunk reports (`usage.prompt_tokens_details`); else None."""
    usage = chunk.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) else None
