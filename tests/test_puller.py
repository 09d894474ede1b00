"""The worker's pull requests (runtime/engine/pull.py `Puller`) against a real nats-server.

nats-py's ``PullSubscription.fetch(n)`` holds messages it already received until its timeout when a
second client waits on the same consumer (the server answers its probe with 408 Requests Pending,
and the lingering request it falls back to waits for all n). In a closed loop, where the next
message only comes once the held ones are handled, every such fetch cost the full timeout. These
tests pin the contract the worker relies on instead: a fetch returns as soon as it has messages.
"""

from __future__ import annotations

import asyncio
import time

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from broker.connect import connect
from runtime.engine.pull import Puller
from runtime.testing import Harness

FETCH_TIMEOUT_S = 5.0
"""Long, so a fetch that waits for its timeout stands out from one that returns on its messages."""


async def _consumer(h: Harness, stream: str, subject: str) -> None:
    await h.js.add_stream(StreamConfig(name=stream, subjects=[subject]))
    await h.js.add_consumer(stream, ConsumerConfig(durable_name="d", ack_policy=AckPolicy.EXPLICIT, ack_wait=30))


async def test_fetch_takes_what_is_there_and_waits_only_for_the_first(harness: Harness) -> None:
    await _consumer(harness, "PULL1", "p1.x")
    puller = await Puller(harness.nc, "PULL1", "d").start()  # type: ignore[arg-type]
    for i in range(3):
        await harness.js.publish("p1.x", str(i).encode())
    got = await puller.fetch(32, timeout=FETCH_TIMEOUT_S)
    assert [m.data for m in got] == [b"0", b"1", b"2"]
    for m in got:
        await m.ack()

    async def later() -> None:
        await asyncio.sleep(0.2)
        await harness.js.publish("p1.x", b"late")

    task = asyncio.create_task(later())
    t0 = time.monotonic()
    got = await puller.fetch(32, timeout=FETCH_TIMEOUT_S)
    waited = time.monotonic() - t0
    await task
    assert [m.data for m in got] == [b"late"]
    assert waited < FETCH_TIMEOUT_S / 2, f"fetch held its one message for {waited:.2f}s"
    assert await puller.fetch(8, timeout=0.3) == []  # nothing left: an empty list at the timeout


async def test_two_pullers_in_a_closed_loop_never_sit_on_messages(harness: Harness) -> None:
    """Two replicas share one durable consumer; 16 messages circulate (each handled one is acked and
    replaced). A fetch that returned messages must have returned them long before its timeout."""
    await _consumer(harness, "PULL2", "p2.x")
    stop, handled, slow = asyncio.Event(), [0], []
    in_flight, target = 16, 600

    async def handle(m: Msg) -> None:  # as the worker does: each message in its own task
        await m.ack()
        handled[0] += 1
        if handled[0] >= target:
            stop.set()
        elif not stop.is_set():
            await harness.js.publish("p2.x", b"next")

    async def replica() -> None:
        nc = await connect(harness.broker.url, name="test-puller")
        puller = await Puller(nc, "PULL2", "d").start()
        tasks: set[asyncio.Task[None]] = set()
        try:
            while not stop.is_set():
                t0 = time.monotonic()
                msgs = await puller.fetch(32, timeout=FETCH_TIMEOUT_S)
                took = time.monotonic() - t0
                if msgs and took > FETCH_TIMEOUT_S / 2:
                    slow.append((round(took, 2), len(msgs)))
                for m in msgs:
                    task = asyncio.create_task(handle(m))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks)
        finally:
            await nc.close()

    replicas = [asyncio.create_task(replica()) for _ in range(2)]
    await asyncio.sleep(0.2)
    for _ in range(in_flight):
        await harness.js.publish("p2.x", b"first")
    async with asyncio.timeout(60):
        await stop.wait()
    await asyncio.gather(*replicas)
    assert handled[0] >= target
    assert slow == [], f"fetches that held their messages until near the timeout: {slow}"
