"""Session state in the ``sessions`` KV bucket, changed only by compare-and-set.

Every transition reads ``(session, revision)`` and writes with the expected last revision; a
conflict means another replica already applied the step (DESIGN invariant 2), never an error
to retry blindly. The store talks to the bucket's stream directly so a finished session can be
written with a per-message TTL.
"""

from __future__ import annotations

import asyncio
import secrets
from datetime import datetime

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy, Header
from nats.js.errors import APIError, NotFoundError

from broker import topology
from broker.inbox import direct_get_last
from broker.publish import publish_raw
from broker.schemas import Session, session_decoder, session_encoder

_KV_OP = "KV-Operation"
_WRITE = "Gymbus-Write"
"""Header naming the write that stored a session value (see `SessionStore.update`)."""
PHASE = "Gymbus-Phase"
DEADLINE = "Gymbus-Deadline"
"""Headers with the session's phase and the unix time its rollout deadline passes, so a scan for
overdue rollouts reads headers only (see `Deadlines`)."""


class StateConflict(Exception):
    """The session moved on since it was read: another worker applied this step."""


class SessionStore:
    def __init__(self, js: JetStreamContext, bucket: str = topology.SESSIONS) -> None:
        self._js = js
        self._stream = f"KV_{bucket}"
        self._prefix = f"$KV.{bucket}."

    async def get(self, sid: str, *, any_replica: bool = False) -> tuple[Session, int] | None:
        """The session and its revision, or None if there is none (or it was deleted).

        By default the stream's leader answers, so the value is the latest acknowledged write. With
        ``any_replica`` the read is a direct get, which any replica of a replicated bucket may answer:
        cheaper, but a follower that has not applied the latest write yet returns an older value (or
        none). Only a caller that confirms with the leader before acting on an older value uses it."""
        if any_replica:
            stored = await direct_get_last(self._js, self._stream, self._prefix + sid)
            if stored is None or stored.headers.get(_KV_OP) in ("DEL", "PURGE"):
                return None
            return session_decoder.decode(stored.data), stored.seq
        try:
            msg = await self._js.get_msg(self._stream, subject=self._prefix + sid)
        except NotFoundError:
            return None
        if msg.headers and msg.headers.get(_KV_OP) in ("DEL", "PURGE"):
            return None
        assert msg.data is not None and msg.seq is not None
        return session_decoder.decode(msg.data), msg.seq

    async def create(self, session: Session) -> int:
        """Write a new session; StateConflict if the key already has a value."""
        return await self.update(session, last=0)

    async def update(
        self, session: Session, *, last: int, ttl_s: float | None = None, record: bytes | None = None
    ) -> int:
        """Write ``session`` iff its latest revision is still ``last``; returns the new revision.
        ``record`` is the session already encoded (the caller measured its size with it).

        The write carries a token of its own: when a publish timed out after the broker stored it, its
        retry fails the CAS check against that very write, and the token tells it apart from another
        worker's write (which would otherwise stall the rollout: nobody emits the next message)."""
        token = secrets.token_hex(8)
        deadline = session.timings.submitted_at + session.options.rollout_timeout_s
        headers = {
            Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: str(last),
            _WRITE: token,
            PHASE: session.phase,
            DEADLINE: f"{deadline:.3f}",
        }
        if ttl_s is not None:
            headers[Header.MSG_TTL.value] = f"{int(ttl_s)}s"
        try:
            data = session_encoder.encode(session) if record is None else record
            ack = await publish_raw(self._js, self._prefix + session.session_id, data, headers)
        except APIError as exc:
            if exc.err_code not in (10071, 10164):
                raise
            landed = await self._written_by(session.session_id, token)
            if landed is None:
                raise StateConflict(session.session_id) from exc
            return landed
        return ack.seq

    async def _written_by(self, sid: str, token: str) -> int | None:
        """The revision of the key's latest value if that value is the write carrying ``token``."""
        try:
            msg = await self._js.get_msg(self._stream, subject=self._prefix + sid)
        except NotFoundError:
            return None
        return msg.seq if (msg.headers or {}).get(_WRITE) == token else None

    async def delete(self, sid: str) -> None:
        await publish_raw(self._js, self._prefix + sid, b"", {_KV_OP: "DEL"})


class Deadlines:
    """The live sessions of the bucket and their deadlines, for the janitor's reaper.

    Each look reads only what was written to the bucket since the last one (headers only), from the
    stream sequence it had reached. The bucket keeps one value per key, so a key written since then
    has its latest value past that sequence, and a key not written since is as it was (or expired,
    which `SessionStore.get` then says). Reading the whole bucket each time would read every session
    finished within ``done_ttl_s``: at a few hundred rollouts/s that is over 100,000 sessions every
    few seconds, and it kept every block of the bucket in the broker's memory."""

    def __init__(self, js: JetStreamContext, bucket: str = topology.SESSIONS) -> None:
        self._js = js
        self._stream = f"KV_{bucket}"
        self._prefix = f"$KV.{bucket}."
        self.read_to = 0
        """The stream sequence read up to."""
        self.live: dict[str, float] = {}
        """Live session id -> unix time its rollout deadline passes."""
        self.written: dict[str, float] = {}
        """Live session id -> unix time of its last write (the stream's timestamp)."""
        self.reads = 0
        """Messages read so far."""
        self._created: datetime | None = None
        """When the bucket's stream was created: another time is another bucket, read from its start."""

    def forget(self, sid: str) -> None:
        self.live.pop(sid, None)
        self.written.pop(sid, None)

    async def overdue(self, now: float) -> list[str]:
        """Keys of live sessions whose deadline passed before ``now``."""
        await self._catch_up()
        return [sid for sid, deadline in self.live.items() if deadline < now]

    async def _catch_up(self) -> None:
        info = await self._js.stream_info(self._stream)
        last = info.state.last_seq
        if info.created != self._created or last < self.read_to:  # another bucket (a new broker's): start over
            self._created, self.read_to = info.created, 0
            self.live.clear()
            self.written.clear()
        if last <= self.read_to:
            return
        try:  # is anything left past read_to? (what was written since may all be gone: superseded, expired)
            await self._js.get_msg(self._stream, seq=self.read_to + 1, subject=self._prefix + ">", next=True)
        except NotFoundError:
            self.read_to = last
            return
        caught_up = asyncio.Event()

        async def on_msg(msg: Msg) -> None:
            seq = msg.metadata.sequence.stream
            self.reads += 1
            self.read_to = max(self.read_to, seq)
            sid, h = msg.subject[len(self._prefix) :], msg.headers or {}
            if h.get(PHASE) != "done" and not h.get(_KV_OP) and not h.get("Nats-Marker-Reason"):
                self.live[sid] = float(h.get(DEADLINE) or 0)
                self.written[sid] = msg.metadata.timestamp.timestamp()
            else:
                self.forget(sid)
            if msg.metadata.num_pending == 0 or seq >= last:
                caught_up.set()

        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.read_to + 1, headers_only=True
        )
        sub = await self._js.subscribe(
            self._prefix + ">", stream=self._stream, config=config, ordered_consumer=True, cb=on_msg
        )
        try:
            await asyncio.wait_for(caught_up.wait(), timeout=60)
        finally:
            await sub.unsubscribe()
