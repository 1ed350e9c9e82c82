"""Live replay of a trace against any OpenAI-compatible server (`fairway replay --url`).

A request without a parent is sent at its trace timestamp whether or not earlier ones have
answered (open loop: those arrivals are the offered load, and a client that waited would slow down
exactly when the server is overloaded and hide the queueing we want to measure). A session turn
(tags `parent`, `think_s`: `fairway.replay.sessions`) is closed loop by default: it is sent
`think_s` after its parent's first streamed chunk, or after its parent's failure, because an agent
cannot send its next turn before it has the answer; `open_loop=True` sends it at its timestamp
too. TTFT = first streamed SSE chunk - send time. Failures become rows with `error` set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from tqdm import tqdm

from fairway import client
from fairway.client import StreamError as _StreamError
from fairway.client import base_url
from fairway.client import describe as _describe
from fairway.client import short as _short
from fairway.errors import FairwayConfigError
from fairway.replay import results
from fairway.replay.outcome import SERVER_STOPPED, STOPPED_MESSAGE
from fairway.replay.results import ReplayResult, RequestResult, default_trace_name
from fairway.replay.server import (
    HEALTH_INTERVAL_S,
    HealthWatch,
    ServerCheckError,
    list_models,
    read_limits,
)
from fairway.replay.sessions import RECORDED_ARRIVAL_TAG, arrivals_setting, session_children

if TYPE_CHECKING:
    from fairway.traces.format import Trace, TraceRequest

logger = logging.getLogger(__name__)

#: Generous by default: during a spike above capacity a request can queue for minutes.
DEFAULT_TIMEOUT_S = 600.0
#: Token ids are drawn below this; it must not exceed the served model's vocabulary.
DEFAULT_VOCAB_SIZE = 32000
#: Listing the models is a start-up check; it should answer at once.
_MODELS_TIMEOUT_S = 30.0
INTERRUPTED = "interrupted"


#: The server cannot be used for a replay (unreachable, no models, limits); the message says why.
LiveReplayError = ServerCheckError


@dataclass(slots=True)
class _Attempt:
    """Mutable progress of one request; turned into a `RequestResult` at the end (or on Ctrl-C).

    A closed-loop session turn has its `parent` and `think_s`; its `scheduled_s` is its
    timestamp until the parent resolves (first chunk or outcome, `resolved_s`), then its release.
    """

    request: TraceRequest
    scheduled_s: float
    sent_s: float | None = None
    first_token_s: float | None = None
    cached_tokens: int | None = None
    error: str | None = None
    done: bool = False
    parent: _Attempt | None = None
    think_s: float = 0.0
    resolved_s: float | None = None
    #: Set when this request resolves; only for a parent (made inside the running loop).
    answered: asyncio.Event | None = None

    def resolve(self, now: float) -> None:
        """The answer (first chunk) or the outcome is in: release the children (first call)."""
        if self.resolved_s is None:
            self.resolved_s = now
            if self.answered is not None:
                self.answered.set()

    def result(self) -> RequestResult:
        """The record; a request never sent keeps its scheduled time as arrival."""
        req = self.request
        tags = dict(req.tags or {})
        if self.parent is not None:  # the open-loop send time, for comparison
            tags[RECORDED_ARRIVAL_TAG] = req.arrival_s
        return RequestResult(
            request_id=req.request_id,
            arrival_s=self.sent_s if self.sent_s is not None else self.scheduled_s,
            phase=req.phase,
            prompt_tokens=req.prompt_tokens,
            first_scheduled_s=None,  # not observable over HTTP
            first_token_s=self.first_token_s,
            cached_tokens=self.cached_tokens,
            error=self.error if self.done else (self.error or INTERRUPTED),
            tags=tags,
            tenant=req.tenant,
            priority=req.priority,
        )


async def fetch_model(session: aiohttp.ClientSession, url: str) -> str:
    """The first model id served at `url` (GET /v1/models).

    Raises:
        LiveReplayError: the server is unreachable, answers non-200, or lists no model.
    """
    return str((await list_models(session, url))[0]["id"])


def _payload(request: TraceRequest, model: str, vocab_size: int) -> bytes:
    """The request body; built before the send time so encoding does not delay the send.

    The trace request's vLLM `priority` (when not 0) and tenant (`vllm_xargs`, when set) go
    with it; a vLLM server refuses a priority other than 0 unless it runs
    ``--scheduling-policy priority``.
    """
    return client.completion_body(
        model, request.token_ids(vocab_size), request.max_tokens, include_usage=True,
        priority=request.priority, tenant=request.tenant,
    )


async def _read_stream(
    resp: aiohttp.ClientResponse, attempt: _Attempt, clock: Callable[[], float]
) -> None:
    """Consume the SSE stream: stamp the first `data:` chunk, keep the cache hit, expect [DONE].

    Raises:
        StreamError: a chunk is not JSON, carries an error, or the stream ends without [DONE].
    """
    async for chunk, now in client.stream_chunks(resp, clock):
        if attempt.first_token_s is None:
            attempt.first_token_s = now
            attempt.resolve(now)
        cached = client.cached_tokens(chunk)  # 0 is a real answer (no hit), so test for None
        if cached is not None:
            attempt.cached_tokens = cached


async def _send(
    session: aiohttp.ClientSession,
    endpoint: str,
    attempt: _Attempt,
    body: bytes,
    clock: Callable[[], float],
    timeout_s: float,
) -> None:
    """POST one request and record its outcome in `attempt`; never raises except on cancel."""
    attempt.sent_s = clock()
    try:
        async with asyncio.timeout(timeout_s), session.post(
            endpoint, data=body, headers=client.JSON_HEADERS
        ) as resp:
            if resp.status != 200:
                attempt.error = f"HTTP {resp.status}: {_short(await resp.text(errors='replace'))}"
            else:
                await _read_stream(resp, attempt, clock)
    except TimeoutError:
        attempt.error = f"timeout after {timeout_s:g} s"
    except _StreamError as exc:
        attempt.error = str(exc)
    except aiohttp.ClientError as exc:
        attempt.error = f"connection error: {_describe(exc)}"
    except Exception as exc:  # one odd response must not abort the other requests
        logger.debug("request %s failed", attempt.request.request_id, exc_info=True)
        attempt.error = f"client error: {_describe(exc)}"
    attempt.done = True


class _Replay:
    """One live replay run: the clock, the dispatch loop and the in-flight tasks.

    A class rather than closures so an interruption can read what every request got so far.
    """

    def __init__(
        self, attempts: list[_Attempt], *, timeout_s: float, max_concurrency: int | None,
        progress: bool, desc: str, time_scale: float = 1.0,
    ) -> None:
        self.attempts = attempts
        self.timeout_s = timeout_s
        self.time_scale = time_scale
        self.limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self.tasks: list[asyncio.Task[None]] = []
        self.bar = tqdm(total=len(attempts), unit="req", desc=desc, disable=not progress)
        self.t0 = 0.0
        self.max_lag_s = 0.0
        #: Why the server is taken as gone (set by the health watch), or None.
        self.stopped: str | None = None
        self._stop = asyncio.Event()
        self.watch: HealthWatch | None = None

    def clock(self) -> float:
        """Seconds since the replay started (monotonic)."""
        return time.monotonic() - self.t0

    async def run(self, session: aiohttp.ClientSession, endpoint: str, model: str,
                  vocab_size: int) -> None:
        """Send every request at its scheduled time (a session turn after its parent), then wait
        for all answers.

        If the health watch declares the server gone, nothing more is sent and the requests in
        flight are cancelled at once (see `_give_up`) rather than left to their timeouts.
        """
        self.t0 = time.monotonic()
        watcher = asyncio.create_task(self.watch.run()) if self.watch is not None else None
        turns = [a for a in self.attempts if a.parent is not None]
        for turn in turns:
            assert turn.parent is not None
            turn.parent.answered = turn.parent.answered or asyncio.Event()
        self.tasks += [asyncio.create_task(self._after_parent(session, endpoint, turn, model,
                                                              vocab_size)) for turn in turns]
        try:
            roots = [a for a in self.attempts if a.parent is None]
            for attempt in sorted(roots, key=lambda a: a.scheduled_s):
                body = _payload(attempt.request, model, vocab_size)
                delay = attempt.scheduled_s - self.clock()
                if delay > 0:
                    await self._stopped_within(delay)
                if self._stop.is_set():
                    break
                self.tasks.append(asyncio.create_task(self._one(session, endpoint, attempt, body)))
            await self._answers_or_stop()
        finally:
            if watcher is not None:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
        if self._stop.is_set():
            await self._give_up()

    async def _after_parent(self, session: aiohttp.ClientSession, endpoint: str,
                            attempt: _Attempt, model: str, vocab_size: int) -> None:
        """Send a session turn its think time (scaled as the timestamps) after its parent
        resolves; nothing once the server is declared gone."""
        parent = attempt.parent
        assert parent is not None and parent.answered is not None
        await parent.answered.wait()
        assert parent.resolved_s is not None
        attempt.scheduled_s = parent.resolved_s + attempt.think_s * self.time_scale
        body = _payload(attempt.request, model, vocab_size)
        delay = attempt.scheduled_s - self.clock()
        if delay > 0:
            await self._stopped_within(delay)
        if not self._stop.is_set():
            await self._one(session, endpoint, attempt, body)

    def server_gone(self, reason: str) -> None:
        """The health watch's verdict: stop sending and stop waiting."""
        self.stopped = reason
        self._stop.set()
        logger.error("live replay: %s (%s); ending the replay", STOPPED_MESSAGE, reason)

    async def _stopped_within(self, delay: float) -> bool:
        """Sleep `delay` seconds, or less if the server is declared gone meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), delay)
        return self._stop.is_set()

    async def _answers_or_stop(self) -> None:
        """Until every request sent so far is done, or the server is declared gone."""
        pending = [t for t in self.tasks if not t.done()]
        if not pending:
            return
        answers = asyncio.gather(*pending)
        stop = asyncio.create_task(self._stop.wait())
        try:
            racers: set[asyncio.Future[Any]] = {answers, stop}
            await asyncio.wait(racers, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if answers.done():
            answers.result()  # `_one` never raises; a bug should not pass silently

    async def _give_up(self) -> None:
        """Cancel what is in flight; every request without an outcome gets the reason."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for attempt in self.attempts:
            if not attempt.done:
                sent = attempt.sent_s is not None
                attempt.error = STOPPED_MESSAGE if sent else f"not sent: {STOPPED_MESSAGE}"
                attempt.done = True

    async def _one(self, session: aiohttp.ClientSession, endpoint: str, attempt: _Attempt,
                   body: bytes) -> None:
        try:
            if self.limit is None:
                await _send(session, endpoint, attempt, body, self.clock, self.timeout_s)
            else:
                async with self.limit:
                    await _send(session, endpoint, attempt, body, self.clock, self.timeout_s)
        finally:
            attempt.resolve(self.clock())  # a failure (or a cut) releases the children too
            if attempt.sent_s is not None:
                self.max_lag_s = max(self.max_lag_s, attempt.sent_s - attempt.scheduled_s)
            if attempt.done:
                self.bar.update()
            if self.watch is not None and (attempt.error or "").startswith("connection error"):
                self.watch.nudge()  # a refused or reset connection: is the server still there?

    async def cancel(self) -> None:
        """Stop in-flight requests; they stay unfinished and are reported as interrupted."""
        for task in self.tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _check_args(trace: Trace, time_scale: float, timeout_s: float, vocab_size: int,
                max_concurrency: int | None) -> None:
    """Refuse bad arguments before anything is sent (a TraceError for a too small vocab_size)."""
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise FairwayConfigError(f"time_scale must be a finite number > 0, got {time_scale!r}")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise FairwayConfigError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
    if max_concurrency is not None and max_concurrency < 1:
        raise FairwayConfigError(f"max_concurrency must be >= 1 or None, got {max_concurrency!r}")
    if trace.requests:
        trace.requests[0].token_ids(vocab_size)  # fails here, not in the middle of the replay


