"""Fleet-wide admission: at most N sandboxes running across every replica, a semaphore in the KV store.

The semaphore is N keys, ``<pool>.<i>`` in the ``sandboxes`` bucket. Taking slot i is creating its
key (compare-and-set: only one holder can) with a per-message TTL, the lease; the holder renews the
lease every ``lease_s / 3`` while its sandbox runs and deletes the key when done. A holder that dies
stops renewing, and its key expires after ``lease_s``: the slot is free again without anyone
cleaning up. A waiter tries the slots in random order, then waits for a release in its own process
or polls with backoff; one waiter per process scans at a time (FIFO), so a burst does not turn
into a storm of requests on the broker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from broker import topology
from runtime.errors import SandboxError
from runtime.sandbox.config import SandboxConfig

log = logging.getLogger("gymbus.sandbox")

EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"


class FleetAdmission:
    def __init__(
        self,
        capacity: int,
        *,
        js: JetStreamContext | None = None,
        nats_url: str = "",
        pool: str = "default",
        lease_s: float = 30.0,
        timeout_s: float = 60.0,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"fleet capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.pool = pool
        self.lease_s = lease_s
        self.timeout_s = timeout_s
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._js = js
        self._url = nats_url
        self._nc: Client | None = None
        self._kv: KeyValue | None = None
        self._jsc: JetStreamContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._turn: asyncio.Lock | None = None
        self._released: asyncio.Event | None = None

    @classmethod
    def from_config(cls, config: SandboxConfig) -> FleetAdmission:
        return cls(
            config.fleet_max,
            nats_url=config.nats_url or os.environ.get("GYMBUS_NATS_URL", ""),
            pool=config.fleet_pool,
            lease_s=config.lease_s,
            timeout_s=config.admission_timeout_s,
        )

    def key(self, slot: int) -> str:
        return f"{self.pool}.{slot}"

    async def _bucket(self) -> KeyValue:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # connections and locks belong to one event loop
            self._loop, self._kv, self._nc = loop, None, None
            self._turn, self._released = asyncio.Lock(), asyncio.Event()
        if self._nc is not None and self._nc.is_closed:  # gave up reconnecting: start over
            self._kv, self._nc = None, None
        if self._kv is None:
            js = self._js or await self._connect()
            try:
                self._kv, self._jsc = await js.key_value(topology.SANDBOXES), js
            except Exception as exc:
                raise SandboxError(f"fleet admission: no {topology.SANDBOXES!r} bucket ({exc})") from exc
        return self._kv

    async def _connect(self) -> JetStreamContext:
        """An own connection that fails fast (a run waits on it) and, once up, rides out short outages."""
        if not self._url:
            raise SandboxError(
                "fleet admission (GYMBUS_SANDBOX_FLEET_MAX) needs the broker: "
                "set GYMBUS_NATS_URL or GYMBUS_SANDBOX_NATS_URL"
            )

        async def quiet(exc: Exception) -> None:
            log.debug("sandbox admission: %s", exc)

        try:
            self._nc = await nats.connect(
                self._url,
                name="gymbus-sandbox-admission",
                connect_timeout=3,
                max_reconnect_attempts=10,
                reconnect_time_wait=0.5,
                ping_interval=5,
                error_cb=quiet,
                user_credentials=os.environ.get("NATS_CREDS") or None,
            )
        except Exception as exc:
            raise SandboxError(f"fleet admission: cannot reach the broker at {self._url}: {exc}") from exc
        return self._nc.jetstream()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[int]:
        """Hold one of the fleet's slots for the duration of the block; yields its index."""
        kv = await self._bucket()
        assert self._turn is not None and self._released is not None
        deadline = time.monotonic() + self.timeout_s
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self._turn:
                    slot, rev = await self._acquire(kv)
        except TimeoutError:
            raise SandboxError(
                f"no sandbox slot free within {self.timeout_s:g} s (fleet limit {self.capacity}, pool {self.pool!r})"
            ) from None
        log.debug("sandbox slot %d taken after %.3f s", slot, self.timeout_s - (deadline - time.monotonic()))
        lease = [rev]
        renew = asyncio.create_task(self._renew(kv, slot, lease))
        try:
            yield slot
        finally:
            renew.cancel()
            await self._release(kv, slot, lease[0])

    async def _acquire(self, kv: KeyValue) -> tuple[int, int]:
        assert self._released is not None
        value = json.dumps({"holder": self.holder, "since": time.time()}).encode()
        delay = 0.02
        while True:
            for slot in random.sample(range(self.capacity), self.capacity):
                try:
                    return slot, await kv.create(self.key(slot), value, msg_ttl=self.lease_s)
                except KeyWrongLastSequenceError:
                    continue
                except Exception as exc:
                    raise SandboxError(f"fleet admission: the broker failed: {type(exc).__name__}: {exc}") from exc
            self._released.clear()
            try:  # a release here wakes us at once; one elsewhere (or an expiry) is found by the next poll
                await asyncio.wait_for(self._released.wait(), delay * random.uniform(0.75, 1.25))
            except TimeoutError:
                delay = min(0.5, delay * 2)

    async def _renew(self, kv: KeyValue, slot: int, lease: list[int]) -> None:
        assert self._jsc is not None
        js = self._jsc
        subject = f"$KV.{topology.SANDBOXES}.{self.key(slot)}"
        value = json.dumps({"holder": self.holder, "since": time.time()}).encode()
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                ack = await js.publish(subject, value, headers={EXPECTED_LAST: str(lease[0])}, msg_ttl=self.lease_s)
                lease[0] = ack.seq
            except Exception as exc:  # lost: expired and taken, or the broker is away; the run goes on
                log.warning("sandbox slot %s: lease renewal failed: %s", self.key(slot), exc)
                return

    async def _release(self, kv: KeyValue, slot: int, rev: int) -> None:
        try:
            await kv.delete(self.key(slot), last=rev)
        except Exception as exc:  # taken by another holder after our lease expired, or the broker is away
            log.warning("sandbox slot %s: release failed (%s); it expires on its own", self.key(slot), exc)
        if self._released is not None:
            self._released.set()

    async def holders(self) -> dict[int, str]:
        """Slot -> holder of every slot taken now (for tests and `status`-like views)."""
        kv = await self._bucket()
        taken: dict[int, str] = {}
        for slot in range(self.capacity):
            try:
                entry = await kv.get(self.key(slot))
            except Exception:
                continue
            if entry.value:
                taken[slot] = json.loads(entry.value)["holder"]
        return taken

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()
            self._nc = None
            self._kv = None
