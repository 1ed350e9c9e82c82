"""What a live replay reads from the server before and while it runs.

Before: the served model, its `max_model_len` and its vocabulary, so that a replay does not send
hundreds of requests the server must refuse (a prompt longer than the model allows, a token id
outside its vocabulary, a model name it does not serve). vLLM lists `max_model_len` in
`GET /v1/models` but publishes no vocabulary size (`/tokenizer_info` is off by default and
`/detokenize` accepts any id), so the vocabulary is probed: a one-token completion with the highest
id the replay would draw, and if vLLM answers "Token id N is out of vocabulary", a binary search for
the largest id it accepts (about 15 one-token requests for 32,000 ids).

While: a health probe. A vLLM server that is stopping can stay alive with the replay's streams
open and never answer them (see FAIRWAY.md, "Shutdown"); without a probe the replay would wait for
every stream's timeout. `HealthWatch` asks `GET /health` every few seconds while requests are in
flight and reports the server as gone after a few failures in a row.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from fairway.errors import FairwayError

if TYPE_CHECKING:
    from fairway.traces.format import Trace

logger = logging.getLogger(__name__)

#: Seconds between health probes while requests are in flight.
HEALTH_INTERVAL_S = 5.0
#: A probe that takes longer than this counts as a failure.
HEALTH_TIMEOUT_S = 5.0
#: Failed probes in a row after which the server is taken as gone.
HEALTH_FAILURES = 2
#: Start-up requests (listing, vocabulary probes) should answer at once.
_CHECK_TIMEOUT_S = 30.0
_MAX_CHARS = 200
#: vLLM's message for a token id outside the model's vocabulary (vllm/renderers/base.py).
_OUT_OF_VOCAB = "out of vocabulary"


class ServerCheckError(FairwayError):
    """The server cannot serve this replay (unreachable, unknown model, limits); says why."""


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_CHARS else text[: _MAX_CHARS - 3] + "..."


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return _short(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


def root(url: str) -> str:
    """`http://host:port` from a URL given with or without a trailing `/` or `/v1`."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


# --- before the replay ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerLimits:
    """What the server allows, as far as it says.

    Attributes:
        model: the model name the replay sends.
        max_model_len: prompt + output tokens the model accepts (None: not listed).
        vocab_size: token ids are drawn below this (the replay's, or the server's if smaller).
        vocab_probed: the vocabulary was checked against the server (a vLLM server).
    """

    model: str
    max_model_len: int | None
    vocab_size: int
    vocab_probed: bool

    def describe(self) -> dict[str, Any]:
        """For the result's settings."""
        return {"server_max_model_len": self.max_model_len, "vocab_probed": self.vocab_probed}


