"""The hot path's JetStream requests, answered on the connection's own inbox straight from its read loop.

A session write, a work message and a direct read of a session are one request each, several per hop.
nats-py's ``request`` (and ``js.publish`` on it) hands each reply through a subscription queue and a task
of its own, waits with ``asyncio.wait_for`` and parses the ack with ``json``; measured with 16 callers
against a real broker, that is ~37 µs of client CPU per publish. Here a reply is matched to its future
by `GuardedClient` as the read loop parses it (``route``), the wait is one timer, and the ack is decoded
by msgspec: ~17 µs (runtime/bench/README.md). Errors are nats-py's own (``APIError`` and its kinds,
``NoStreamResponseError``, ``nats.errors.TimeoutError``), so callers handle both paths alike, and a
publish the broker denies fails at once with `PermissionDenied` (`GuardedClient.translate` asks `deny`).

Clients other than `GuardedClient` (a test's plain ``nats.connect``) take nats-py's path (`inbox_of`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import msgspec
import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

if TYPE_CHECKING:
    from broker.denials import GuardedClient


class PubAck(msgspec.Struct):
    """The stream's answer to a publish (nats-py's ``PubAck`` fields that gymbus reads), or its error."""

    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: dict[str, Any] | None = None


_ack = msgspec.json.Decoder(PubAck)
Reply = tuple[bytes, bytes]
"""A reply's raw headers (b"" for none) and payload."""


class Inbox:
    """Requests on one connection, each with a reply subject ``<inbox>.<n>`` of this inbox."""

    def __init__(self, nc: GuardedClient) -> None:
        self._nc = nc
        self._prefix = ""
        self._n = 0
        self._waiting: dict[bytes, tuple[asyncio.Future[Reply], str]] = {}
        """reply token -> the request's future and the subject it was sent to (for `deny`)"""
        self._lock = asyncio.Lock()

    async def _open(self) -> None:
        async with self._lock:
            if self._prefix:
                return
            prefix = self._nc.new_inbox() + "."
            sub = await self._nc.subscribe(prefix + "*")  # re-subscribed by nats-py after a reconnect, same sid
            cut = len(prefix)
            waiting = self._waiting

            def route(subject: bytes, data: bytes, headers: bytes) -> None:
                pending = waiting.pop(subject[cut:], None)
                if pending is not None and not pending[0].done():
                    pending[0].set_result((headers or b"", data))

            self._nc.route_raw(sub._id, route)
            self._prefix = prefix

    async def request(self, subject: str, payload: bytes, headers: dict[str, str] | None, timeout: float) -> Reply:
        """Send ``payload`` to ``subject`` and wait for the reply; ``nats.errors.TimeoutError`` after ``timeout``."""
        if not self._prefix:
            await self._open()
        self._n += 1
        token = b"%x" % self._n
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        self._waiting[token] = (future, subject)
        try:
            await self._nc.publish(subject, payload, reply=self._prefix + token.decode(), headers=headers)
            timer = loop.call_later(timeout, _expire, future)
            try:
                return await future
            finally:
                timer.cancel()
        finally:
            self._waiting.pop(token, None)

    def deny(self, lowered_subject: str, error: Exception) -> bool:
        """Fail the requests sent to ``lowered_subject`` with ``error``; whether there were any."""
        failed = False
        for token, (future, subject) in list(self._waiting.items()):
            if subject.lower() == lowered_subject and not future.done():
                future.set_exception(error)
                del self._waiting[token]
                failed = True
        return failed


def _expire(future: asyncio.Future[Reply]) -> None:
    if not future.done():
        future.set_exception(nats.errors.TimeoutError())


def inbox_of(js: JetStreamContext) -> Inbox | None:
    """The inbox of ``js``'s connection, if it is a `GuardedClient` (every gymbus connection is)."""
    return getattr(js._nc, "inbox", None)


async def js_publish(
    js: JetStreamContext, subject: str, payload: bytes, headers: dict[str, str] | None, timeout: float
) -> PubAck:
    """``js.publish``: store ``payload`` on the stream listening on ``subject`` and return its ack."""
    inbox = inbox_of(js)
    if inbox is None:
        theirs = await js.publish(subject, payload, timeout=timeout, headers=headers)
        return PubAck(stream=theirs.stream, seq=theirs.seq, duplicate=bool(theirs.duplicate))
    status, data = await inbox.request(subject, payload, headers, timeout)
    if status:
        if b" 503" in status[:12]:  # no stream listens on the subject (no responders)
            raise NoStreamResponseError
        raise APIError(description=f"unexpected reply to a publish: {status[:64]!r}")
    ack = _ack.decode(data)
    if ack.error is not None:
        APIError.from_error(ack.error)
    return ack


class Stored(msgspec.Struct):
    """A message read back from a stream: its sequence, headers and payload."""

    seq: int
    headers: dict[str, str]
    data: bytes


async def direct_get_last(js: JetStreamContext, stream: str, subject: str, timeout: float = 5.0) -> Stored | None:
    """The last message on ``subject`` by the stream's direct get (any replica may answer), or None."""
    inbox = inbox_of(js)
    if inbox is None:
        try:
            msg = await js.get_msg(stream, subject=subject, direct=True)
        except NotFoundError:
            return None
        assert msg.seq is not None
        return Stored(msg.seq, dict(msg.headers or {}), msg.data or b"")
    raw, data = await inbox.request(
        f"{js._prefix}.DIRECT.GET.{stream}", b'{"last_by_subj":%s}' % msgspec.json.encode(subject), None, timeout
    )
    status, headers = parse_headers(raw)
    if status == "404":
        return None
    if status:
        if status == "503":
            raise nats.errors.NoRespondersError
        raise APIError(code=int(status) if status.isdigit() else None, description=headers.get("Description", ""))
    return Stored(int(headers.get("Nats-Sequence", 0)), headers, data)


def parse_headers(raw: bytes) -> tuple[str, dict[str, str]]:
    """A NATS header block (``NATS/1.0[ status[ description]]\\r\\nKey: value\\r\\n...``): its status ("" for
    none) and its fields (the description, if any, as ``Description``)."""
    if not raw:
        return "", {}
    lines = raw.decode("utf-8", "replace").split("\r\n")
    head = lines[0].split(" ", 2)
    status = head[1] if len(head) > 1 else ""
    fields: dict[str, str] = {"Description": head[2]} if len(head) > 2 else {}
    for line in lines[1:]:
        key, sep, value = line.partition(":")
        if sep and key and not key[0].isspace():
            fields[key] = value.strip()
    return status, fields
