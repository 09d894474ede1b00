"""Reading streams without consuming them (for audits, listings and tests).

Work-queue streams allow no second consumer, so messages are read one by one with direct
``next_by_subj`` gets; nothing is acknowledged or removed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError


async def messages(
    js: JetStreamContext, stream: str, subject: str = ">", start_seq: int = 1
) -> AsyncIterator[RawStreamMsg]:
    """Every message of ``stream`` on ``subject`` (wildcards allowed), in sequence order."""
    seq = start_seq
    while True:
        try:
            msg = await js.get_msg(stream, seq=seq, subject=subject, next=True)
        except NotFoundError:
            return
        assert msg.seq is not None
        yield msg
        seq = msg.seq + 1


async def count(js: JetStreamContext, stream: str, subject: str) -> int:
    """Messages stored on exactly ``subject``."""
    info = await js.stream_info(stream, subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)
