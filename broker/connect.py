"""Connecting to the broker with settings that survive an outage.

nats-py's defaults give up after ~2 minutes of reconnects and ping only every 120 s, so a paused
or restarted broker quietly ends a worker. gymbus reconnects forever and pings every few seconds.
"""

from __future__ import annotations

import logging
import os

import nats
import stamina
from nats.aio.client import Client

from broker.auth import ClientAuth, client_auth
from broker.denials import GuardedClient

log = logging.getLogger("gymbus.broker")

DEFAULT_URL_ENV = "GYMBUS_NATS_URL"


async def connect(
    url: str, *, name: str = "gymbus", connect_timeout_s: float = 30.0, auth: ClientAuth | None = None
) -> Client:
    """Connect, retrying the first connection for ``connect_timeout_s``, then reconnect forever.

    ``auth``: the identity and TLS settings (default: from $NATS_NKEY, $NATS_CREDS, $NATS_TLS_*; see
    broker/auth.py). A permission the broker denies fails the call at once (broker/denials.py)."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats %s: %s", name, exc)

    async def on_disconnect() -> None:
        if not nc.is_closed and not nc.is_draining:
            log.warning("nats %s: disconnected from %s", name, url)

    async def on_reconnect() -> None:
        log.info("nats %s: reconnected", name)

    creds = os.environ.get("NATS_CREDS") or None
    auth = auth if auth is not None else client_auth()
    async for attempt in stamina.retry_context(
        on=(OSError, nats.errors.NoServersError, TimeoutError), timeout=connect_timeout_s, wait_max=1.0
    ):
        with attempt:
            nc = GuardedClient(auth.identity)
            await nc.connect(
                url,
                name=name,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                ping_interval=5,
                max_outstanding_pings=3,
                connect_timeout=5,
                error_cb=nc.reporting(on_error),
                disconnected_cb=on_disconnect,
                reconnected_cb=on_reconnect,
                user_credentials=creds,
                pending_size=64 * 1024 * 1024,
                **auth.options,
            )
            return nc
    raise AssertionError("unreachable")
