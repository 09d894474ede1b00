"""JetStream's max-deliveries advisories, as the janitor reads them.

When a work message has been delivered ``max_deliver`` times and is still unacknowledged (its
workers died on it, or hung past the ack wait each time), the server stops delivering it, leaves it
in the work-queue stream, and publishes a core-NATS advisory. ``topology.advisory_stream`` captures
those advisories in a stream, so one published while no janitor runs waits there; the janitor's
durable consumer (shared by every janitor) takes each exactly once, moves the message to the dead
letters and fails its rollout with ``worker_lost``.
"""

from __future__ import annotations

import msgspec
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

from broker import topology
from broker.denials import create_or_find

JANITOR = "janitor"
"""Durable consumer of the advisory stream, shared by every janitor."""


class MaxDeliveries(msgspec.Struct, kw_only=True):
    """``io.nats.jetstream.advisory.v1.max_deliver`` (the fields gymbus reads)."""

    stream: str
    consumer: str
    stream_seq: int
    deliveries: int


decoder = msgspec.json.Decoder(MaxDeliveries)


def consumer_config(ack_wait_s: float = 30.0) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=JANITOR,
        name=JANITOR,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait_s,
        max_deliver=-1,  # an advisory is never given up on: it is the last record of a lost message
        max_ack_pending=256,
    )


def function_of(consumer: str) -> str:
    """The function a work consumer serves (``tool-math`` -> ``math``)."""
    return consumer.split("-", 1)[1] if "-" in consumer else consumer


async def ensure_consumer(js: JetStreamContext) -> str:
    """Create (or update) the janitors' consumer; an identity that may not finds the one `gymbus init` made."""
    await create_or_find(
        js.add_consumer(topology.ADVISORY_STREAM, config=consumer_config()),
        lambda: js.consumer_info(topology.ADVISORY_STREAM, JANITOR),
        f"consumer {JANITOR}",
    )
    return JANITOR
