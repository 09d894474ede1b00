"""Pulling from a durable consumer: one-shot pull requests, and handler slots per consumer.

Every consumer of gymbus (workers, the profiler, the janitor) pulls with `Puller`, never
``PullSubscription.fetch(n)`` (see `Puller` for why).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg
from nats.js import JetStreamContext
from nats.js.api import DEFAULT_PREFIX
from nats.js.errors import APIError

log = logging.getLogger("gymbus.pull")


class Slots:
    """Free handler slots of one consumer. Each subject a worker serves has its own, so a long poll
    on an idle subject never holds up work waiting on another. One loop takes, many handlers give."""

    def __init__(self, n: int) -> None:
        self.free = n
        self.closed = False
        self._changed = asyncio.Event()

    async def take(self, most: int) -> int:
        """Up to ``most`` free slots, waiting for one; 0 once closed (a stopping worker never waits on
        its busy handlers here: its drain has its own timeout)."""
        while self.free <= 0 and not self.closed:
            self._changed.clear()
            await self._changed.wait()
        if self.closed:
            return 0
        k = min(most, self.free)
        self.free -= k
        return k

    def give(self, k: int = 1) -> None:
        self.free += k
        self._changed.set()

    def close(self) -> None:
        self.closed = True
        self._changed.set()


class Puller:
    """Pull requests on one durable consumer, each answered as soon as any message is available.

    Not ``PullSubscription.fetch(n)``: when another client (a second replica) has a pull request
    waiting on the same consumer while a message is pending, the server answers its ``no_wait``
    probe with 408 Requests Pending; nats-py then sends a plain (lingering) request for n messages
    and, once the first arrives, waits for the rest until the request expires. Nothing more comes
    in a closed loop whose in-flight messages that fetch is itself holding, so it sat on them for
    the whole fetch timeout (1 s): with two replicas, throughput fell fivefold and p99 rose to ~1 s.

    Here every request is a one-shot (``no_wait`` with ``expires``: wait for the first message,
    then take what is there and end), falling back to a lingering request for a single message on
    Requests Pending. Each request has its own reply subject, so a late status of an earlier one
    is never taken for the end of the current one.
    """

    def __init__(self, nc: Client, stream: str, durable: str, prefix: str = DEFAULT_PREFIX) -> None:
        self._nc = nc
        self._next = f"{prefix}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._inbox = nc.new_inbox()
        self._seq = 0
        self._queue: asyncio.Queue[NatsMsg] = asyncio.Queue()

    @classmethod
    async def bind(cls, js: JetStreamContext, stream: str, durable: str) -> Puller:
        """A started puller on the connection and API prefix of ``js`` (nats-py keeps both private)."""
        return await cls(js._nc, stream, durable, js._prefix).start()

    async def start(self) -> Puller:
        async def put(m: NatsMsg) -> None:
            self._queue.put_nowait(m)

        await self._nc.subscribe(f"{self._inbox}.*", cb=put)
        return self

    async def fetch(self, n: int, timeout: float) -> list[NatsMsg]:
        """Up to ``n`` messages; waits at most ``timeout`` for the first, not at all for the rest."""
        msgs = self._ready(n)  # delivered to an earlier request after we stopped waiting for it
        if msgs:
            return msgs
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        status = await self._request(n, timeout, True, deadline + 0.25, msgs)
        if not msgs and status == "408" and loop.time() < deadline - 0.01:  # Requests Pending
            await self._request(1, deadline - loop.time(), False, deadline + 0.25, msgs)
        return msgs

    async def take(self, n: int, timeout: float) -> list[NatsMsg]:
        """`fetch`, where a broker away for a moment counts as no messages (the client reconnects)."""
        try:
            return await self.fetch(n, timeout)
        except TimeoutError:
            return []
        except Exception as exc:
            log.warning("pull on %s failed: %s", self._next, exc)
            await asyncio.sleep(0.5)
            return []

    def _ready(self, n: int) -> list[NatsMsg]:
        msgs: list[NatsMsg] = []
        while len(msgs) < n and not self._queue.empty():
            m = self._queue.get_nowait()
            if not JetStreamContext.is_status_msg(m):
                msgs.append(m)
        return msgs

    async def _request(self, n: int, expires: float, one_shot: bool, until: float, msgs: list[NatsMsg]) -> str | None:
        """One pull request for ``n`` messages, collected into ``msgs``; returns the status that ended it."""
        self._seq += 1
        reply = f"{self._inbox}.{self._seq}"
        req: dict[str, Any] = {"batch": n, "expires": max(1_000_000, int(expires * 1e9))}
        if one_shot:
            req["no_wait"] = True
        await self._nc.publish(self._next, json.dumps(req).encode(), reply=reply)
        loop = asyncio.get_running_loop()
        want = len(msgs) + n
        while len(msgs) < want:
            try:
                m = await asyncio.wait_for(self._queue.get(), max(0.0, until - loop.time()))
            except TimeoutError:
                return None
            status = JetStreamContext.is_status_msg(m)
            if not status:
                msgs.append(m)
            elif m.subject != reply or status == "100":  # an earlier request's end, or a heartbeat
                continue
            elif status in ("404", "408"):  # no (more) messages, request expired, or Requests Pending
                return status
            elif msgs:
                return status
            else:
                raise APIError.from_msg(m)  # 409: consumer deleted, leadership change, max waiting...
        return None
