"""Permission denials as errors that say who was denied what, at once (never a timeout).

A broker with per-role identities (broker/auth.py) answers a forbidden publish or subscribe with an
asynchronous ``-ERR 'Permissions Violation for Publish to "<subject>"'``; nats-py hands it to the
error callback, lowercased, and a request waiting on a reply (every JetStream call, every publish
to a stream) would sit until its timeout and then look like a broker outage. `GuardedClient`
remembers which subject each pending request was sent to, and when the broker denies that subject
it fails the request at once with `PermissionDenied`, naming the identity, the operation and the
subject:

    permission denied: identity 'env-math' may not delete stream GYM_WORK ($JS.API.STREAM.DELETE.GYM_WORK)

A denied publish without a waiting caller (an ack, a pull request, a subscription) is reported
through the connection's error callback with the same message.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from broker.inbox import Inbox

_VIOLATION = re.compile(r'permissions violation for (publish|subscription) to "([^"]+)"')
_JS_API = [
    (re.compile(r"\$JS\.API\.STREAM\.(CREATE|UPDATE|DELETE|PURGE|INFO)\.([^.]+)$"), "{op} stream {0}"),
    (re.compile(r"\$JS\.API\.STREAM\.MSG\.GET\.([^.]+)$"), "read messages of stream {0}"),
    (re.compile(r"\$JS\.API\.DIRECT\.GET\.([^.]+)(?:\.(.+))?$"), "read messages of stream {0}"),
    (re.compile(r"\$JS\.API\.STREAM\.MSG\.DELETE\.([^.]+)$"), "delete messages of stream {0}"),
    (re.compile(r"\$JS\.API\.STREAM\.(LIST|NAMES)$"), "list streams"),
    (re.compile(r"\$JS\.API\.CONSUMER\.(?:DURABLE\.)?CREATE\.([^.]+)"), "create a consumer on stream {0}"),
    (re.compile(r"\$JS\.API\.CONSUMER\.(INFO|DELETE)\.([^.]+)\.([^.]+)$"), "{op} consumer {1} of stream {0}"),
    (re.compile(r"\$JS\.API\.CONSUMER\.(?:LIST|NAMES)\.([^.]+)$"), "list consumers of stream {0}"),
    (re.compile(r"\$JS\.API\.CONSUMER\.MSG\.NEXT\.([^.]+)\.([^.]+)$"), "pull from consumer {1} of stream {0}"),
    (re.compile(r"\$JS\.ACK\.([^.]+)\.([^.]+)\."), "acknowledge messages of consumer {1} on stream {0}"),
    (re.compile(r"\$JS\.FC\.([^.]+)\."), "send flow control for stream {0}"),
    (re.compile(r"\$KV\.([^.]+)\.(.+)$"), "write key {1} of bucket {0}"),
]
_VERBS = {"CREATE": "create", "UPDATE": "update", "DELETE": "delete", "PURGE": "purge", "INFO": "read"}


class PermissionDenied(nats.errors.Error):
    """The broker refused an operation to this connection's identity (see broker/auth.py)."""

    def __init__(self, identity: str, operation: str, subject: str) -> None:
        self.identity, self.operation, self.subject = identity, operation, subject
        super().__init__(str(self))

    def __str__(self) -> str:
        where = "" if self.operation.endswith(self.subject) else f" ({self.subject})"
        return f"permission denied: identity {self.identity!r} may not {self.operation}{where}"


def operation(subject: str, kind: str = "publish") -> str:
    """What a publish to (or a subscription on) ``subject`` means, in words."""
    if kind == "subscription":
        return f"subscribe to {subject}"
    for pattern, text in _JS_API:
        m = pattern.match(subject)
        if m:
            groups = [g for g in m.groups() if g is not None]
            op = _VERBS.get(groups[0], "") if groups and groups[0] in _VERBS else ""
            args = groups[1:] if op else groups
            return text.format(*args, op=op)
    return f"publish to {subject}"


