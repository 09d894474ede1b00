"""A rollout pinned to one server instance (the bridges to NeMo Gym and OpenEnv keep their state in
the memory of servers they do not control): every call of the rollout goes to the instance recorded in
its state, and an instance that is gone (or has been replaced by another) ends the rollout as
``env_lost``: its state went with it, so no reward it could still give would be trusted."""

from __future__ import annotations

from typing import Any

import aiohttp

from runtime.sdk import EnvLost

GONE = (
    aiohttp.ClientConnectorError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
    aiohttp.ClientPayloadError,
)
"""Transport errors that mean the instance is not there any more (refused, reset, closed mid-answer)."""


class Answer:
    """What an instance answered: status, body, and the cookies it set."""

    def __init__(
        self, status: int, body: bytes, cookies: dict[str, str], headers: dict[str, str] | None = None
    ) -> None:
        self.status, self.body, self.cookies, self.headers = status, body, cookies, headers or {}

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        import json

        return json.loads(self.body)


async def post(
    url: str,
    body: Any,
    *,
    who: str,
    cookies: dict[str, str] | None = None,
    timeout_s: float = 300.0,
    method: str = "POST",
) -> Answer:
    """Send JSON to a pinned instance (POST by default); EnvLost names ``who`` if the instance is gone."""
    headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())} if cookies else None
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:  # a client per call: no connection outlives it, and no cookie is kept but the rollout's own
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), timeout=timeout) as http:
            async with http.request(method, url, json=body, headers=headers) as r:
                data = await r.read()
                return Answer(r.status, data, {k: m.value for k, m in r.cookies.items()}, dict(r.headers))
    except GONE as exc:
        raise EnvLost(f"{who} is gone ({type(exc).__name__}: {exc}); the rollout's state went with it") from None
