"""Session state in the ``sessions`` KV bucket, changed only by compare-and-set.

Every transition reads ``(session, revision)`` and writes with the expected last revision; a
conflict means another replica already applied the step (DESIGN invariant 2), never an error
to retry blindly. The store talks to the bucket's stream directly so a finished session can be
written with a per-message TTL.
"""

from __future__ import annotations

import secrets

from nats.js import JetStreamContext
from nats.js.api import Header
from nats.js.errors import APIError, NotFoundError

from broker import topology
from broker.publish import publish_raw
from broker.schemas import Session, session_decoder, session_encoder

_KV_OP = "KV-Operation"
_WRITE = "Gymbus-Write"
"""Header naming the write that stored a session value (see `SessionStore.update`)."""


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
        """Write ``session`` iff its latest revision is still ``last``; returns the new revision.

        The write carries a token of its own: when a publish timed out after the broker stored it, its
        retry fails the CAS check against that very write, and the token tells it apart from another
        worker's write (which would otherwise stall the rollout: nobody emits the next message)."""
        token = secrets.token_hex(8)
        headers = {Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: str(last), _WRITE: token}
        if ttl_s is not None:
            headers[Header.MSG_TTL.value] = f"{int(ttl_s)}s"
        try:
            ack = await publish_raw(
                self._js, self._prefix + session.session_id, session_encoder.encode(session), headers
            )
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
            msg = await self._js.get_msg(self._stream, subject=self._prefix + sid, direct=True)
        except NotFoundError:
            return None
        return msg.seq if (msg.headers or {}).get(_WRITE) == token else None

    async def delete(self, sid: str) -> None:
        await publish_raw(self._js, self._prefix + sid, b"", {_KV_OP: "DEL"})
