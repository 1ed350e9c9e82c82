"""Measure T(L), the idle prefill time of an L-token prompt, on a live OpenAI-compatible server.

Talks HTTP only (must not import vllm): the server may be any vLLM-compatible endpoint, local or
remote. One request at a time on an otherwise idle server, token-id prompts on `/v1/completions`
with `max_tokens=1`, timed by the client from send to the first response token; the result is a
`fairway.profiling.table.PrefillProfile` table plus a least-squares curve T(L) = a + b*L + c*L^2
(`fairway.profiling.fits.QuadraticFit`). HTTP goes through `fairway.client` (aiohttp).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import random
import shutil
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fairway import client
from fairway.errors import FairwayError
from fairway.machine import cpu_model
from fairway.profiling.fits import QuadraticFit
from fairway.profiling.table import PrefillProfile

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

METHOD = (
    "client-side time from sending a /v1/completions request (token-id prompt, max_tokens=1, "
    "{mode}) to its first response token, one request at a time on an otherwise idle server; "
    "includes the HTTP round trip and request handling (see overhead_s, the same measurement "
    "for a 1-token prompt); prompts are random token ids whose first tokens are unique per "
    "request, so nothing hits the prefix cache; lengths are interleaved round-robin; median of "
    "{repeats} repetitions after {warmup} warm-up round(s)"
)


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


@dataclass(frozen=True)
class Adjustment:
    """A measured median changed to keep the table non-decreasing."""

    prompt_tokens: int
    measured_s: float
    stored_s: float


@dataclass(frozen=True)
class ProfileOutcome:
    """The table and what was derived on the way (for printing and plotting)."""

    run: ProfileRun
    profile: PrefillProfile
    fit: QuadraticFit
    adjustments: tuple[Adjustment, ...] = field(default_factory=tuple)


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


# --- deriving the table -------------------------------------------------------------------------


def non_decreasing(
    points: Sequence[tuple[int, float]],
) -> tuple[list[tuple[int, float]], list[Adjustment]]:
    """The least-squares non-decreasing fit of the medians (pool adjacent violators).

    Noise can make a longer prompt measure faster than a shorter one, which `PrefillProfile`
    rejects. Pooling each violating run to its mean moves the points as little as possible
    (in squared seconds), unlike a running maximum, which only ever raises them.
    """
    blocks: list[list[float]] = []  # [sum, count] per pooled block
    for _, t in points:
        blocks.append([t, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted = [s / c for s, c in blocks for _ in range(int(c))]
    result = [(n, fitted[i]) for i, (n, _) in enumerate(points)]
    adjusted = [
        Adjustment(n, t, fitted[i]) for i, (n, t) in enumerate(points) if fitted[i] != t
    ]
    return result, adjusted


def fit_quadratic(points: Sequence[tuple[int, float]]) -> QuadraticFit:
    """Least squares of T(L) = a + b*L + c*L^2 on relative error (each row divided by T).

    Relative, because the ladder spans two or three orders of magnitude of time: plain least
    squares would fit the longest prompts and ignore the short ones, where the fixed cost lives.
    Fewer points, fewer terms: two points give a line, one a proportion.
    """
    lengths = np.array([n for n, _ in points], dtype=np.float64)
    seconds = np.array([t for _, t in points], dtype=np.float64)
    degree = min(2, len(points) - 1)
    if degree == 0:
        return QuadraticFit(0.0, float(seconds[0] / lengths[0]), 0.0)
    scale = lengths.max()  # columns of similar size: a well-conditioned solve
    x = lengths / scale
    design = np.stack([x**k for k in range(degree + 1)], axis=1) / seconds[:, None]
    solved, *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
    coef = [float(c) / scale**k for k, c in enumerate(solved)] + [0.0] * (2 - degree)
    return QuadraticFit(coef[0], coef[1], coef[2])


def build_profile(
    run: ProfileRun,
    *,
    hardware: str,
    hardware_detected: bool,
    command: str | None = None,
    extra: dict[str, Any] | None = None,
    step_time: str = "table",
) -> ProfileOutcome:
    """The table (non-decreasing medians) with its metadata, and the fitted curve.

    `step_time`: what the replay prices steps with when given the table: "table" (the points)
    or "quadratic" (the fit, saved in the file's `step_time` entry).

    Raises:
        ProfileError: "quadratic" and a fitted coefficient is negative (it cannot price steps).
    """
    medians = run.medians()
    points, adjustments = non_decreasing(medians)
    fit = fit_quadratic(medians)
    settings = run.settings
    metadata: dict[str, Any] = {
        "source": "measured",
        "hardware": hardware,
        "hardware_detected": hardware_detected,
        "model": run.server.model,
        "vllm_version": run.server.vllm_version,
        "max_model_len": run.server.max_model_len,
        "date": run.date,
        "method": METHOD.format(
            mode="streaming" if settings.stream else "not streaming",
            repeats=settings.repeats, warmup=settings.warmup_rounds,
        ),
        "repetitions": settings.repeats,
        "warmup_rounds": settings.warmup_rounds,
        "overhead_s": round(run.overhead.median_s, 6),
        "fit": fit.describe(),
        "monotone": (
            "medians made non-decreasing by pool-adjacent-violators (least squares); "
            f"{len(adjustments)} point(s) changed, see adjusted"
        ),
        "adjusted": [[a.prompt_tokens, round(a.measured_s, 6), round(a.stored_s, 6)]
                     for a in adjustments],
        "samples_s": {str(s.prompt_tokens): [round(t, 6) for t in s.seconds]
                      for s in (run.overhead, *run.samples)},
        "measurement_wall_s": round(run.wall_s, 1),
        "generated_by": command or "fairway profile",
    }
    metadata.update(extra or {})
    spec = None
    if step_time == QuadraticFit.KIND:
        fit.check_prices_steps()
        spec = fit.to_spec()
    elif step_time != "table":
        raise ValueError(f"step_time must be 'table' or 'quadratic', got {step_time!r}")
    table = PrefillProfile(tuple((n, round(t, 6)) for n, t in points), metadata, spec)
    return ProfileOutcome(run, table, fit, tuple(adjustments))


# --- reporting ----------------------------------------------------------------------------------


def format_report(outcome: ProfileOutcome) -> str:
    """The table as text: per length median, spread, stored value, fit and throughput."""
    run, fit = outcome.run, outcome.fit
    stored = dict(outcome.profile.points)
    lines = [
        f"{'tokens':>8} {'median_s':>10} {'min_s':>10} {'max_s':>10} {'table_s':>10} "
        f"{'fit_s':>10} {'tokens/s':>10}"
    ]
    for s in run.samples:
        n = s.prompt_tokens
        lines.append(
            f"{n:>8} {s.median_s:>10.4f} {min(s.seconds):>10.4f} {max(s.seconds):>10.4f} "
            f"{stored[n]:>10.4f} {fit(n):>10.4f} {n / stored[n]:>10.0f}"
        )
    lines.append(f"overhead (1-token prompt, median): {run.overhead.median_s:.4f} s")
    lines.append(f"fit: {fit}")
    for a in outcome.adjustments:
        lines.append(
            f"note: T({a.prompt_tokens}) measured {a.measured_s:.4f} s, stored {a.stored_s:.4f} s "
            "(kept non-decreasing)"
        )
    return "\n".join(lines)


def plot_profile(outcome: ProfileOutcome, path: str | Path) -> Path:
    """A PNG of the samples (median and range), the stored table and the fitted curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run, fit = outcome.run, outcome.fit
    lengths = np.array([s.prompt_tokens for s in run.samples], dtype=np.float64)
    medians = np.array([s.median_s for s in run.samples])
    low = medians - np.array([min(s.seconds) for s in run.samples])
    high = np.array([max(s.seconds) for s in run.samples]) - medians
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.errorbar(lengths, medians, yerr=[low, high], fmt="o", capsize=3,
                label=f"median of {run.settings.repeats} (bars: min-max)")
    ax.plot(*zip(*outcome.profile.points, strict=True), "-", alpha=0.6, label="table")
    grid = np.geomspace(lengths.min(), lengths.max(), 200)
    ax.plot(grid, fit(grid), "--", label=f"fit: {fit}".replace("s/token", "s/tok"))
    ax.axhline(run.overhead.median_s, color="grey", linestyle=":", label="1-token round trip")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens L")
    ax.set_ylabel("idle prefill time T(L) [s]")
    meta = outcome.profile.metadata
    ax.set_title(f"{meta.get('model', run.server.model)}\n{meta.get('hardware', '?')}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --- hardware -----------------------------------------------------------------------------------


def detect_local_hardware() -> str | None:
    """This machine's accelerator (`nvidia-smi`) or CPU model and usable cores; None if unknown."""
    gpus = _nvidia_gpus()
    if gpus:
        names = sorted(set(gpus))
        return ", ".join(f"{gpus.count(n)} x {n}" for n in names)
    model = cpu_model()
    if model is None:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"CPU: {model}, {cores} cores usable"


def _nvidia_gpus() -> list[str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [" (".join(part.strip() for part in line.split(",", 1)) + ")"
            for line in out.splitlines() if line.strip()]