async def replay_live(
    trace: Trace,
    url: str,
    model: str | None = None,
    *,
    policy: str = "live",
    trace_name: str | None = None,
    time_scale: float = 1.0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    vocab_size: int | None = None,
    max_concurrency: int | None = None,
    progress: bool = True,
    out_path: str | Path | None = None,
    health_interval_s: float | None = HEALTH_INTERVAL_S,
    open_loop: bool = False,
) -> ReplayResult:
    """Replay `trace` against the server at `url` and measure TTFT per request.

    Requests go to `POST /v1/completions` with token-id prompts, streaming, temperature 0, at
    `arrival_s * time_scale` seconds after the start; a session turn (closed loop, the default)
    at `think_s * time_scale` after its parent's first chunk or failure instead, with the trace's
    `arrival_s` kept in its result's tags (`recorded_arrival_s`). Times in the result are seconds
    since the start; `arrival_s` is the actual send time. `settings["arrivals"]` says
    `closed-loop` or `open-loop` for a trace with parents and is absent otherwise.

    Cancellation (Ctrl-C under `asyncio.run`) does not raise: the result so far is returned (and
    written to `out_path`), with unfinished requests marked `error="interrupted"` and
    `settings["interrupted"] = True`.

    Args:
        trace: the workload (`fairway.traces.format.Trace`).
        url: server base URL, e.g. `http://127.0.0.1:8000` (a trailing `/v1` is accepted).
        model: served model name; None asks `GET /v1/models` and takes the first.
        policy: label for the report (the server's policy is not visible over HTTP).
        trace_name: label for the report; None derives one from the header (`default_trace_name`).
        time_scale: multiplies every arrival time and think time (0.5 = twice the rate).
        timeout_s: per request, from send to the end of the stream.
        vocab_size: token ids are drawn below it; must not exceed the model's vocabulary (a vLLM
            server is checked before the replay). None: `DEFAULT_VOCAB_SIZE`, or the served
            model's vocabulary if that is smaller.
        max_concurrency: at most this many requests in flight (later sends wait, so this is no
            longer open loop; the lag shows in `settings["max_send_lag_s"]`); None = unlimited.
        progress: show a tqdm bar.
        out_path: also save the result there (also when interrupted).
        health_interval_s: seconds between `GET /health` probes during the replay; after
            `HEALTH_FAILURES` failures in a row the replay ends early with
            `settings["server_stopped"]` set and the unfinished requests marked "the server
            stopped answering". None: no probe.
        open_loop: send every request at its timestamp, session turns included.

    Raises:
        LiveReplayError: the server cannot serve the trace (unreachable, unknown `model`,
            requests longer than its max_model_len, `vocab_size` beyond its vocabulary).
        FairwayConfigError: an argument is out of range.
        TraceError: `vocab_size` is too small for the trace's token ids; in closed loop, a
            `parent` that is not an earlier request of the trace, or a bad `think_s`.
    """
    vocab_given = vocab_size is not None
    vocab_size = DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size
    _check_args(trace, time_scale, timeout_s, vocab_size, max_concurrency)
    trace_name = trace_name or default_trace_name(trace)
    attempts = _attempts(trace, time_scale, open_loop)
    replay = _Replay(attempts, timeout_s=timeout_s, max_concurrency=max_concurrency,
                     progress=progress, desc=f"{trace_name} @ {policy}", time_scale=time_scale)
    start = time.monotonic()
    interrupted = False
    limits_info: dict[str, Any] = {}
    try:
        async with client.new_session() as session:
            limits = await read_limits(session, url, trace, model=model, vocab_size=vocab_size,
                                       vocab_given=vocab_given)
            model, vocab_size, limits_info = limits.model, limits.vocab_size, limits.describe()
            _check_args(trace, time_scale, timeout_s, vocab_size, max_concurrency)
            if health_interval_s is not None:
                replay.watch = HealthWatch(session, url, replay.server_gone,
                                           interval_s=health_interval_s)
            try:
                await replay.run(session, f"{base_url(url)}/v1/completions", model, vocab_size)
            except asyncio.CancelledError:
                interrupted = True
                _uncancel()
                await replay.cancel()
    finally:
        replay.bar.close()
    result = ReplayResult(
        policy=policy,
        trace_name=trace_name,
        settings={
            "mode": "live", "url": base_url(url), "model": model, "time_scale": time_scale,
            "timeout_s": timeout_s, "vocab_size": vocab_size, "max_concurrency": max_concurrency,
            "interrupted": interrupted, "max_send_lag_s": replay.max_lag_s,
            SERVER_STOPPED: replay.stopped, **limits_info, **_arrivals(trace, open_loop),
        },
        requests=[a.result() for a in attempts],
        wall_s=time.monotonic() - start,
        simulated_s=None,
    )
    _log_outcome(result, interrupted)
    if out_path is not None:
        results.save(result, out_path)
    return result


