"""A readiness probe for processes that serve no /metrics: ``GET /healthz`` (``gymbus profiler``
and ``gymbus janitor --http-port PORT``).

    200 {"status": "ok"}      connected to the broker and bound to its durable consumer
    503 {"status": ...}       starting, disconnected or draining

It runs on the process's own event loop, so a stuck loop fails the probe. The container image's
health check (images/function/healthcheck.py) asks it, as it asks a worker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterator

import uvicorn
from nats.aio.client import Client
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


def status(*, stopping: asyncio.Event, ready: asyncio.Event, nc: Client | None) -> str:
    """A long-running process's health: ``ok`` once connected with its consumers bound; otherwise
    starting, disconnected or draining."""
    if stopping.is_set():
        return "draining"
    if not ready.is_set():
        return "starting"
    return "ok" if nc is not None and nc.is_connected else "disconnected"


def app(health: Callable[[], str]) -> Starlette:
    async def healthz(request: Request) -> JSONResponse:
        status = health()
        return JSONResponse({"status": status}, status_code=200 if status == "ok" else 503)

    return Starlette(routes=[Route("/healthz", healthz)])


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the process handles SIGTERM itself (it drains or writes its last state)


class HealthServer:
    """``/healthz`` answered from ``health()`` on 0.0.0.0:``port`` (0: a free port, see ``port``)."""

    def __init__(self, server: uvicorn.Server, task: asyncio.Task[None], port: int) -> None:
        self.server, self.task, self.port = server, task, port

    @classmethod
    async def start(cls, health: Callable[[], str], port: int, host: str = "0.0.0.0") -> HealthServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(16)
        config = uvicorn.Config(app(health), log_level="warning", access_log=False, lifespan="off")
        server = _Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        return cls(server, task, sock.getsockname()[1])

    async def stop(self) -> None:
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
