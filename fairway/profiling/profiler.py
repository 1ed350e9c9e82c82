"""Measure T(L), the idle prefill time of an L-token prompt, on a live OpenAI-compatible server.

Talks HTTP only (must not import vllm): the server may be any vLLM-compatible endpoint, local or
remote. One request at a time on an otherwise idle server, token-id prompts on `/v1/completions`
with `max_tokens=1`, timed by the client from send to the first response token; the result is a
`ProfileRun` of raw samples. `fairway.profiling.measured_profile` turns it into the
`fairway.profiling.table.PrefillProfile` table plus a least-squares curve T(L) = a + b*L + c*L^2,
and `fairway.profiling.profile_report` shows it. HTTP goes through `fairway.client` (aiohttp).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fairway import client
from fairway.errors import FairwayError

if TYPE_CHECKING:
    import aiohttp

logger = logging.getLogger(__name__)

#: First length of the default doubling ladder (tokens).
LADDER_START = 128
DEFAULT_REPEATS = 5
DEFAULT_WARMUP_ROUNDS = 1
#: Token ids are drawn from [FIRST_TOKEN_ID, vocab_size): any model has at least 512 tokens, and
#: prefill cost does not depend on which ids a prompt holds. 0-2 are Llama-style specials.
DEFAULT_VOCAB_SIZE = 512
FIRST_TOKEN_ID = 3
#: Leading tokens that encode a per-request counter, so no two prompts share a first block
#: (whatever the server's block size) and nothing can hit the prefix cache.
_UNIQUE_TOKENS = 4
#: One long prefill on a slow device can take minutes; an answer never comes faster than this.
DEFAULT_TIMEOUT_S = 600.0
_INFO_TIMEOUT_S = 30.0
_MAX_ERROR_CHARS = 300


class ProfilerError(FairwayError):
    """The server cannot be profiled (unreachable, errors, lengths too long); names the URL."""


@dataclass(frozen=True)
class ProfileSettings:
    """How to measure.

    Attributes:
        lengths: prompt lengths in tokens; None: the doubling ladder from 128 up to the server's
            max model length (`default_lengths`).
        repeats: measured requests per length; the table keeps their median.
        warmup_rounds: unrecorded passes over every length before measuring (compilation, caches).
        vocab_size: token ids are drawn below this (must not exceed the model's vocabulary).
        seed: seed of the random prompts.
        timeout_s: limit for one request.
        stream: stream the answer (time to the first chunk) or not (time to the whole answer,
            the same thing with max_tokens=1 up to the last bytes).
        model: served model name to request; None: the first one `/v1/models` lists.
    """

    lengths: tuple[int, ...] | None = None
    repeats: int = DEFAULT_REPEATS
    warmup_rounds: int = DEFAULT_WARMUP_ROUNDS
    vocab_size: int = DEFAULT_VOCAB_SIZE
    seed: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    stream: bool = True
    model: str | None = None

    def __post_init__(self) -> None:
        if self.lengths is not None:
            if not self.lengths or any(
                isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.lengths
            ):
                raise ProfilerError(f"lengths must be positive integers, got {self.lengths!r}")
            object.__setattr__(self, "lengths", tuple(sorted(set(self.lengths))))
        if self.repeats < 1:
            raise ProfilerError(f"repeats must be >= 1, got {self.repeats}")
        if self.warmup_rounds < 0:
            raise ProfilerError(f"warm-up rounds must be >= 0, got {self.warmup_rounds}")
        if self.vocab_size <= FIRST_TOKEN_ID + 1:
            raise ProfilerError(f"vocab_size must be > {FIRST_TOKEN_ID + 1}, got {self.vocab_size}")
        if not self.timeout_s > 0:
            raise ProfilerError(f"timeout_s must be > 0, got {self.timeout_s}")


@dataclass(frozen=True)
class ServerInfo:
    """What the server says about itself.

    Attributes:
        url: base URL (`http://host:port`).
        model: the served model name requests use.
        max_model_len: `max_model_len` from `/v1/models` (vLLM lists it); None if not listed.
        vllm_version: `version` from `/version`; None if the endpoint is missing.
    """

    url: str
    model: str
    max_model_len: int | None
    vllm_version: str | None


@dataclass(frozen=True)
class LengthSamples:
    """The measured seconds of one prompt length (warm-up excluded)."""

    prompt_tokens: int
    seconds: tuple[float, ...]

    @property
    def median_s(self) -> float:
        """The value the table keeps."""
        return float(statistics.median(self.seconds))


@dataclass(frozen=True)
class ProfileRun:
    """The raw outcome of `measure`.

    Attributes:
        server: the server measured.
        settings: how (with `lengths` resolved).
        overhead: samples of a 1-token prompt (the round trip without prefill work).
        samples: one entry per length, ascending.
        date: UTC start time, ISO 8601.
        wall_s: duration of the whole measurement.
    """

    server: ServerInfo
    settings: ProfileSettings
    overhead: LengthSamples
    samples: tuple[LengthSamples, ...]
    date: str
    wall_s: float

    def medians(self) -> list[tuple[int, float]]:
        """(prompt_tokens, median seconds) per length, ascending."""
        return [(s.prompt_tokens, s.median_s) for s in self.samples]


# --- lengths ------------------------------------------------------------------------------------


def default_lengths(max_model_len: int, start: int = LADDER_START) -> list[int]:
    """Doubling ladder start, 2*start, ... up to the longest prompt the server accepts.

    The longest prompt is `max_model_len - 1` (vLLM needs room for the one generated token); it is
    added as the last point when the ladder does not end on it, so the table covers every length
    the server can be sent and `PrefillProfile` never extrapolates.
    """
    longest = max_model_len - 1
    if longest < 1:
        raise ProfilerError(f"max_model_len {max_model_len} leaves no room for a prompt")
    lengths: list[int] = []
    n = min(start, longest)
    while n <= longest:
        lengths.append(n)
        n *= 2
    if lengths[-1] != longest:
        lengths.append(longest)
    return lengths


def resolve_lengths(requested: Sequence[int] | None, server: ServerInfo) -> list[int]:
    """The lengths to measure; rejects lengths the server cannot take.

    Raises:
        ProfilerError: a length above `max_model_len - 1`, or no lengths and no max_model_len.
    """
    if requested is None:
        if server.max_model_len is None:
            raise ProfilerError(
                f"{server.url}/v1/models does not list max_model_len for model "
                f"{server.model!r}; pass the lengths to measure with --lengths"
            )
        return default_lengths(server.max_model_len)
    lengths = sorted(set(requested))
    if server.max_model_len is not None:
        longest = server.max_model_len - 1
        too_long = [n for n in lengths if n > longest]
        if too_long:
            raise ProfilerError(
                f"requested prompt length(s) {', '.join(map(str, too_long))} exceed what the "
                f"server at {server.url} accepts: its max model length is "
                f"{server.max_model_len} tokens, so a prompt may have at most {longest} tokens "
                "(one token is generated); lower --lengths or restart the server with a larger "
                "--max-model-len"
            )
    return lengths


# --- prompts ------------------------------------------------------------------------------------


class PromptMaker:
    """Random token-id prompts that cannot share a cached block with any other prompt.

    The first `_UNIQUE_TOKENS` ids encode a per-run random offset plus a counter (base
    `vocab_size - FIRST_TOKEN_ID`), so every prompt of a run has its own first block whatever the
    server's block size; the rest is uniform random. Prefix caching therefore never hits, and
    each measurement is a full prefill.
    """

    def __init__(self, vocab_size: int, seed: int) -> None:
        self._rng = random.Random(seed)
        self._base = vocab_size - FIRST_TOKEN_ID
        # A random start: two runs against the same server (same cache) do not collide either.
        self._counter = random.SystemRandom().randrange(self._base**_UNIQUE_TOKENS // 2)

    def make(self, num_tokens: int) -> list[int]:
        """A fresh prompt of `num_tokens` ids."""
        self._counter += 1
        head: list[int] = []
        value = self._counter
        for _ in range(min(_UNIQUE_TOKENS, num_tokens)):
            value, digit = divmod(value, self._base)
            head.append(FIRST_TOKEN_ID + digit)
        rest = num_tokens - len(head)
        randrange = self._rng.randrange
        return head + [FIRST_TOKEN_ID + randrange(self._base) for _ in range(rest)]


# --- HTTP ---------------------------------------------------------------------------------------


def _short(text: str) -> str:
    return client.short(text, _MAX_ERROR_CHARS)


def _unreachable(endpoint: str, exc: BaseException) -> ProfilerError:
    return ProfilerError(
        f"cannot reach the server at {endpoint}: {client.describe(exc)}; start it or check --url"
    )


async def fetch_server_info(
    session: aiohttp.ClientSession, url: str, model: str | None = None
) -> ServerInfo:
    """The served model, its max length (`/v1/models`) and the vLLM version (`/version`).

    Raises:
        ProfilerError: unreachable, an HTTP error, no models, or `model` not served.
    """
    import aiohttp

    url = client.base_url(url)
    endpoint = f"{url}/v1/models"
    try:
        data = await client.get_json(session, endpoint, _INFO_TIMEOUT_S)
    except client.HTTPStatusError as exc:
        raise ProfilerError(
            f"GET {endpoint} answered HTTP {exc.status}: {exc.body}; is this an "
            "OpenAI-compatible server?"
        ) from None
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise _unreachable(endpoint, exc) from None
    except ValueError:
        data = None
    listed = data.get("data") if isinstance(data, dict) else None
    if not isinstance(listed, list) or not listed or not isinstance(listed[0], dict):
        raise ProfilerError(f"GET {endpoint} listed no model: {_short(str(data))}")
    cards = {str(card.get("id")): card for card in listed if isinstance(card, dict)}
    if model is None:
        card = listed[0]
    elif model in cards:
        card = cards[model]
    else:
        raise ProfilerError(
            f"the server at {url} does not serve model {model!r}; it serves: "
            f"{', '.join(sorted(cards))}"
        )
    max_len = card.get("max_model_len")
    max_len = max_len if isinstance(max_len, int) and not isinstance(max_len, bool) else None
    return ServerInfo(url, str(card.get("id")), max_len, await _fetch_version(session, url))


async def _fetch_version(session: aiohttp.ClientSession, url: str) -> str | None:
    import aiohttp

    try:
        data = await client.get_json(session, f"{url}/version", _INFO_TIMEOUT_S)
    except (client.HTTPStatusError, aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return None
    version = data.get("version") if isinstance(data, dict) else None
    return str(version) if version is not None else None


async def time_completion(
    session: aiohttp.ClientSession,
    server: ServerInfo,
    prompt: list[int],
    *,
    stream: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> float:
    """Seconds from sending one `max_tokens=1` completion to its first token.

    Raises:
        ProfilerError: unreachable, timeout, an HTTP error or an answer without a token.
    """
    import aiohttp

    endpoint = f"{server.url}/v1/completions"
    body = client.completion_body(server.model, prompt, 1, stream=stream)
    what = f"a {len(prompt)}-token prompt"
    try:
        async with asyncio.timeout(timeout_s):
            start = time.perf_counter()
            async with session.post(endpoint, data=body, headers=client.JSON_HEADERS) as resp:
                if resp.status != 200:
                    text = await resp.text(errors="replace")
                    raise ProfilerError(
                        f"POST {endpoint} answered HTTP {resp.status} for {what}: "
                        f"{_short(text)}" + _error_hint(text)
                    )
                if stream:
                    return await _first_chunk_s(resp, start, endpoint, what)
                text = await resp.text(errors="replace")
                elapsed = time.perf_counter() - start
                _check_choice(_parse(text, endpoint, what), text, endpoint, what)
                return elapsed
    except TimeoutError:
        raise ProfilerError(
            f"POST {endpoint}: no answer within {timeout_s:g} s for {what}; raise --timeout or "
            "check that the server is idle"
        ) from None
    except client.StreamError as exc:
        raise ProfilerError(f"POST {endpoint}: {exc} (for {what})") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise _unreachable(endpoint, exc) from None


def _error_hint(text: str) -> str:
    if "out of vocabulary" in text:
        return "; lower --vocab-size to the model's vocabulary size"
    return ""


async def _first_chunk_s(
    resp: aiohttp.ClientResponse, start: float, endpoint: str, what: str
) -> float:
    """Read the SSE stream to its end; the time of the first chunk (which must hold a token)."""
    first: float | None = None
    async with contextlib.aclosing(client.stream_chunks(resp, time.perf_counter)) as chunks:
        async for chunk, now in chunks:
            if first is None:
                _check_choice(chunk, str(chunk), endpoint, what)
                first = now
    assert first is not None  # stream_chunks raises on a stream without a chunk
    return first - start


def _parse(text: str, endpoint: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise ProfilerError(
            f"POST {endpoint}: answer for {what} is not JSON: {_short(text)}"
        ) from None


def _check_choice(payload: Any, text: str, endpoint: str, what: str) -> None:
    if not isinstance(payload, dict) or "error" in payload or not payload.get("choices"):
        raise ProfilerError(f"POST {endpoint}: no token for {what}: {_short(text)}")


# --- measuring ----------------------------------------------------------------------------------


def measure(
    url: str,
    settings: ProfileSettings,
    *,
    progress: Callable[[str], None] | None = None,
) -> ProfileRun:
    """Measure the server at `url`: warm-up, then `repeats` round-robin passes over the lengths.

    Round-robin (every length once per pass) rather than all repeats of one length in a row, so a
    slow drift of the machine (thermal, a neighbour's load) spreads over all lengths instead of
    bending the curve.

    Raises:
        ProfilerError: see `fetch_server_info`, `resolve_lengths` and `time_completion`.
    """
    return asyncio.run(_measure(url, settings, progress or (lambda _msg: None)))


async def _measure(url: str, settings: ProfileSettings, say: Callable[[str], None]) -> ProfileRun:
    """`measure` in the event loop (one session, one request at a time)."""
    async with client.new_session() as session:
        server = await fetch_server_info(session, url, settings.model)
        lengths = resolve_lengths(settings.lengths, server)
        resolved = dataclasses.replace(settings, lengths=tuple(lengths))
        say(
            f"profiling {server.model} at {server.url} (vLLM {server.vllm_version or '?'}, max "
            f"model length {server.max_model_len or '?'}): lengths {lengths}, "
            f"{settings.warmup_rounds} warm-up round(s), {settings.repeats} repeats"
        )
        date = datetime.now(UTC).replace(microsecond=0).isoformat()
        start = time.monotonic()
        prompts = PromptMaker(settings.vocab_size, settings.seed)

        async def once(n: int) -> float:
            return await time_completion(
                session, server, prompts.make(n), stream=settings.stream,
                timeout_s=settings.timeout_s,
            )

        samples = await _sample(once, [1, *lengths], settings, say)
        wall = time.monotonic() - start
    return ProfileRun(
        server=server,
        settings=resolved,
        overhead=LengthSamples(1, tuple(samples.pop(1))),
        samples=tuple(LengthSamples(n, tuple(s)) for n, s in samples.items()),
        date=date,
        wall_s=wall,
    )


async def _sample(
    once: Callable[[int], Awaitable[float]],
    lengths: list[int],
    settings: ProfileSettings,
    say: Callable[[str], None],
) -> dict[int, list[float]]:
    """Warm-up rounds (discarded), then `repeats` passes over every length in ascending order."""
    for k in range(settings.warmup_rounds):
        for n in lengths:
            await once(n)
        say(f"warm-up round {k + 1}/{settings.warmup_rounds} done")
    samples: dict[int, list[float]] = {n: [] for n in lengths}
    for k in range(settings.repeats):
        for n in lengths:
            samples[n].append(await once(n))
        say(f"pass {k + 1}/{settings.repeats}: " + ", ".join(
            f"{n}: {samples[n][-1] * 1e3:.1f} ms" for n in lengths
        ))
    return samples
