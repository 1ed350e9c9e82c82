"""Fault tests against `FairwayScheduler` in a real vLLM server on CPU (tiny random model).

One server for the module: `fairway serve MODEL --policy fairway` (vLLM's server with
`FairwayScheduler`, run under `fairway.supervisor.supervise`, which gives it `DEFAULT_GRACE_S`
after a stop signal). In file order:

1. clients that disconnect mid-stream,
2. an abort storm: 300 streamed requests, two thirds cancelled at staggered times while they wait
   or prefill,
3. SIGTERM with a live replay in flight (the last test: it stops the server).

After 1 and 2: the server is up, every kept request was answered exactly once (one finish, one
[DONE]), `vllm:num_requests_waiting`/`running` are back to 0 and `fairway:policy_fallbacks_total`
is 0. The cancelled requests ask for ~1,400 output tokens, so the queues can only empty that soon
if vLLM really aborted them. After 3: the server is gone within its grace period although patient
clients keep their streams open (without `fairway.supervisor` vLLM waits for them: FAIRWAY.md,
"Shutdown"), and `fairway replay` ended with "the server stopped answering", long before its
request timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import NoReturn

import aiohttp
import httpx
import pytest
from machine_state import MachineWatch
from test_serve import metric_sum

from fairway.cli import main as fairway_main
from fairway.supervisor import DEFAULT_GRACE_S

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STARTUP_TIMEOUT_S = 240.0
#: Seconds the supervisor gives the server after SIGTERM before killing it.
GRACE_S = DEFAULT_GRACE_S  # what `fairway serve` gives the server after SIGTERM
#: The queues must be empty this soon after the last answer (aborts are processed at once).
DRAIN_TIMEOUT_S = 20.0
#: The replay's start-up (~3 s here: imports, the trace, its server checks) on a busy machine.
REPLAY_START_TIMEOUT_S = 180.0
#: Then the replay's requests and 12 held streams must be in flight together this soon.
IN_FLIGHT_TIMEOUT_S = 60.0
#: A /metrics read slower than this is recorded as unanswered (the wait goes on).
METRICS_TIMEOUT_S = 10.0
#: Token ids inside the tiny model's vocabulary (3 specials, 512 ids).
_LOW, _HIGH = 3, 512


@dataclass
class FaultServer:
    """The supervised server of this module."""

    proc: subprocess.Popen[bytes]
    url: str
    model: str
    log_path: Path
    tail: object

    def log_tail(self) -> str:
        return self.tail(self.log_path)  # type: ignore[operator]


@pytest.fixture(scope="module")
def fault_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory,
                 e2e: SimpleNamespace) -> Iterator[FaultServer]:
    port = e2e.free_port()
    work = tmp_path_factory.mktemp("faults")
    metrics_dir = work / "prometheus"
    metrics_dir.mkdir()
    env = {**e2e.server_env(), "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    argv = [
        *e2e.fairway_command(), "serve", str(tiny_model), "--policy", "fairway",
        "--host", "127.0.0.1", "--port", str(port), *e2e.cpu_server_args,
    ]
    log_path = work / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = FaultServer(proc, f"http://127.0.0.1:{port}", str(tiny_model), log_path, e2e.log_tail)
    try:
        _wait_healthy(server)
        yield server
    finally:
        if proc.poll() is None:  # a test failed before the last one stopped it
            for pid in e2e.alive(set(e2e.process_tree(proc.pid))):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _wait_healthy(server: FaultServer) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            pytest.fail(f"the server exited with {server.proc.returncode}:\n{server.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/health", timeout=2.0).status_code == 200:
                return
        time.sleep(1.0)
    pytest.fail(f"no /health within {STARTUP_TIMEOUT_S:.0f} s:\n{server.log_tail()}")


def _prompt(seed: int, tokens: int) -> list[int]:
    """Random ids: no two requests share a block, so every prompt is a real prefill."""
    rng = random.Random(seed)
    return [rng.randrange(_LOW, _HIGH) for _ in range(tokens)]


@dataclass
class Answer:
    """What one streamed request got."""

    status: int
    finishes: int = 0
    dones: int = 0
    chunks: int = 0


async def _stream(session: aiohttp.ClientSession, server: FaultServer, prompt: list[int],
                  max_tokens: int, stop_after_chunks: int | None = None) -> Answer:
    """POST a streamed completion; read to the end, or hang up after `stop_after_chunks`."""
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": True}
    async with session.post(f"{server.url}/v1/completions", json=body) as resp:
        answer = Answer(resp.status)
        if resp.status != 200:
            return answer
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                answer.dones += 1
                continue
            answer.chunks += 1
            chunk = json.loads(data)
            answer.finishes += sum(1 for c in chunk.get("choices", []) if c.get("finish_reason"))
            if stop_after_chunks is not None and answer.chunks >= stop_after_chunks:
                resp.close()  # hang up mid-stream
                return answer
    return answer


def _queues(server: FaultServer, timeout_s: float = 30.0,
            ) -> tuple[float | None, float | None, float | None]:
    """vLLM's waiting and running gauges and Fairway's fallback count (None: not reported).

    Raises:
        httpx.HTTPError: no answer within `timeout_s`, or not HTTP 200.
    """
    response = httpx.get(f"{server.url}/metrics", timeout=timeout_s)
    response.raise_for_status()
    text = response.text
    return (metric_sum(text, "vllm:num_requests_waiting"),
            metric_sum(text, "vllm:num_requests_running"),
            metric_sum(text, "fairway:policy_fallbacks_total"))


def _assert_drained_and_healthy(server: FaultServer) -> None:
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    waiting = running = fallbacks = None
    while time.monotonic() < deadline:
        waiting, running, fallbacks = _queues(server)
        if waiting == 0 and running == 0:
            break
        time.sleep(0.5)
    context = f"waiting {waiting}, running {running}\n{server.log_tail()}"
    assert waiting == 0 and running == 0, f"queues not drained in {DRAIN_TIMEOUT_S} s: {context}"
    assert fallbacks == 0, f"the policy fell back to vLLM's order: {context}"
    assert httpx.get(f"{server.url}/health", timeout=10.0).status_code == 200, context
    assert server.proc.poll() is None, context


def _assert_answered_once(answers: list[Answer], server: FaultServer) -> None:
    bad = [a for a in answers if (a.status, a.finishes, a.dones) != (200, 1, 1)]
    assert not bad, f"{len(bad)} kept requests not answered exactly once: {bad[:5]}\n" \
                    f"{server.log_tail()}"


def test_clients_that_disconnect_mid_stream(fault_server: FaultServer) -> None:
    async def run() -> list[Answer]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            leavers = [_stream(session, fault_server, _prompt(1000 + k, 300), 1700,
                               stop_after_chunks=3) for k in range(4)]
            kept = [_stream(session, fault_server, _prompt(2000 + k, 300), 16)
                    for k in range(4)]
            answers = await asyncio.gather(*leavers, *kept)
        assert all(a.status == 200 and a.chunks == 3 for a in answers[:4]), answers[:4]
        return list(answers[4:])

    _assert_answered_once(asyncio.run(run()), fault_server)
    _assert_drained_and_healthy(fault_server)


def test_abort_storm_while_waiting_and_prefilling(fault_server: FaultServer) -> None:
    n, keep_every = 300, 3

    async def cancelled_later(coro, delay_s: float) -> None:
        task = asyncio.ensure_future(coro)
        await asyncio.sleep(delay_s)
        task.cancel()  # closes the connection: vLLM aborts the request
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
            await task

    async def run() -> list[Answer]:
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=timeout) as session:
            kept, cancelled = [], []
            for i in range(n):
                if i % keep_every == 0:
                    kept.append(_stream(session, fault_server, _prompt(i, 400), 4))
                else:  # ~1,600 output tokens: only an abort ends them soon
                    cancelled.append(cancelled_later(
                        _stream(session, fault_server, _prompt(i, 400), 1600), 0.3 * (i % 10)))
            results = await asyncio.gather(asyncio.gather(*kept), asyncio.gather(*cancelled))
        return list(results[0])

    answers = asyncio.run(run())
    assert len(answers) == 100
    _assert_answered_once(answers, fault_server)
    _assert_drained_and_healthy(fault_server)


def _hold_streams(server: FaultServer, n: int) -> tuple[threading.Thread, list[str]]:
    """`n` long streams from a client that never gives up (300 s), in a thread; their outcomes."""
    outcomes: list[str] = []

    async def hold() -> None:
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=timeout) as session:
            async def one(k: int) -> None:
                try:
                    await _stream(session, server, _prompt(5000 + k, 1500), 500)
                    outcomes.append("answered")
                except (aiohttp.ClientError, TimeoutError) as exc:
                    outcomes.append(type(exc).__name__)

            await asyncio.gather(*(one(k) for k in range(n)))

    thread = threading.Thread(target=asyncio.run, args=(hold(),), daemon=True)
    thread.start()
    return thread, outcomes


@dataclass
class Sample:
    """One read of the server's queues while waiting for requests in flight."""

    at_s: float  # since the wait began
    took_s: float  # how long /metrics took to answer
    in_flight: float | None  # waiting + running; None: /metrics did not answer


