"""Serving an ASGI app on a socket of its own: in the foreground, or from a thread (the simulated
policy, the tests' stand-ins)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect
from starlette.responses import Response

Answer = bytes | Response
"""What a `BarePost` handler returns: a JSON body to send with status 200, or any other response."""


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # so asyncio sets TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def server(app: Starlette) -> uvicorn.Server:
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2)
    return uvicorn.Server(config)


class InThread:
    """Serve an ASGI app from a thread on a free port (tests, and the in-process CLI)."""

    def __init__(self, app: Starlette, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sock = bind(host, port)
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = server(app)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True)

    def __enter__(self) -> InThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


class BarePost:
    """A POST route's endpoint as a bare ASGI app: ``handle(body, header)`` gets the request body and
    one header's value ("" without it) and returns an `Answer`. Starlette's Request and Response, and
    the wrappers around them, cost ~5 µs per call: the simulated policy's hot routes do without."""

    def __init__(self, handle: Callable[[bytes, str], Awaitable[Answer]], header: bytes) -> None:
        self.handle, self.header = handle, header

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect  # as Starlette's Request.body()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        value = next((v.decode("latin-1") for k, v in scope["headers"] if k == self.header), "")
        answer = await self.handle(body, value)
        if not isinstance(answer, bytes):
            await answer(scope, receive, send)
            return
        headers = [(b"content-length", str(len(answer)).encode()), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})