async def list_models(session: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    """The model cards of `GET /v1/models` (at least one, each with an `id`).

    Raises:
        ServerCheckError: unreachable, non-200, not JSON, or no model listed.
    """
    endpoint = f"{root(url)}/v1/models"
    hint = "start the server or check --url"
    try:
        async with asyncio.timeout(_CHECK_TIMEOUT_S), session.get(endpoint) as resp:
            if resp.status != 200:
                body = _short(await resp.text(errors="replace"))
                raise ServerCheckError(
                    f"GET {endpoint} answered HTTP {resp.status}: {body}; {hint}"
                )
            data = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ServerCheckError(f"cannot list models at {endpoint}: {_reason(exc)}; {hint}") from exc
    cards = data.get("data") if isinstance(data, dict) else None
    if not cards or not all(isinstance(c, dict) and "id" in c for c in cards):
        listing = _short(json.dumps(data))
        raise ServerCheckError(f"GET {endpoint} listed no model ({listing}); {hint}")
    return cards


def pick_model(cards: Sequence[dict[str, Any]], model: str | None) -> dict[str, Any]:
    """The card of `model`, or the first one when None.

    A name a vLLM server does not list is an error (vLLM answers every request with 404); other
    servers (proxies, routers) may accept names they do not list, so there it is only a warning
    and the card is empty.

    Raises:
        ServerCheckError: a vLLM server does not list `model` (the message lists what it serves).
    """
    if model is None:
        return cards[0]
    for card in cards:
        if card["id"] == model:
            return card
    served = ", ".join(str(c["id"]) for c in cards)
    if all(c.get("owned_by") == "vllm" for c in cards):
        raise ServerCheckError(
            f"the server does not serve model {model!r}; it serves: {served} (omit --model to "
            "use the first one)"
        )
    logger.warning("the server does not list model %r (it lists: %s); sending it anyway", model,
                   served)
    return {"id": model}


def check_lengths(trace: Trace, max_model_len: int | None) -> None:
    """Refuse a trace with requests longer than the server's `max_model_len` (before sending).

    Raises:
        ServerCheckError: how many requests are too long, the longest, and the two ways out.
    """
    if max_model_len is None:
        return
    too_long = [r for r in trace.requests if r.prompt_tokens + r.max_tokens > max_model_len]
    if too_long:
        longest = max(r.prompt_tokens + r.max_tokens for r in too_long)
        raise ServerCheckError(
            f"{len(too_long)} of {len(trace.requests)} requests need more tokens than the server's "
            f"max_model_len {max_model_len} (longest: {longest} prompt + output tokens); start the "
            "server with a larger --max-model-len, or build the trace with shorter prompts (e.g. "
            f"`fairway trace build ... --param max_prompt_tokens={max_model_len - 1}`)"
        )


async def _accepts(session: aiohttp.ClientSession, url: str, model: str, token_id: int) -> bool:
    """Whether the server accepts a one-token prompt `[token_id]`.

    Raises:
        ServerCheckError: it failed for another reason than the vocabulary (the cause).
    """
    endpoint = f"{root(url)}/v1/completions"
    body = {"model": model, "prompt": [token_id], "max_tokens": 1, "temperature": 0.0}
    try:
        async with asyncio.timeout(_CHECK_TIMEOUT_S), session.post(endpoint, json=body) as resp:
            if resp.status == 200:
                return True
            text = await resp.text(errors="replace")
    except (aiohttp.ClientError, TimeoutError) as exc:
        reason = _reason(exc)
        raise ServerCheckError(f"POST {endpoint} (a one-token probe) failed: {reason}") from exc
    if resp.status == 400 and _OUT_OF_VOCAB in text:
        return False
    raise ServerCheckError(
        f"POST {endpoint} (a one-token probe) answered HTTP {resp.status}: {_short(text)}"
    )


async def probe_vocab(
    session: aiohttp.ClientSession, url: str, model: str, vocab_size: int
) -> int:
    """`vocab_size` if the server accepts id `vocab_size - 1`, else its largest accepted id + 1."""
    if await _accepts(session, url, model, vocab_size - 1):
        return vocab_size
    low, high = 0, vocab_size - 1  # low accepted (id 0 always is), high refused
    if not await _accepts(session, url, model, low):
        raise ServerCheckError("the server refuses even token id 0 as out of vocabulary")
    while high - low > 1:
        mid = (low + high) // 2
        if await _accepts(session, url, model, mid):
            low = mid
        else:
            high = mid
    return low + 1


async def read_limits(
    session: aiohttp.ClientSession, url: str, trace: Trace, *, model: str | None,
    vocab_size: int, vocab_given: bool,
) -> ServerLimits:
    """Check the server against the trace before the replay; the limits the replay must keep.

    Args:
        model: the model asked for (None: the first listed).
        vocab_size: the replay's vocabulary (token ids are drawn below it).
        vocab_given: the user chose `vocab_size` (then a smaller server vocabulary is an error;
            otherwise the replay adopts the server's).

    Raises:
        ServerCheckError: unreachable, unknown model, requests longer than max_model_len, or a
            given vocabulary larger than the server's.
    """
    card = pick_model(await list_models(session, url), model)
    name = str(card["id"]) if model is None else model
    max_len = card.get("max_model_len")
    max_len = max_len if isinstance(max_len, int) and max_len > 0 else None
    check_lengths(trace, max_len)
    if card.get("owned_by") != "vllm":  # the probe reads vLLM's own error message
        return ServerLimits(name, max_len, vocab_size, False)
    served = await probe_vocab(session, url, name, vocab_size)
    if served < vocab_size:
        if vocab_given:
            raise ServerCheckError(
                f"--vocab-size {vocab_size} is larger than the served model's vocabulary "
                f"({served} token ids: vLLM refuses id {served} as out of vocabulary); pass "
                f"--vocab-size {served} or less"
            )
        logger.warning("the served model has %d token ids; prompts use ids below %d", served,
                       served)
    return ServerLimits(name, max_len, min(served, vocab_size), True)


# --- during the replay ----------------------------------------------------------------------------


class HealthWatch:
    """Probe `GET /health` every `interval_s`; call `on_down(reason)` once it fails repeatedly.

    Any HTTP answer below 500 counts as alive (a server without a /health route answers 404);
    a refused connection, a timeout or a 5xx counts as a failure. `nudge()` probes at once
    (after a request saw a connection error) instead of at the next interval.
    """

    def __init__(
        self, session: aiohttp.ClientSession, url: str, on_down: Callable[[str], None], *,
        interval_s: float = HEALTH_INTERVAL_S, timeout_s: float = HEALTH_TIMEOUT_S,
        failures: int = HEALTH_FAILURES,
    ) -> None:
        self.session = session
        self.endpoint = f"{root(url)}/health"
        self.on_down = on_down
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.failures = failures
        self._wake = asyncio.Event()

    def nudge(self) -> None:
        """Probe now rather than at the next interval."""
        self._wake.set()

    async def probe(self) -> str | None:
        """None if the server answered, else why not."""
        try:
            async with asyncio.timeout(self.timeout_s), self.session.get(self.endpoint) as resp:
                if resp.status < 500:
                    return None
                return f"GET {self.endpoint} answered HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"GET {self.endpoint}: {_reason(exc)}"

    async def run(self) -> None:
        """Until cancelled, or until the server is gone (then `on_down` is called once)."""
        failed = 0
        while True:
            with_nudge = asyncio.create_task(self._wake.wait())
            try:
                await asyncio.wait({with_nudge}, timeout=self.interval_s)
            finally:
                with_nudge.cancel()
            self._wake.clear()
            reason = await self.probe()
            failed = 0 if reason is None else failed + 1
            if reason is not None:
                logger.warning("health probe %d of %d failed: %s", failed, self.failures, reason)
            if failed >= self.failures:
                self.on_down(f"{reason}, {failed} times in a row")
                return
            if failed:
                await asyncio.sleep(min(1.0, self.interval_s))  # confirm soon, not at once
