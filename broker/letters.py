"""Dead letters: messages that failed for good, kept on ``gym.dead.<function>`` with why.

A producer reads them too: a message that named no run (not JSON, not a Start) is answered here, at
once, under the ``Nats-Msg-Id`` it was published with (``msg_id``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from broker.schemas import FailureKind


class DeadLetter(msgspec.Struct, kw_only=True):
    """A message that failed for good, kept on ``gym.dead.<function>`` with why (see `gymbus dead-letters`)."""

    function: str
    """The function whose consumer gave up on it."""
    subject: str
    """The subject it was published to."""
    stream_seq: int
    """Its sequence in the work stream."""
    num_delivered: int
    """How many times it was delivered."""
    failure_kind: FailureKind
    """The kind of the last error."""
    error: str
    """The last error, readable."""
    session_id: str | None = None
    """The rollout it belonged to, when known."""
    msg_id: str | None = None
    """Its ``Nats-Msg-Id`` header, as the producer set it (how a producer finds its rejected messages)."""
    payload: str
    """The original message body (UTF-8 text, or base64 if it was not text)."""
    payload_encoding: Literal["utf-8", "base64"] = "utf-8"
    """How ``payload`` is encoded."""
    headers: dict[str, str] = {}
    """The original message headers."""
    dead_at: float
    """Unix time it was dead-lettered."""


dead_letter_decoder = msgspec.json.Decoder(DeadLetter)
