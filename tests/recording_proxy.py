"""A recording reverse proxy in front of a model server (real HTTP on 127.0.0.1): every exchange is
kept byte for byte (to compare what gymbus stored with what the server said), and routes can be
hidden (answered 404, as a server without them would). It passes the trace context on as it came
and makes no spans of its own (its client is left out of the process's aiohttp instrumentation)."""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor


@dataclass
class Exchange:
    path: str
    request: bytes
    status: int
    response: bytes
    headers: dict[str, str] = field(default_factory=dict)
    """The request's headers, as the client sent them."""


@dataclass
class RecordingProxy:
    upstream: str
    """The server's root URL (``http://host:port``)."""
    hide: set[str] = field(default_factory=set)
    """Paths answered 404 without reaching the server (e.g. ``/v1/responses``)."""
    exchanges: list[Exchange] = field(default_factory=list)
    root: str = ""
    _runner: web.AppRunner | None = None
    _http: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"{self.root}/v1"

    def on(self, path: str) -> list[Exchange]:
        return [x for x in self.exchanges if x.path == path]

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        AioHttpClientInstrumentor.uninstrument_session(self._http)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.root = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.path in self.hide:
            self.exchanges.append(Exchange(request.path, body, 404, b'{"detail":"Not Found"}', dict(request.headers)))
            return web.json_response({"detail": "Not Found"}, status=404)
        assert self._http is not None
        passed = ("content-type", "authorization", "traceparent", "tracestate")
        headers = {k: v for k, v in request.headers.items() if k.lower() in passed}
        async with self._http.request(request.method, self.upstream + request.path_qs, data=body, headers=headers) as r:
            raw = await r.read()
            self.exchanges.append(Exchange(request.path, body, r.status, raw, dict(request.headers)))
            return web.Response(body=raw, status=r.status, content_type=r.content_type)
