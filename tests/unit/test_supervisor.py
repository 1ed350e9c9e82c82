"""The server supervisor with a stand-in server (a small Python HTTP server in a child process).

The stand-in answers /health like vLLM and, depending on `--mode`, exits at start, never becomes
healthy, or ignores SIGINT (and SIGTERM), so every path of start, wait and stop is exercised.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

import pytest

from fairway import client, supervisor
from fairway.supervisor import ServerStartError

pytestmark = pytest.mark.timeout(60)

STAND_IN = r'''
import argparse, http.server, signal, sys

parser = argparse.ArgumentParser()
parser.add_argument("--host")
parser.add_argument("--port", type=int)
parser.add_argument("--mode", default="ok")
args = parser.parse_args()
if args.mode == "exit":
    print("boom: no such model", flush=True)
    sys.exit(3)
if args.mode in ("ignore-int", "ignore-term"):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
if args.mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/health" and args.mode != "never-ready"
        self.send_response(200 if ok else 503)
        self.end_headers()

    def log_message(self, *_):
        pass


server = http.server.HTTPServer((args.host, args.port), Handler)
print(f"listening on {args.host}:{args.port}", flush=True)
try:
    server.serve_forever()
except KeyboardInterrupt:
    print("clean shutdown", flush=True)
'''


@pytest.fixture(scope="module")
def command(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    script = tmp_path_factory.mktemp("stand-in") / "server.py"
    script.write_text(STAND_IN)
    return [sys.executable, str(script)]


def healthy(url: str) -> bool:
    async def probe() -> bool:
        async with client.new_session() as session:
            return await client.is_healthy(session, url)

    return asyncio.run(probe())


def test_runs_on_localhost_until_healthy_and_stops_with_sigint(command, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    lines: list[str] = []
    with supervisor.running_server(command, ["--mode", "ok"], log_path=log,
                                   startup_timeout_s=30, say=lines.append) as server:
        assert server.url.startswith("http://127.0.0.1:") and healthy(server.url)
        assert server.argv[len(command):len(command) + 2] == ["--host", "127.0.0.1"]
    assert server.proc.returncode == 0  # SIGINT was enough
    assert "clean shutdown" in log.read_text()  # a given log is kept
    assert lines[0].startswith("starting ") and lines[1] == f"server ready at {server.url}"
    assert not healthy(server.url)


def test_a_server_started_while_sigint_is_ignored_still_stops_with_sigint(
    command, tmp_path: Path
) -> None:
    """A process started with SIGINT ignored (`cmd &` from a script) passes that on to its
    children; the server gets SIGINT's default back, so `stop`'s SIGINT still ends it cleanly
    (not SIGTERM after the timeout)."""
    log = tmp_path / "server.log"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        server = supervisor.start(command, ["--mode", "ok"], log_path=log)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        supervisor.wait_healthy(server, 30)
    finally:
        code = supervisor.stop(server, shutdown_timeout_s=20)
    assert code == 0 and "clean shutdown" in log.read_text()


def test_a_temporary_log_is_removed_after_a_clean_run_and_kept_after_an_error(command) -> None:
    with supervisor.running_server(command, startup_timeout_s=30) as server:
        assert server.log_path.exists()
    assert not server.log_path.exists()
    running = supervisor.running_server(command, startup_timeout_s=30)
    with pytest.raises(RuntimeError, match="measurement failed"), running as server:
        raise RuntimeError("measurement failed")
    assert server.proc.returncode is not None  # stopped all the same
    assert "listening" in server.log_path.read_text()
    server.log_path.unlink()


def test_a_server_that_exits_at_start_is_an_error_with_its_log(command, tmp_path: Path) -> None:
    running = supervisor.running_server(command, ["--mode", "exit"], log_path=tmp_path / "l",
                                        name="the vLLM server")
    with pytest.raises(ServerStartError) as err, running:
        pytest.fail("must not be reached")
    message = str(err.value)
    assert "the vLLM server" in message and "exited with code 3" in message
    assert "boom: no such model" in message


def test_a_server_never_healthy_times_out_with_its_log(command, tmp_path: Path) -> None:
    started = time.monotonic()
    running = supervisor.running_server(command, ["--mode", "never-ready"],
                                        log_path=tmp_path / "l", startup_timeout_s=2)
    with pytest.raises(ServerStartError, match=r"did not answer .*/health within 2 s") as err, \
            running:
        pytest.fail("must not be reached")
    assert "listening on 127.0.0.1" in str(err.value)
    assert time.monotonic() - started < 20


@pytest.mark.parametrize(
    ("mode", "signum"), [("ignore-int", signal.SIGTERM), ("ignore-term", signal.SIGKILL)]
)
def test_stop_escalates_to_sigterm_then_sigkill(
    command, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, signum: int
) -> None:
    monkeypatch.setattr(supervisor, "_TERM_TIMEOUT_S", 0.5)
    server = supervisor.start(command, ["--mode", mode], log_path=tmp_path / "l")
    supervisor.wait_healthy(server, 30)
    assert supervisor.stop(server, shutdown_timeout_s=0.5) == -signum
    assert supervisor.alive({server.proc.pid}) == []
