"""A worker's metrics and health, served by a tiny Starlette app (``gymbus worker --http-port``).

    GET /metrics   Prometheus text: messages processed, retried and failed (by kind), in flight,
                   handler duration and queue wait (histograms, by role), readiness
    GET /healthz   200 {"status": "ok"} once connected to the broker with its consumers bound;
                   503 with the status (starting, disconnected, draining) otherwise

Counters are read from the worker's ``stats`` at scrape time, so the hot path only observes two
histograms. Each worker has its own registry (several workers can share a process in tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runtime.telemetry import tracing

if TYPE_CHECKING:
    from runtime.engine.worker import Worker

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class WorkerMetrics:
    """The histograms a worker observes per message, in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["function", "role"]
        self.handler = Histogram(
            "gymbus_handler_duration_seconds",
            "Time from taking a message to settling it (ack, nak or term).",
            labels,
            registry=self.registry,
            buckets=_BUCKETS,
        )
        self.queue_wait = Histogram(
            "gymbus_queue_wait_seconds",
            "Time a message waited in the stream before a worker took it.",
            labels,
            registry=self.registry,
            buckets=_BUCKETS,
        )

        self._series: dict[tuple[str, str], tuple[Any, Any]] = {}

    def observe(self, function: str, role: str, handler_s: float, queued_s: float) -> None:
        series = self._series.get((function, role))
        if series is None:  # labels() takes a lock and builds a key: do it once per series
            series = self._series[(function, role)] = (
                self.handler.labels(function, role),
                self.queue_wait.labels(function, role),
            )
        series[0].observe(handler_s)
        series[1].observe(queued_s)


class StatsCollector(Collector):
    """The worker's ``stats`` Counter as Prometheus counters and gauges, read at scrape time."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        w, stats = self.worker, dict(self.worker.stats)
        processed = CounterMetricFamily("gymbus_messages_processed", "Messages handled and acked.", labels=["function"])
        processed.add_metric([w.name], stats.get("processed", 0))
        retried = CounterMetricFamily(
            "gymbus_messages_retried", "Messages handed back for redelivery (nak).", labels=["function"]
        )
        retried.add_metric([w.name], stats.get("retried", 0))
        failures = CounterMetricFamily(
            "gymbus_failures", "Messages that ended their rollout as a failure, by kind.", labels=["function", "kind"]
        )
        for key, n in sorted(stats.items()):
            if key.startswith("failed:"):
                failures.add_metric([w.name, key.split(":", 1)[1]], n)
        in_flight = GaugeMetricFamily("gymbus_in_flight", "Messages being handled now.", labels=["function"])
        in_flight.add_metric([w.name], stats.get("in_flight", 0))
        ready = GaugeMetricFamily("gymbus_ready", "1 when /healthz answers 200.", labels=["function"])
        ready.add_metric([w.name], 1.0 if w.health() == "ok" else 0.0)
        yield from (processed, retried, failures, in_flight, ready)


def app(worker: Worker) -> Starlette:
    worker.metrics.registry.register(StatsCollector(worker))

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(worker.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def healthz(request: Request) -> JSONResponse:
        status = worker.health()
        return JSONResponse({"status": status, "function": worker.name}, status_code=200 if status == "ok" else 503)

    application = Starlette(routes=[Route("/metrics", metrics), Route("/healthz", healthz)])
    tracing.instrument_app(application)
    return application


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the worker handles SIGTERM itself (it drains); uvicorn must not take the signal


class HttpServer:
    """/metrics and /healthz on the worker's own event loop (a stuck loop fails the probe, as it should)."""

    def __init__(self, server: uvicorn.Server, task: asyncio.Task[None], port: int) -> None:
        self.server, self.task, self.port = server, task, port

    @classmethod
    async def start(cls, worker: Worker, port: int, host: str = "0.0.0.0") -> HttpServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        worker.http_port = sock.getsockname()[1]
        config = uvicorn.Config(app(worker), log_level="warning", access_log=False, lifespan="off")
        server = _Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        return cls(server, task, worker.http_port)

    async def stop(self) -> None:
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
