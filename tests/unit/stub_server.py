"""An aiohttp app served from a background thread, for tests of HTTP clients (live, profiler).

The server runs on its own event loop so that the client under test cannot slow it down.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from aiohttp import web


@contextlib.contextmanager
def serve_app(app: web.Application) -> Iterator[str]:
    """Serve `app` on a free port of 127.0.0.1; yields its base URL, stops it on exit."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict = {}

    async def start() -> None:
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        holder["runner"] = runner
        holder["url"] = f"http://127.0.0.1:{runner.addresses[0][1]}"

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10), "the stub server did not start"
    try:
        yield holder["url"]
    finally:
        asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
