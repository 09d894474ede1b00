"""Pulling from a durable consumer: continuous pull requests for a worker's free handler slots
(`Consumer`), one-shot pull requests (`Puller`), and handler slots per consumer.

Every consumer of gymbus pulls with these, never ``PullSubscription.fetch(n)`` (see `Puller` for why):
workers with `Consumer`, the profiler and the janitor with `Puller`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg
from nats.js import JetStreamContext
from nats.js.api import DEFAULT_PREFIX
from nats.js.errors import APIError

log = logging.getLogger("gymbus.pull")


class Slots:
    """Free handler slots of one consumer. Each subject a worker serves has its own, so a subject that
    is busy never takes the slots of another. Its `Consumer` takes one per message it hands over (``free``
    may go below 0 for a moment after a reconnect); each handler gives its slot back when it ends."""

    def __init__(self, n: int) -> None:
        self.free = n
        self.closed = False
        self.on_give: Callable[[], None] | None = None
        """Called whenever a slot comes back or the slots close (a `Consumer` may then ask for more)."""

    def give(self, k: int = 1) -> None:
        self.free += k
        if self.on_give is not None:
            self.on_give()

    def close(self) -> None:
        self.closed = True
        if self.on_give is not None:
            self.on_give()


def _route(nc: Client, sid: int, handler: Callable[[NatsMsg], None]) -> None:
    """Hand a subscription's messages to ``handler`` from the read loop (broker/denials.py), if the client can."""
    route = getattr(nc, "route", None)
    if route is not None:
        route(sid, handler)