def _wait_in_flight(server: FaultServer, replay: subprocess.Popen[str], at_least: int,
                    timeout_s: float) -> list[Sample]:
    """Samples of waiting + running until `at_least` are in flight, the replay ends or time is up.

    A /metrics request that fails or takes over `METRICS_TIMEOUT_S` is a sample without a count
    (it does not end the wait): a slow answer is a symptom for the failure message to show.
    """
    samples: list[Sample] = []
    began = time.monotonic()
    while time.monotonic() - began < timeout_s and replay.poll() is None:
        asked = time.monotonic()
        try:
            waiting, running, _ = _queues(server, timeout_s=METRICS_TIMEOUT_S)
            in_flight: float | None = (waiting or 0.0) + (running or 0.0)
        except httpx.HTTPError:
            in_flight = None
        samples.append(Sample(round(asked - began, 1), round(time.monotonic() - asked, 2),
                              in_flight))
        if _reached(samples, at_least):
            break
        time.sleep(0.5)
    return samples


def _reached(samples: list[Sample], at_least: int) -> bool:
    return bool(samples) and samples[-1].in_flight is not None and samples[-1].in_flight >= at_least


def _fail_before_sigterm(what: str, samples: list[Sample], replay: subprocess.Popen[str],
                         replay_log: Path, server: FaultServer, watch: MachineWatch) -> NoReturn:
    """Fail with everything that tells a slow machine from a stuck server or client."""
    machine = watch.report()  # before the replay is stopped: its CPU time is part of the story
    if replay.poll() is None:
        replay.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            replay.wait(timeout=10)
        state = "still running (stopped now)"
    else:
        state = f"exited with {replay.returncode}"
    shown = ", ".join(f"{s.at_s:.0f}s:{'-' if s.in_flight is None else f'{s.in_flight:.0f}'}"
                      f"({s.took_s:.1f}s)" for s in samples[-40:])
    pytest.fail(
        f"{what}\nsamples (time: in flight (time /metrics took); - = no answer): {shown}\n"
        f"{machine}\nthe replay {state}; its stderr:\n{replay_log.read_text(errors='replace')}\n"
        f"server log:\n{server.log_tail()}"
    )


