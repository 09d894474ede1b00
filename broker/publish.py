"""Publishing to JetStream: deterministic message ids, and timeouts retried with the same id.

A publish that times out is *unknown*, not failed: the broker may have stored it. Retrying with
the same ``Nats-Msg-Id`` is safe, because the stream drops a repeated id inside its duplicate window.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

import stamina
from nats.errors import ConnectionReconnectingError
from nats.js import JetStreamContext
from nats.js.api import Header
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

from broker.inbox import PubAck, js_publish
from broker.schemas import Msg, encoder

RETRY_ON = (TimeoutError, NoStreamResponseError, ServiceUnavailableError, ConnectionReconnectingError)
PUBLISH_TIMEOUT_S = 5.0
PUBLISH_BUDGET_S = 120.0

Sending = Callable[[str, dict[str, str], str], AbstractContextManager[None]]
"""Wraps one publish: (subject, headers it may add to, message id)."""


def _untraced(subject: str, headers: dict[str, str], msg_id: str) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


_sending: Sending = _untraced


def instrument(sending: Sending) -> None:
    """Wrap every `publish` in ``sending``: how tracing (runtime/telemetry/tracing.py) injects trace context
    and opens a PRODUCER span, without the broker layer depending on it."""
    global _sending
    _sending = sending


async def publish_raw(
    js: JetStreamContext, subject: str, payload: bytes, headers: dict[str, str] | None = None
) -> PubAck:
    """Publish and wait for the stream's ack, retrying unknown outcomes for up to two minutes.

    The first try goes straight to the client: building a retry context costs 25-40 µs of CPU, a
    fair share of a publish's, and almost every publish succeeds at once (runtime/bench/README.md)."""
    try:
        return await js_publish(js, subject, payload, headers, PUBLISH_TIMEOUT_S)
    except RETRY_ON:
        pass  # unknown outcome: publishing the same id again is safe
    async for attempt in stamina.retry_context(on=RETRY_ON, timeout=PUBLISH_BUDGET_S, wait_max=2.0, attempts=None):
        with attempt:
            return await js_publish(js, subject, payload, headers, PUBLISH_TIMEOUT_S)
    raise AssertionError("unreachable")


async def publish(
    js: JetStreamContext, subject: str, msg: Msg, msg_id: str, headers: dict[str, str] | None = None
) -> PubAck:
    """Publish a wire message with its deterministic id, carrying the rollout's trace context."""
    hdrs = dict(headers) if headers else {}
    hdrs[Header.MSG_ID.value] = msg_id
    with _sending(subject, hdrs, msg_id):
        return await publish_raw(js, subject, encoder.encode(msg), hdrs)
