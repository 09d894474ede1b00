"""A fault-injecting OpenAI-compatible endpoint: a reverse proxy in front of the simulated policy.

Each request, by a seeded draw: ``fail`` -> HTTP 500, ``hang`` -> no answer for ``hang_s``, else
forwarded to the upstream as is. ``mode="context"`` answers every request with the 400 a vLLM
server gives for a prompt over its context window; ``mode="reject"`` with a plain 400.
Real HTTP on 127.0.0.1, bounded: a hang ends after ``hang_s``.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web


@dataclass
class FaultyPolicy:
    upstream: str
    """Base URL of the real (simulated) policy, e.g. http://127.0.0.1:8000/v1."""
    fail: float = 0.0
    hang: float = 0.0
    hang_s: float = 60.0
    mode: str = "faults"
    seed: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    url: str = ""
    _runner: web.AppRunner | None = None
    _http: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/{path:.*}", self._handle)
        self._rng = random.Random(self.seed)
        self._http = aiohttp.ClientSession()
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.mode == "context":
            self.counts["context"] += 1
            msg = "This model's maximum context length is 4096 tokens. However, you requested 9000 tokens."
            return web.json_response({"error": {"message": msg}}, status=400)
        if self.mode == "reject":
            self.counts["reject"] += 1
            return web.json_response({"error": {"message": "unsupported parameter"}}, status=400)
        draw = self._rng.random()
        if draw < self.fail:
            self.counts["500"] += 1
            return web.json_response({"error": {"message": "injected fault"}}, status=500)
        if draw < self.fail + self.hang:
            self.counts["hang"] += 1
            await asyncio.sleep(self.hang_s)
            return web.json_response({"error": {"message": "hung"}}, status=504)
        self.counts["ok"] += 1
        assert self._http is not None
        headers = {k: v for k, v in request.headers.items() if k.lower().startswith("x-gymbus")}
        target = f"{self.upstream.rstrip('/')}/{request.match_info['path']}"
        async with self._http.post(
            target, data=await request.read(), headers=headers | {"Content-Type": "application/json"}
        ) as up:
            return web.Response(body=await up.read(), status=up.status, content_type="application/json")