class GuardedClient(Client):
    """A nats-py client whose pending requests fail with `PermissionDenied` when their subject is denied."""

    def __init__(self, identity: str = "") -> None:
        super().__init__()
        self.identity = identity or "(no identity)"
        self._requested: dict[str, str] = {}
        """reply token of each request sent through the shared response inbox -> its subject"""
        self._recent: deque[str] = deque(maxlen=512)
        """subjects published lately, to give a denial back its case (the client lowercases errors)"""
        self._prefix = ""
        self._prefix_of: bytearray | None = None
        self.denials: deque[PermissionDenied] = deque(maxlen=64)
        """The latest denials of this connection, newest last."""
        self._watchers: dict[str, list[asyncio.Future[PermissionDenied]]] = {}
        self.inbox = Inbox(self)
        """The hot path's JetStream requests (broker/inbox.py)."""
        self._raw: dict[int, Callable[[bytes, bytes, bytes], None]] = {}
        self._direct: dict[int, Callable[[Msg], None]] = {}

    def route_raw(self, sid: int, handler: Callable[[bytes, bytes, bytes], None]) -> None:
        """Hand subscription ``sid``'s messages to ``handler(subject, payload, raw headers)`` in the read loop."""
        self._raw[sid] = handler

    def route(self, sid: int, handler: Callable[[Msg], None]) -> None:
        """Hand subscription ``sid``'s messages to ``handler`` in the read loop, not through the
        subscription's queue and task (two hand-offs per message); ``handler`` must not block."""
        self._direct[sid] = handler

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes) -> None:
        raw = self._raw.get(sid)
        if raw is not None:
            self.stats["in_msgs"] += 1
            self.stats["in_bytes"] += len(data)
            raw(subject, data, headers)
            return
        direct = self._direct.get(sid)
        if direct is None:
            await super()._process_msg(sid, subject, reply, data, headers)
            return
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(data)
        hdr: Any = await self._process_headers(headers)
        direct(self._build_message(sid, subject, reply, data, hdr))

    async def publish(
        self, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> None:
        self._recent.append(subject)
        if reply and self._resp_sub_prefix:
            if self._prefix_of is not self._resp_sub_prefix:  # a new response inbox (after a reconnect)
                self._prefix_of, self._prefix = self._resp_sub_prefix, self._resp_sub_prefix.decode()
            if reply.startswith(self._prefix):
                if len(self._requested) > 4096:
                    self._requested = {t: s for t, s in self._requested.items() if t in self._resp_map}
                self._requested[reply[len(self._prefix) :]] = subject
        await super().publish(subject, payload, reply=reply, headers=headers)

    def watch(self, subject: str) -> asyncio.Future[PermissionDenied]:
        """A future set to the `PermissionDenied` of the next denial of ``subject``: for a caller of a
        plain publish (a pull request on an inbox of its own) to wait on beside its reply."""
        future: asyncio.Future[PermissionDenied] = asyncio.get_running_loop().create_future()
        self._watchers.setdefault(subject.lower(), []).append(future)
        future.add_done_callback(lambda f: self._unwatch(subject.lower(), f))
        return future

    def _unwatch(self, lowered: str, future: asyncio.Future[PermissionDenied]) -> None:
        waiting = self._watchers.get(lowered, [])
        if future in waiting:
            waiting.remove(future)
        if not waiting:
            self._watchers.pop(lowered, None)

    def translate(self, error: Exception) -> tuple[Exception, bool]:
        """``error`` as a `PermissionDenied` if it is a denial, failing the requests waiting on its
        subject with it; and whether any was (then their callers have it, nobody else needs it)."""
        m = _VIOLATION.search(str(error))
        if not m:
            return error, False
        kind, lowered = m.groups()
        subject = self._original_case(lowered, kind)
        denied = PermissionDenied(self.identity, operation(subject, kind), subject)
        self.denials.append(denied)
        delivered = False
        for future in list(self._watchers.get(lowered, [])):
            if not future.done():
                future.set_result(denied)
                delivered = True
        if kind == "publish":
            delivered = self.inbox.deny(lowered, denied) or delivered
            for token, sent_to in list(self._requested.items()):
                if sent_to.lower() == lowered:
                    pending = self._resp_map.get(token)
                    if pending is not None and not pending.done():
                        pending.set_exception(denied)
                        delivered = True
                    del self._requested[token]
        return denied, delivered

    def reporting(self, callback: Callable[[Exception], Awaitable[None]]) -> Callable[[Exception], Awaitable[None]]:
        """An error callback for `connect`: a denial goes to the calls it failed (see `translate`), or
        else to ``callback`` as a `PermissionDenied`; other errors to ``callback`` unchanged."""

        async def on_error(error: Exception) -> None:
            translated, delivered = self.translate(error)
            if not delivered:
                await callback(translated)

        return on_error

    def _original_case(self, lowered: str, kind: str) -> str:
        if kind == "subscription":
            for sub in list(self._subs.values()):
                if sub.subject.lower() == lowered:
                    return sub.subject
            return lowered
        for subject in reversed(self._recent):
            if subject.lower() == lowered:
                return subject
        return lowered


T = TypeVar("T")


async def create_or_find(
    create: Awaitable[object],
    find: Callable[[], Awaitable[T]],
    what: str,
    lacks: Callable[[T], str] = lambda found: "",
) -> None:
    """Create something on the broker; if this identity may not, check it exists (an admin made it)
    and, with ``lacks``, that it is as this version needs it (``lacks`` says what it is missing).

    Raises `PermissionDenied` (saying to provision first, or to provision again) otherwise."""
    try:
        await create
        return
    except PermissionDenied as denied:
        refused = denied
    try:
        found = await find()
    except (NotFoundError, PermissionDenied):  # missing, or not even its own to look at
        raise PermissionDenied(
            refused.identity,
            f"{refused.operation}, and {what} does not exist yet: run `gymbus init` as admin first",
            refused.subject,
        ) from None
    missing = lacks(found)
    if missing:
        raise PermissionDenied(
            refused.identity,
            f"update {what} to {missing} (an older version made it): run `gymbus init` as admin to update it",
            refused.subject,
        )
