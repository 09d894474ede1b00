"""Session state in the ``sessions`` KV bucket, changed only by compare-and-set.

Every transition reads ``(session, revision)`` and writes with the expected last revision; a
conflict means another replica already applied the step (DESIGN invariant 2), never an error
to retry blindly. The store talks to the bucket's stream directly so a finished session can be
written with a per-message TTL.
"""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import Header
from nats.js.errors import APIError, NotFoundError

from broker import topology
from broker.publish import publish_raw
from broker.schemas import Session, session_decoder, session_encoder

_KV_OP = "KV-Operation"


class StateConflict(Exception):
    """The session moved on since it was read: another worker applied this step."""


class SessionStore:
    def __init__(self, js: JetStreamContext, bucket: str = topology.SESSIONS) -> None:
        self._js = js
        self._stream = f"KV_{bucket}"
        self._prefix = f"$KV.{bucket}."

    async def get(self, sid: str) -> tuple[Session, int] | None:
        """The session and its revision, or None if there is none (or it was deleted)."""
        try:
            msg = await self._js.get_msg(self._stream, subject=self._prefix + sid, direct=True)
        except NotFoundError:
            return None
        if msg.headers and msg.headers.get(_KV_OP) in ("DEL", "PURGE"):
            return None
        assert msg.data is not None and msg.seq is not None
        return session_decoder.decode(msg.data), msg.seq

    async def create(self, session: Session) -> int:
        """Write a new session; StateConflict if the key already has a value."""
        return await self.update(session, last=0)

    async def update(self, session: Session, *, last: int, ttl_s: float | None = None) -> int:
        """Write ``session`` iff its latest revision is still ``last``; returns the new revision."""
        headers = {Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: str(last)}
        if ttl_s is not None:
            headers[Header.MSG_TTL.value] = f"{int(ttl_s)}s"
        try:
            ack = await publish_raw(
                self._js, self._prefix + session.session_id, session_encoder.encode(session), headers
            )
        except APIError as exc:
            if exc.err_code in (10071, 10164):
                raise StateConflict(session.session_id) from exc
            raise
        return ack.seq

    async def delete(self, sid: str) -> None:
        await publish_raw(self._js, self._prefix + sid, b"", {_KV_OP: "DEL"})
