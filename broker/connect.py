"""Connecting to the broker with settings that survive an outage, and that give up on a dead address.

nats-py's defaults give up after ~2 minutes of reconnects and ping only every 120 s, so a paused
or restarted broker quietly ends a worker: once connected, gymbus reconnects forever and pings every
few seconds. Before the first connection, though, nothing says the address is right: a process that
has never connected tries for a bounded time, then fails with one line naming the URL.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import nats
from nats.aio.client import Client

log = logging.getLogger("gymbus.broker")

DEFAULT_URL_ENV = "GYMBUS_NATS_URL"
CONNECT_TIMEOUT_ENV = "GYMBUS_CONNECT_TIMEOUT_S"
CONNECT_TIMEOUT_S = 20.0
"""How long a process that has never connected keeps trying (GYMBUS_CONNECT_TIMEOUT_S overrides it)."""


SETTINGS = {"reconnect_time_wait": 0.5, "ping_interval": 5, "max_outstanding_pings": 3, "pending_size": 64 * 2**20}
"""Once connected: a reconnect every half second, a ping every 5 s (3 unanswered: the link is dead), and
64 MiB of publishes buffered while reconnecting."""


class BrokerUnavailable(ConnectionError):
    """No broker answered at the URL within the connect timeout; the message names the URL and the fix."""


def connect_timeout() -> float:
    return float(os.environ.get(CONNECT_TIMEOUT_ENV) or CONNECT_TIMEOUT_S)


async def connect(url: str, *, name: str = "gymbus", connect_timeout_s: float | None = None) -> Client:
    """Connect, retrying the first connection for ``connect_timeout_s``, then reconnect forever."""

    connected = False
    errors: list[BaseException] = []

    async def on_error(exc: Exception) -> None:
        if not connected:  # before the first connection, failures are reported once, by BrokerUnavailable
            errors.append(exc)
        log.log(logging.WARNING if connected else logging.DEBUG, "nats %s: %s", name, exc)

    async def on_disconnect() -> None:
        if not nc.is_closed and not nc.is_draining:
            log.warning("nats %s: disconnected from %s", name, url)

    async def on_reconnect() -> None:
        log.info("nats %s: reconnected", name)

    timeout = connect_timeout() if connect_timeout_s is None else connect_timeout_s
    creds = os.environ.get("NATS_CREDS") or None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        nc = Client()
        try:
            await nc.connect(
                url,
                name=name,
                # two tries per round until connected (nats-py loops forever on -1 or 0, even before the
                # first connection); once connected, reconnect forever
                max_reconnect_attempts=1,
                connect_timeout=max(0.5, min(5.0, deadline - loop.time())),
                error_cb=on_error,
                disconnected_cb=on_disconnect,
                reconnected_cb=on_reconnect,
                user_credentials=creds,
                **SETTINGS,
            )
        except (OSError, nats.errors.NoServersError, TimeoutError) as exc:
            errors.append(exc)
            if loop.time() >= deadline:
                break
            await asyncio.sleep(min(1.0, max(0.0, deadline - loop.time())))
            continue
        nc.options["max_reconnect_attempts"] = -1
        connected = True
        return nc
    raise BrokerUnavailable(
        f"no NATS broker answers at {url} ({_reason(errors)}) after {timeout:g} s: start one, or check --nats / "
        f"{DEFAULT_URL_ENV}"
    )


def _reason(errors: list[BaseException]) -> str:
    """The most telling error of the tries: the socket's (refused, unknown host) over nats-py's summary."""
    for exc in reversed(errors):
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused"
        if not isinstance(exc, nats.errors.NoServersError):
            text = str(exc) or type(exc).__name__
            return text.split("] ", 1)[-1].strip()
    return "no answer"


@asynccontextmanager
async def connection(url: str, *, name: str, connect_timeout_s: float | None = None) -> AsyncIterator[Client]:
    """``async with connection(url, name=...) as nc:`` connected for the block, closed after it."""
    nc = await connect(url, name=name, connect_timeout_s=connect_timeout_s)
    try:
        yield nc
    finally:
        await nc.close()
