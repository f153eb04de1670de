"""How every fake server in tests/fakes is served: on a free port of 127.0.0.1, from a thread of its own, started and
stopped the same way (`start()`/`stop()`, or `with Fake() as fake:`), its address at `url`.

A fake answers from its own thread so that it answers while the test's event loop is busy awaiting the client
under test (a fake on the test's loop could not answer a client that blocks it, as MSAL and httplib2 do). Two kinds:

- `AiohttpServer`: an aiohttp application (or several: the Teams fake serves plain HTTP, TLS and a proxy) on the
  thread's own event loop. A subclass builds them in `_start_servers` with `serve(app)` and closes what else it
  holds open (websockets, tunnels) in `_close`; `run_in_loop` hands a coroutine to that loop from a test.
- `HTTPServerThread`: a standard-library `ThreadingHTTPServer` (one thread per request), for fakes written as a
  `BaseHTTPRequestHandler`; a subclass gives the handler class in `_handler`.

`serve_app` is the one aiohttp start-up both use, also for servers that run on the test's own loop (the fake
Discord, the Teams bot under test).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from aiohttp import web

HOST = "127.0.0.1"
START_SECONDS = 20  # a fake that is not listening by then fails the test at once, not at its first request
STOP_SECONDS = 10


async def serve_app(app: web.Application, *, ssl_context: Any = None) -> tuple[web.AppRunner, int]:
    """Serve `app` on a free port of 127.0.0.1 on the running loop; its runner (to clean up) and the port."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, HOST, 0, ssl_context=ssl_context)
    await site.start()
    return runner, int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]


class _Lifecycle:
    """start()/stop() as a context manager, and the address of the fake's (main) server."""

    port: int

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class AiohttpServer(_Lifecycle):
    """A fake made of aiohttp servers running on an event loop of its own, in a daemon thread."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._runners: list[web.AppRunner] = []
        self.port = 0

    async def _start_servers(self) -> None:
        """Build and serve the fake's applications (`self.port = await self.serve(app)`)."""
        raise NotImplementedError

    async def _close(self) -> None:
        """Close what the fake holds open besides its servers (open websockets, tunnels): runs before they stop."""

    async def serve(self, app: web.Application, *, ssl_context: Any = None) -> int:
        """Serve one more application (cleaned up at `stop`); its port."""
        runner, port = await serve_app(app, ssl_context=ssl_context)
        self._runners.append(runner)
        return port

    def run_in_loop(self, work: Coroutine[Any, Any, Any]) -> Future[Any]:
        """Run a coroutine on the fake's loop (from a test's thread or loop: `await asyncio.wrap_future(...)`)."""
        return asyncio.run_coroutine_threadsafe(work, self._loop)

    def start(self) -> Self:
        started = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._start_servers())
            except BaseException as exc:  # raised in the test's thread below
                errors.append(exc)
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name=type(self).__name__, daemon=True)
        self._thread.start()
        if not started.wait(START_SECONDS):
            raise RuntimeError(f"{type(self).__name__} did not start within {START_SECONDS} s")
        if errors:
            self.stop()
            raise errors[0]
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            await self._close()
            for runner in self._runners:
                await runner.cleanup()

        self.run_in_loop(shutdown()).result(STOP_SECONDS)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(STOP_SECONDS)


class HTTPServerThread(_Lifecycle):
    """A fake served by the standard library's ThreadingHTTPServer (bound at construction, so `url` is known
    before `start`), its accept loop in a daemon thread."""

    # Handler threads are daemons unless a fake wants `stop` to wait for the requests it is still answering.
    daemon_threads = True

    def __init__(self) -> None:
        self._server = ThreadingHTTPServer((HOST, 0), self._handler())
        self._server.daemon_threads = self.daemon_threads
        self._thread: threading.Thread | None = None
        self.port = int(self._server.server_address[1])

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        """The request handler class (it reaches the fake through a class attribute or a closure)."""
        raise NotImplementedError

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=type(self).__name__, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(STOP_SECONDS)