def test_sigterm_with_a_live_replay_in_flight(fault_server: FaultServer, tmp_path: Path,
                                             e2e: SimpleNamespace) -> None:
    trace = tmp_path / "flood.jsonl"
    # Built against 28,000 tokens/s, well above what the tiny model serves on a 2-core CPU
    # (~7,000-12,000 prompt tokens/s): at 7,000 a fast machine kept up, nothing was ever queued,
    # and the replay ended before 16 requests were in flight.
    assert fairway_main([
        "trace", "build", "flood", "--shape", "backlog:1.3:20,flood:0.9:20",
        "--capacity-tps", "28000", "--param", "prefix_tokens=1024", "--param", "suffix_tokens=128",
        "--param", "miss_tokens=1536", "-o", str(trace),
    ]) == 0
    watch = MachineWatch.start(e2e.process_tree(fault_server.proc.pid))
    replay_timeout_s = 300
    replay_log = tmp_path / "replay.stderr"
    with open(replay_log, "w") as err_file:  # a file, not a pipe: a full pipe would stall it
        replay = subprocess.Popen(
            [*e2e.fairway_command(), "replay", "--url", fault_server.url, "--trace", str(trace),
             "--timeout-s", str(replay_timeout_s), "--no-progress", "--out", str(tmp_path / "out")],
            stdout=subprocess.DEVNULL, stderr=err_file, text=True,
        )
    watch.add([replay.pid])
    holder: threading.Thread | None = None
    held: list[str] = []
    try:
        # The replay starts first, the held streams once it is sending (its start-up takes seconds
        # to tens of seconds on a busy 2-core machine): started together, the 12 held streams could
        # be answered before the replay sent anything, and the server would be stopped idle.
        samples = _wait_in_flight(fault_server, replay, at_least=1,
                                  timeout_s=REPLAY_START_TIMEOUT_S)
        if not _reached(samples, 1):
            _fail_before_sigterm(f"the replay sent nothing in {REPLAY_START_TIMEOUT_S:.0f} s",
                                 samples, replay, replay_log, fault_server, watch)
        holder, held = _hold_streams(fault_server, 12)
        samples += _wait_in_flight(fault_server, replay, at_least=16, timeout_s=IN_FLIGHT_TIMEOUT_S)
        if not _reached(samples, 16) or replay.poll() is not None:
            _fail_before_sigterm(f"the replay and the held streams were never 16 in flight "
                                 f"(held streams so far: {held})",
                                 samples, replay, replay_log, fault_server, watch)
        tree = set(e2e.process_tree(fault_server.proc.pid))
        stopped_at = time.monotonic()
        fault_server.proc.send_signal(signal.SIGTERM)
        code = fault_server.proc.wait(timeout=GRACE_S + 30)
        server_s = time.monotonic() - stopped_at
        replay.wait(timeout=90)
        replay_s = time.monotonic() - stopped_at
    finally:
        if replay.poll() is None:
            replay.kill()
            replay.wait()
    assert holder is not None
    holder.join(timeout=30)
    log = fault_server.log_tail()
    err = replay_log.read_text(errors="replace")
    # 143: killed after the grace (vLLM 0.32 waits for the held streams); 0: it exited by itself.
    assert code in (0, 128 + signal.SIGTERM), f"server exit code {code}\n{log}"
    assert not holder.is_alive() and len(held) == 12, f"held streams still open: {held}"
    assert server_s < GRACE_S + 15, f"the server took {server_s:.1f} s to stop\n{log}"
    gone_by = time.monotonic() + 10
    while e2e.alive(tree) and time.monotonic() < gone_by:
        time.sleep(0.2)
    assert not e2e.alive(tree), f"left behind: {e2e.alive(tree)}"
    assert replay.returncode == 1, f"replay exit {replay.returncode}\n{err}"
    assert "the server stopped answering" in err, err
    assert replay_s < 60, f"the replay took {replay_s:.0f} s after SIGTERM\n{err}"
    print(f"server stopped {server_s:.1f} s and the replay {replay_s:.1f} s after SIGTERM; "
          f"killed after the grace: {'did not exit within' in log}")
