"""The bot's HTTP server: `GET /healthz`, `GET /metrics`, plus whatever routes adapters add (Slack's
`POST /slack/events` in HTTP mode). One aiohttp application on PORT, in every mode.

Metrics live in a registry of their own (not prometheus-client's global one), so several bots in one process —
tests, for instance — never share counters.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import text

if TYPE_CHECKING:
    from db.replicas import ReadRouter
    from knowledge import Answer, KnowledgeBase

logger = logging.getLogger(__name__)

# Seconds: retrieval takes milliseconds, generation seconds.
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60)


class BotMetrics:
    """What /metrics reports. Adapters call the `count_*`/`observe_*` helpers with their platform's name."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.replicas_watched = False  # the standbys' collector is registered (build_web_app)
        r = self.registry
        self.questions = Counter("ragbot_questions", "Questions received.", ["platform"], registry=r)
        self.answers = Counter("ragbot_answers", "Answers posted, by mode (llm, extractive).",
                               ["platform", "mode"], registry=r)
        self.abstentions = Counter("ragbot_abstentions", "Answers that said the documents don't cover it.",
                                   ["platform"], registry=r)
        self.errors = Counter("ragbot_errors", "Failures shown to users as an apology, by stage.",
                              ["platform", "stage"], registry=r)
        self.feedback = Counter("ragbot_feedback", "Feedback clicks, by rating (up, down).",
                                ["platform", "rating"], registry=r)
        self.duplicate_events = Counter("ragbot_duplicate_events", "Retried or duplicate events ignored.",
                                        ["platform"], registry=r)
        self.resumed_answers = Counter("ragbot_resumed_answers", "Questions taken over after their holder's lease "
                                       "ran out undelivered (a crash), by who took them (retry, sweeper).",
                                       ["platform", "by"], registry=r)
        self.stage_seconds = Histogram("ragbot_stage_seconds", "Latency per answer stage (retrieval, generation, "
                                       "first_text, total, ...).", ["stage"], buckets=_BUCKETS, registry=r)

    def observe_answer(self, platform: str, answer: Answer, total_seconds: float | None = None) -> None:
        self.answers.labels(platform, answer.mode).inc()
        if answer.abstained:
            self.abstentions.labels(platform).inc()
        for name, milliseconds in answer.timings.items():
            if name.endswith("_ms"):
                self.stage_seconds.labels(name[:-3]).observe(milliseconds / 1000)
        if total_seconds is not None:
            self.stage_seconds.labels("total").observe(total_seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclass
class Health:
    ok: bool
    checks: dict[str, str] = field(default_factory=dict)


async def check_health(kb: KnowledgeBase, timeout: float = 3.0) -> Health:
    """Healthy when the database answers and the embedding model is loaded (answers need both)."""
    checks: dict[str, str] = {}
    try:
        async with asyncio.timeout(timeout):
            async with kb.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:  # any failure means unhealthy; the reason is logged, never the URL's password
        logger.warning("health check: database unreachable: %s", type(exc).__name__)
        checks["database"] = f"unreachable ({type(exc).__name__})"
    # Embedder.model is a cached_property: present in __dict__ once the weights are loaded.
    checks["model"] = "ok" if "model" in vars(kb.embedder) else "not loaded"
    ok = all(v == "ok" for v in checks.values())
    # Standbys (DATABASE_REPLICA_URLS) are shown, but a skipped one leaves the bot healthy: the primary serves.
    if kb.replicas is not None:
        checks.update({f"replica {name}": state for name, state in kb.replicas.states().items()})
    return Health(ok, checks)


class ReplicaCollector(Collector):
    """The standbys' state at each scrape (db.replicas.ReadRouter): lag, whether each serves reads, and read
    connections opened per server."""

    def __init__(self, replicas: ReadRouter) -> None:
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily("ragbot_replica_lag_seconds", "How far each standby is behind the primary (NaN: not "
                                "answering).", labels=["replica"])
        serving = GaugeMetricFamily("ragbot_replica_serving", "1 when the standby serves reads, 0 when it is skipped "
                                    "(lagging past REPLICA_MAX_LAG_SECONDS or not answering).", labels=["replica"])
        connections = CounterMetricFamily("ragbot_read_connections", "Read connections opened, per server.",
                                          labels=["server"])
        for replica in self.replicas.replicas:
            lag.add_metric([replica.name], math.nan if replica.lag_seconds is None else replica.lag_seconds)
            serving.add_metric([replica.name], 1.0 if self.replicas.usable(replica) else 0.0)
            connections.add_metric([replica.name], replica.reads)
        connections.add_metric(["primary"], self.replicas.primary_reads)
        yield from (lag, serving, connections)


def build_web_app(
    kb: KnowledgeBase, metrics: BotMetrics, routes: Sequence[web.RouteDef] = (),
    extra_health: Mapping[str, object] | None = None,
) -> web.Application:
    """/healthz and /metrics, plus adapter routes."""

    async def healthz(_request: web.Request) -> web.Response:
        health = await check_health(kb)
        body = {"status": "ok" if health.ok else "unhealthy", **health.checks}
        return web.json_response(body, status=200 if health.ok else 503)

    async def metrics_endpoint(_request: web.Request) -> web.Response:
        response = web.Response(body=metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    if kb.replicas is not None and not metrics.replicas_watched:
        metrics.registry.register(ReplicaCollector(kb.replicas))
        metrics.replicas_watched = True  # one collector per registry
    app = web.Application(client_max_size=1024 * 1024)
    app.add_routes([web.get("/healthz", healthz), web.get("/metrics", metrics_endpoint), *routes])
    return app


class StartupError(ValueError):
    """`ragbot run` cannot start: a platform refused a token or is unreachable, a scope is missing, PORT is taken.
    Its message is the one line shown (no traceback unless LOG_LEVEL=DEBUG) and names the setting and the fix."""


class PortUnavailable(StartupError):
    """PORT cannot be bound (in use, or not allowed): the CLI prints this one line instead of a traceback."""


async def start_web_server(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (to stop it) and the bound port (useful with port 0)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        reason = "is already in use (another `ragbot run`?)" if exc.errno == errno.EADDRINUSE else (
            f"cannot be opened ({exc.strerror or exc})")
        raise PortUnavailable(f"port {port} on {host} {reason}; set PORT to a free port, or stop the other process") \
            from None
    bound = port
    server = getattr(site, "_server", None)
    if server is not None and server.sockets:
        bound = server.sockets[0].getsockname()[1]
    return runner, bound
