"""An OpenEnv session host: each gymbus rollout's OpenEnv session, kept open between its steps.

An OpenEnv server gives each WebSocket connection (``/ws``) its own environment instance, and its
HTTP ``/reset`` and ``/step`` each build a fresh one: an episode lives as long as one connection.
gymbus's workers hold nothing between messages, so this small HTTP service holds the connections:
one per rollout, opened at seed, used by whichever worker takes the rollout's next step. Its name
(sent in ``X-Gymbus-Instance`` with every answer) changes with every start, so a host that restarted
is told apart from the one a rollout was pinned to. A session whose connection broke (the OpenEnv
server died) answers 410: its episode is gone.

    python -m functions.openenv_bridge.host --target http://127.0.0.1:8000 --port 8100 [--name NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

IDLE_S = 3600.0
"""A session nobody used for this long is closed (its rollout ended without saying so)."""


@dataclass
class Episode:
    ws: aiohttp.ClientWebSocketResponse
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    lost: str | None = None
    used: float = field(default_factory=time.monotonic)


class Host:
    def __init__(self, target: str, name: str) -> None:
        self.target, self.name = target.rstrip("/"), name
        self.ws_url = self.target.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + "/ws"
        self.episodes: dict[str, Episode] = {}
        self.http: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._identify])
        app.router.add_get("/", self.health)
        app.router.add_post("/sessions", self.open)
        app.router.add_post("/sessions/{sid}/step", self.step)
        app.router.add_get("/sessions/{sid}/state", self.state)
        app.router.add_delete("/sessions/{sid}", self.close)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    @web.middleware
    async def _identify(self, request: web.Request, handler: Any) -> web.StreamResponse:
        response: web.StreamResponse = await handler(request)
        response.headers["X-Gymbus-Instance"] = self.name
        return response

    async def _start(self, _: web.Application) -> None:
        self.http = aiohttp.ClientSession()
        self._reaper = asyncio.create_task(self._reap())

    async def _stop(self, _: web.Application) -> None:
        self._reaper.cancel()
        for sid in list(self.episodes):
            await self._drop(sid)
        if self.http is not None:
            await self.http.close()

    async def health(self, _: web.Request) -> web.Response:
        return web.json_response({"instance": self.name, "target": self.target, "sessions": len(self.episodes)})

    async def open(self, request: web.Request) -> web.Response:
        """A new episode for the session (one already open under its id is closed first): connect, reset."""
        body = await request.json()
        sid = str(body["session"])
        await self._drop(sid)
        assert self.http is not None
        try:
            ws = await self.http.ws_connect(self.ws_url, heartbeat=30)
        except (aiohttp.ClientError, OSError) as exc:
            return web.json_response({"error": f"cannot reach the OpenEnv server at {self.target}: {exc}"}, status=502)
        self.episodes[sid] = Episode(ws)
        return await self._exchange(sid, {"type": "reset", "data": body.get("reset") or {}})

    async def step(self, request: web.Request) -> web.Response:
        body = await request.json()
        return await self._exchange(request.match_info["sid"], {"type": "step", "data": body.get("action") or {}})

    async def state(self, request: web.Request) -> web.Response:
        return await self._exchange(request.match_info["sid"], {"type": "state"})

    async def close(self, request: web.Request) -> web.Response:
        await self._drop(request.match_info["sid"])
        return web.json_response({"closed": True})

    async def _exchange(self, sid: str, message: dict[str, Any]) -> web.Response:
        """One message of the session's episode and the server's answer; 410 if the episode is gone."""
        episode = self.episodes.get(sid)
        if episode is None:
            return _gone(f"host {self.name} has no episode for session {sid} (never opened here, or closed)")
        async with episode.lock:
            if episode.lost is None:
                episode.used = time.monotonic()
                try:
                    await episode.ws.send_str(json.dumps(message))
                    answer = await episode.ws.receive()
                except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
                    episode.lost = f"the connection to the OpenEnv server broke ({type(exc).__name__}: {exc})"
                else:
                    if answer.type == aiohttp.WSMsgType.TEXT:
                        return _answer(json.loads(answer.data))
                    episode.lost = f"the OpenEnv server closed the episode's connection ({answer.type.name})"
            return _gone(f"the episode of session {sid} on {self.target} is gone: {episode.lost}")

    async def _drop(self, sid: str) -> None:
        episode = self.episodes.pop(sid, None)
        if episode is not None and not episode.ws.closed:
            with contextlib.suppress(Exception):
                await episode.ws.send_str(json.dumps({"type": "close"}))
                await episode.ws.close()

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(60)
            idle = [sid for sid, e in self.episodes.items() if time.monotonic() - e.used > IDLE_S]
            for sid in idle:
                await self._drop(sid)


def _answer(message: dict[str, Any]) -> web.Response:
    """The server's answer: an observation or a state (200), or its error (400: the action was wrong)."""
    if message.get("type") == "error":
        return web.json_response({"error": message.get("data", {})}, status=400)
    return web.json_response(message.get("data", {}))


def _gone(reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=410)


def main() -> None:
    parser = argparse.ArgumentParser(description="Hold OpenEnv sessions for gymbus rollouts.")
    parser.add_argument("--target", required=True, help="the OpenEnv server's base URL")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--name", default=None, help="this start's name (default: a new random one)")
    args = parser.parse_args()
    host = Host(args.target, args.name or f"openenv_host_{secrets.token_hex(4)}")
    web.run_app(host.app(), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