def _attempts(trace: Trace, time_scale: float, open_loop: bool) -> list[_Attempt]:
    """One attempt per request at its scaled timestamp; in closed loop each session turn linked
    to its parent (a bad parent or think time is a TraceError here, before anything is sent)."""
    attempts = [_Attempt(r, r.arrival_s * time_scale) for r in trace.requests]
    if not open_loop:
        for parent, children in session_children(trace.requests).items():
            for child, think_s in children:
                attempts[child].parent = attempts[parent]
                attempts[child].think_s = think_s
    return attempts


def _arrivals(trace: Trace, open_loop: bool) -> dict[str, str]:
    """The `arrivals` setting, for a trace with parents only (others keep their settings)."""
    arrivals = arrivals_setting(trace.requests, open_loop)
    return {} if arrivals is None else {"arrivals": arrivals}


def _uncancel() -> None:
    """We handle this cancellation by returning partial results, so withdraw the request for it."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def _log_outcome(result: ReplayResult, interrupted: bool) -> None:
    n_errors = sum(1 for r in result.requests if r.error is not None)
    if interrupted:
        n_cut = sum(1 for r in result.requests if r.error == INTERRUPTED)
        logger.warning("live replay interrupted: %d of %d requests unfinished",
                       n_cut, len(result.requests))
    elif n_errors:
        logger.warning("live replay: %d of %d requests failed", n_errors, len(result.requests))
    lag = result.settings["max_send_lag_s"]
    if lag > 0.05:
        logger.warning("live replay: sends lagged their schedule by up to %.3f s", lag)


def run_live(trace: Trace, url: str, model: str | None = None, **kwargs: Any) -> ReplayResult:
    """Blocking wrapper of `replay_live` for the CLI; Ctrl-C returns the partial result."""
    return asyncio.run(replay_live(trace, url, model, **kwargs))


__all__: Sequence[str] = [
    "DEFAULT_TIMEOUT_S", "DEFAULT_VOCAB_SIZE", "INTERRUPTED", "LiveReplayError", "base_url",
    "fetch_model", "replay_live", "run_live",
]
