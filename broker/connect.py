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

from broker.auth import ClientAuth, client_auth
from broker.denials import GuardedClient

log = logging.getLogger("gymbus.broker")

DEFAULT_URL_ENV = "GYMBUS_NATS_URL"
CONNECT_TIMEOUT_ENV = "GYMBUS_CONNECT_TIMEOUT_S"
CONNECT_TIMEOUT_S = 20.0
"""How long a process that has never connected keeps trying (GYMBUS_CONNECT_TIMEOUT_S overrides it)."""


class BrokerUnavailable(ConnectionError):
    """No broker answered at the URL within the connect timeout; the message names the URL and the fix."""


def connect_timeout() -> float:
    return float(os.environ.get(CONNECT_TIMEOUT_ENV) or CONNECT_TIMEOUT_S)


async def connect(
    url: str, *, name: str = "gymbus", connect_timeout_s: float | None = None, auth: ClientAuth | None = None
) -> Client:
    """Connect, retrying the first connection for ``connect_timeout_s``, then reconnect forever.

    ``auth``: the identity and TLS settings (default: from $NATS_NKEY, $NATS_CREDS, $NATS_TLS_*; see
    broker/auth.py). A permission the broker denies fails the call at once (broker/denials.py); a broker
    that refuses the identity itself is not retried."""
    timeout = connect_timeout() if connect_timeout_s is None else connect_timeout_s
    link = _Link(name, url, auth if auth is not None else client_auth())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            nc = await link.open(max(1, int(min(5.0, deadline - loop.time()))))
        except (OSError, nats.errors.NoServersError, TimeoutError) as exc:
            link.errors.append(exc)
            if link.refused() or loop.time() >= deadline:
                break
            await asyncio.sleep(min(1.0, max(0.0, deadline - loop.time())))
            continue
        nc.options["max_reconnect_attempts"] = -1  # once connected, reconnect forever
        link.connected = True
        return nc
    if any("certificate_verify_failed" in str(e).lower() for e in link.errors):
        raise BrokerUnavailable(
            f"the broker at {url} presented a certificate this client does not trust (CERTIFICATE_VERIFY_FAILED): "
            "set NATS_TLS_CA to the CA file that signed it"
        )
    if link.refused():
        raise BrokerUnavailable(
            f"the broker at {url} refused identity {link.auth.identity or '(none)'} ({_reason(link.errors)}): "
            "check NATS_NKEY / NATS_CREDS (see `gymbus auth init`)"
        )
    raise BrokerUnavailable(
        f"no NATS broker answers at {url} ({_reason(link.errors)}) after {timeout:g} s: start one, or check --nats / "
        f"{DEFAULT_URL_ENV}"
    )


class _Link:
    """One process's connection attempts to a broker, and the callbacks that report on them."""

    def __init__(self, name: str, url: str, auth: ClientAuth) -> None:
        self.name, self.url, self.auth = name, url, auth
        self.connected = False
        self.errors: list[BaseException] = []
        self.nc: GuardedClient | None = None
        self.refusal = asyncio.Event()

    def refused(self) -> bool:
        """Whether the broker refused this identity, or its certificate was refused (retrying cannot help)."""
        return any(_refusal(e) for e in self.errors)

    async def open(self, connect_timeout: int) -> Client:
        """One round of tries; a refusal reported by the error callback ends it at once (nats-py's connect can
        otherwise wait forever after a failed TLS handshake), and so does a round that outlives its timeouts."""
        self.refusal = asyncio.Event()
        attempt = asyncio.ensure_future(self._connect(connect_timeout))
        refused = asyncio.ensure_future(self.refusal.wait())
        done, _ = await asyncio.wait({attempt, refused}, timeout=4 * connect_timeout + 2, return_when="FIRST_COMPLETED")
        refused.cancel()
        if attempt in done:
            return attempt.result()
        attempt.cancel()
        await asyncio.gather(attempt, return_exceptions=True)
        if self.refusal.is_set():
            raise OSError(str(self.errors[-1]))
        raise TimeoutError(f"no connection within {4 * connect_timeout + 2} s")

    async def _connect(self, connect_timeout: int) -> Client:
        self.nc = nc = GuardedClient(self.auth.identity)
        await nc.connect(
            self.url,
            name=self.name,
            # two tries per round until connected: nats-py loops forever on -1 or 0, even before the first
            # connection (`connect` turns it to -1 once connected)
            max_reconnect_attempts=1,
            reconnect_time_wait=0.5,  # type: ignore[arg-type]  # annotated int; it sleeps that many seconds
            ping_interval=5,
            max_outstanding_pings=3,
            pending_size=64 * 2**20,  # publishes buffered while reconnecting
            connect_timeout=connect_timeout,
            error_cb=nc.reporting(self.on_error),
            disconnected_cb=self.on_disconnect,
            reconnected_cb=self.on_reconnect,
            user_credentials=os.environ.get("NATS_CREDS") or None,
            **self.auth.options,
        )
        return nc

    async def on_error(self, exc: Exception) -> None:
        if not self.connected:  # before the first connection, failures are reported once, by BrokerUnavailable
            self.errors.append(exc)
            if _refusal(exc):
                self.refusal.set()
        log.log(logging.WARNING if self.connected else logging.DEBUG, "nats %s: %s", self.name, exc)

    async def on_disconnect(self) -> None:
        if self.nc is not None and not self.nc.is_closed and not self.nc.is_draining:
            log.warning("nats %s: disconnected from %s", self.name, self.url)

    async def on_reconnect(self) -> None:
        log.info("nats %s: reconnected", self.name)


def _refusal(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, nats.errors.AuthorizationError) or "authorization violation" in text or (
        "certificate_verify_failed" in text
    )


def _reason(errors: list[BaseException]) -> str:
    """The most telling error of the tries: the broker's refusal (the socket resets after it), else the
    socket's (refused, unknown host) over nats-py's summary."""
    if any(_refusal(exc) for exc in errors):
        return "authorization violation"
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
