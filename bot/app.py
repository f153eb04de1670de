"""The composition root `ragbot run` uses: settings are read once here, the knowledge base is opened once, and
every configured chat adapter, the HTTP server (/healthz, /metrics, Slack's events in HTTP mode) and the background
services (the sync scheduler) start and stop together.

With no chat tokens configured, `ragbot run` opens the terminal chat instead.

The adapters are those of the registered platforms (`bot.platforms`) whose token is set. An adapter is any object
with
    name: str
    routes() -> list[aiohttp.web.RouteDef]      # HTTP routes it serves on PORT (may be empty)
    async start() -> None                         # connect; returns once it is running
    async stop() -> None
built from a `BotContext` (the knowledge base, the settings, the metrics, the bot's own state). Background services (the scheduler)
have the same start/stop shape and are added to `BotApp.services`.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web

from bot.chat.retention import RetentionService
from bot.chat.state import BotState
from bot.context import BotContext
from bot.platforms import platforms
from bot.server import BotMetrics, StartupError, build_web_app, start_web_server
from bot.settings import BotSettings
from bot.web.admin import admin_routes
from db.settings import DatabaseSettings
from knowledge import KnowledgeBase, KnowledgeSettings
from knowledge.ingest.schedule import SchedulerService

logger = logging.getLogger(__name__)


class Adapter(Protocol):
    name: str

    def routes(self) -> list[web.RouteDef]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def configured_adapters(context: BotContext) -> list[Adapter]:
    """One adapter per registered platform whose token is set (bot.platforms); only their client libraries load."""
    return [spec.adapter(context) for spec in platforms() if spec.configured(context.settings)]


@dataclass
class BotApp:
    settings: BotSettings
    knowledge_settings: KnowledgeSettings | None = None
    database_settings: DatabaseSettings | None = None
    kb: KnowledgeBase | None = None  # given: used as is and not closed here (tests)
    adapters: list[Adapter] | None = None  # given: used instead of the configured ones (tests)
    services: list[Service] = field(default_factory=list)
    metrics: BotMetrics = field(default_factory=BotMetrics)
    port: int | None = None  # the bound port once started
    _runner: web.AppRunner | None = None
    _owns_kb: bool = False
    _encoder_build: asyncio.Task[str | None] | None = None
    _started: list[Service] = field(default_factory=list)

    async def start(self) -> None:
        if self.kb is None:
            self.kb = await KnowledgeBase.open(self.knowledge_settings, self.database_settings)
            self._owns_kb = True
        kb = self.kb
        context = BotContext(kb, self.settings, self.metrics, BotState.answering(kb))
        if self.adapters is None:
            self.adapters = configured_adapters(context)
        routes = [route for adapter in self.adapters for route in adapter.routes()]
        if self.settings.admin_token is not None and self.settings.admin_token.get_secret_value():
            routes += admin_routes(kb, context.state, self.settings.admin_token.get_secret_value())
        self._runner, self.port = await start_web_server(build_web_app(kb, self.metrics, routes), self.settings.host,
                                                         self.settings.port)
        logger.info("HTTP server on port %s: /healthz, /metrics%s", self.port,
                    "".join(f", {r.path}" for r in routes if hasattr(r, "path")))
        # The platforms connect before the model loads: a taken PORT, a refused token, an unreachable platform or a
        # missing scope is one line within a second or two, without first paying for torch and the weights (about
        # 10 CPU seconds on a small machine, all wasted when the start fails). A question that arrives meanwhile is
        # answered (questions are embedded by the light encoder); /healthz says "not loaded" until the model is.
        for adapter in self.adapters:
            await adapter.start()
            self._started.append(adapter)
        # Load the embedding model now: the first question should not wait for it, and /healthz reports it.
        await asyncio.to_thread(lambda: kb.embedder.model)
        if kb.query_encoder_missing():
            # torch is loaded now: build the fast question encoder's file in the background (questions use the
            # NumPy encoder until it is ready).
            logger.info("Building the ONNX question encoder in the background (once; a few seconds)")
            self._encoder_build = asyncio.create_task(kb.prepare_query_encoder())
        # Questions are embedded by the encoder `Embedder.embed` picks for one text (ONNX Runtime, or NumPy until its
        # file is built), which loads on first use: warm it too, or the first question pays for it (measured by
        # bench/bot_bench.py: 0.44 s of a first mention's 0.78 s).
        await asyncio.to_thread(kb.embedder.embed, ["warm up"])
        await kb.prepare_language_check()  # jieba's dictionary: else the first question waits seconds for it
        for service in self.services:  # the scheduler's syncs need the model: they start once it is loaded
            await service.start()
            self._started.append(service)

    def opened_kb(self) -> KnowledgeBase:
        """The knowledge base, for the services: they start after `start` has opened it."""
        assert self.kb is not None, "BotApp.start opens the knowledge base before the services start"
        return self.kb

    async def stop(self) -> None:
        for part in reversed(self._started):
            try:
                await part.stop()
            except Exception:
                logger.exception("stopping %r failed", part)
        self._started.clear()
        if self._encoder_build is not None:  # a build runs in a thread, which cannot be cancelled: let it finish
            await asyncio.gather(self._encoder_build, return_exceptions=True)
            self._encoder_build = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._owns_kb and self.kb is not None:
            await self.kb.close()
            self.kb = None

    async def serve_forever(self) -> None:
        """Run until SIGINT/SIGTERM (a container's stop), then shut down cleanly. A failed start stops what had
        started (the database, the HTTP server, connected adapters) before the error goes on."""
        stop = stop_on_signals()
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        try:
            await stop.wait()
        finally:
            await self.stop()


def stop_on_signals() -> asyncio.Event:
    """An event that SIGINT or SIGTERM (Ctrl-C, or a container's stop) sets, for a clean shutdown."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    return stop


def build_app(
    settings: BotSettings, knowledge_settings: KnowledgeSettings | None = None,
    database_settings: DatabaseSettings | None = None,
) -> BotApp:
    """The bots with their background services: the sync scheduler runs beside them unless RUN_SCHEDULER=false
    (a deployment that runs `ragbot scheduler` as its own process)."""
    app = BotApp(settings, knowledge_settings, database_settings)
    if settings.run_scheduler:
        app.services.append(SchedulerService(app.opened_kb))
        app.services.append(RetentionService(app.opened_kb, settings.retention_days))
    return app


def run(settings: BotSettings | None = None, runner: Callable[..., object] | None = None,
        terminal_chat: Callable[[], None] | None = None) -> None:
    """`ragbot run`: the chat bots when tokens are set, otherwise `terminal_chat` (the CLI passes its terminal chat,
    so nothing here imports bot.cli). `runner` runs the coroutine factory (the CLI passes the one that turns known
    errors into one-line messages)."""
    settings = settings or BotSettings()
    if not settings.chat_platforms and settings.terminal_chat and terminal_chat is not None:
        terminal_chat()
        return
    app = build_app(settings, KnowledgeSettings(), DatabaseSettings())
    what = " and ".join(settings.chat_platforms) or "without a chat platform (no platform's token is set: see .env.example)"
    print(f"ragbot: starting {what} (health and metrics on port {settings.port})", flush=True)

    async def serve() -> int:
        try:
            await app.serve_forever()
        except StartupError as exc:
            return startup_failed(exc)
        return 0

    status = asyncio.run(serve()) if runner is None else runner(serve)
    exit_after_clean_stop(status if isinstance(status, int) else 0)


def startup_failed(exc: StartupError) -> int:
    """One line on stderr naming the setting and the fix, and exit status 2 (as every CLI error); the traceback
    only with LOG_LEVEL=DEBUG (a wrong token is a setting to change, not a bug to report)."""
    logger.debug("ragbot run could not start", exc_info=exc)
    print(f"Error: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
    return 2


def exit_after_clean_stop(status: int = 0) -> None:
    """End `ragbot run` once the bots have stopped and the database is closed: run the atexit handlers (the
    embedded server's bookkeeping, log flushing), then skip the interpreter's teardown of torch and transformers,
    which writes nothing and took 9 s on 2 cores: most of the 10 s a container's stop allows."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