class Consumer:
    """A worker's pull requests on one durable consumer: always as many messages asked for as it has
    free handler slots, each handed to a handler the moment it arrives.

    `Puller` asks, waits for what comes, and asks again: between two requests nothing is delivered,
    and each request costs a status reply besides its messages. Here requests linger (``expires``, not
    ``no_wait``) and overlap: whenever the free slots exceed what is asked for by ``threshold``, another
    request asks for the difference, so under load a request is always waiting at the broker and a new
    message goes out at once. Only free slots are asked for, so every message delivered starts its
    handler at once (its ack wait runs from delivery).

    The broker does not say which request a message answered, so the count asked for is kept in all:
    a message takes one off, a request ending unfilled (408 Request Timeout, 409) takes off the
    ``Nats-Pending-Messages`` it reports, or all it asked for when it reports none (a 409 refusing it:
    the consumer's ``max_waiting`` reached, its leader moved). A request is over once its ``expires``
    (and a grace) has passed: filled, or ended by its status. When none is left open, or the connection
    was re-made (the broker forgets the requests of a connection it lost), nothing is asked for any
    more. Each request asks for at least ``threshold`` messages (a quarter of the slots, in a worker), so
    a replica keeps a few requests waiting at the broker, not one. A stopping
    worker asks for nothing more; what its open requests still bring (for at most ``expires``) is
    handled like the rest, as `run` returns only once they have ended. (Giving such a message back with
    a nak would not help: the broker hands it straight back to the same open request, each time one
    delivery more towards ``max_deliver``.)
    """

    GRACE_S = 0.5
    """How long past its ``expires`` a request may still answer before it is taken for over."""

    def __init__(self, nc: Client, stream: str, durable: str, prefix: str = DEFAULT_PREFIX) -> None:
        self._nc = nc
        self._next = f"{prefix}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._inbox = nc.new_inbox()
        self._seq = 0
        self.asked = 0
        """Messages asked for and not yet delivered, over every open request."""
        self._open: dict[str, tuple[float, int]] = {}
        """reply subject of each open request -> the loop time past which it is over (in the order sent)
        and the messages it asked for"""
        self._slots: Slots | None = None
        self._handle: Callable[[NatsMsg], None] | None = None
        self._threshold = 1
        self._wake = asyncio.Event()
        self._quiet_until = 0.0
        """After a request the broker refused (409 without a count, 400), the loop time to ask again."""
        self.requests = 0
        """Pull requests sent (a figure for runtime/bench)."""

    async def start(self, slots: Slots, handle: Callable[[NatsMsg], None]) -> Consumer:
        self._slots, self._handle = slots, handle
        slots.on_give = self._given
        sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._queued)
        _route(self._nc, sub._id, self._on_msg)
        return self

    def _given(self) -> None:
        """A slot came back (or the slots closed): wake the loop if it may ask for more now."""
        assert self._slots is not None
        if self._slots.closed or self._slots.free - self.asked >= self._threshold or not self._open:
            self._wake.set()

    async def _queued(self, m: NatsMsg) -> None:  # a client that cannot route: through the subscription's task
        self._on_msg(m)

    def _on_msg(self, m: NatsMsg) -> None:
        assert self._slots is not None and self._handle is not None
        status = JetStreamContext.is_status_msg(m)
        if not status:  # stopping or not: a stopping worker drains what its open requests still bring
            self.asked = max(0, self.asked - 1)
            self._slots.free -= 1
            self._handle(m)
            return
        if status == "100":  # a heartbeat
            return
        request = self._open.pop(m.subject, None)
        pending = (m.headers or {}).get("Nats-Pending-Messages")
        if pending is not None and pending.isdigit():  # counted in `asked` even if taken for over already
            self.asked = max(0, self.asked - int(pending))
        elif request is not None:  # refused or ended without a count (max_waiting, leader moved, deleted)
            log.debug("pull on %s ended: %s %s", self._next, status, (m.headers or {}).get("Description", ""))
            self.asked = max(0, self.asked - request[1])
            self._quiet_until = asyncio.get_running_loop().time() + 0.25  # not at once again
        self._wake.set()

    async def run(self, threshold: int, expires: float = 1.0) -> None:
        """Keep the free slots asked for, with a request once ``threshold`` of them are not (or nothing is
        asked), until the slots close; then wait for the open requests to end."""
        slots = self._slots
        assert slots is not None
        self._threshold = max(1, threshold)
        loop = asyncio.get_running_loop()
        reconnects = self._nc.stats["reconnects"]
        while not slots.closed:
            now = loop.time()
            if self._nc.stats["reconnects"] != reconnects:  # the broker forgot this connection's requests
                reconnects, self.asked, self._open = self._nc.stats["reconnects"], 0, {}
            self._expire(now)
            want = slots.free - self.asked
            if now < self._quiet_until:
                await asyncio.sleep(self._quiet_until - now)
            elif want >= self._threshold or (want > 0 and not self._open):
                try:
                    await self._request(want, expires, now)
                except Exception as exc:  # the broker away for a moment: the client reconnects
                    log.warning("pull on %s failed: %s", self._next, exc)
                    await asyncio.sleep(0.5)
            else:
                self._wake.clear()
                wait = next(iter(self._open.values()))[0] - now if self._open else expires
                timer = loop.call_later(max(0.01, wait), self._wake.set)
                await self._wake.wait()
                timer.cancel()
        while self._open and self._nc.is_connected:
            self._expire(loop.time())
            if self._open:
                await asyncio.sleep(0.05)

    def _expire(self, now: float) -> None:
        """Forget the requests past their end (oldest first: all have the same ``expires``)."""
        while self._open:
            reply, (end, _) = next(iter(self._open.items()))
            if end >= now:
                return
            del self._open[reply]
        self.asked = 0  # none open: nothing more comes

    async def _request(self, n: int, expires: float, now: float) -> None:
        self._seq += 1
        reply = f"{self._inbox}.{self._seq}"
        self._open[reply] = (now + expires + self.GRACE_S, n)
        self.asked += n
        self.requests += 1
        await self._nc.publish(self._next, b'{"batch":%d,"expires":%d}' % (n, int(expires * 1e9)), reply=reply)


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
