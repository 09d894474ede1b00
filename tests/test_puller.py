"""The one-shot pull requests of the profiler and the janitor (runtime/engine/pull.py `Puller`) against a
real nats-server (a worker's continuous requests are tests/test_consumer.py's).

nats-py's ``PullSubscription.fetch(n)`` holds messages it already received until its timeout when a
second client waits on the same consumer (the server answers its probe with 408 Requests Pending,
and the lingering request it falls back to waits for all n). In a closed loop, where the next
message only comes once the held ones are handled, every such fetch cost the full timeout. These
tests pin the contract its callers rely on instead: a fetch returns as soon as it has messages.
"""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from broker.connect import connect
from runtime.engine.pull import Puller
from runtime.testing import Harness, wait_until

FETCH_TIMEOUT_S = 120.0
"""Far longer than any machine takes to hand over a message: a fetch that waits for its timeout instead
of returning on its messages never returns within the test's deadline (how long a fetch really takes
is a figure of `python -m runtime.bench.pull`, not an assertion here)."""
DEADLINE_S = 60.0


async def _consumer(h: Harness, stream: str, subject: str) -> None:
    await h.js.add_stream(StreamConfig(name=stream, subjects=[subject]))
    await h.js.add_consumer(stream, ConsumerConfig(durable_name="d", ack_policy=AckPolicy.EXPLICIT, ack_wait=30))


async def _waiting(h: Harness, stream: str, n: int) -> None:
    """Until the consumer holds ``n`` pull requests waiting for messages."""

    async def check() -> int:
        waiting = (await h.js.consumer_info(stream, "d")).num_waiting
        return waiting if waiting >= n else 0

    await wait_until(check, f"{n} pull request(s) waiting on {stream}")


async def test_fetch_takes_what_is_there_and_waits_only_for_the_first(harness: Harness) -> None:
    await _consumer(harness, "PULL1", "p1.x")
    puller = await Puller(harness.nc, "PULL1", "d").start()  # type: ignore[arg-type]
    for i in range(3):
        await harness.js.publish("p1.x", str(i).encode())
    got = await puller.fetch(32, timeout=FETCH_TIMEOUT_S)
    assert [m.data for m in got] == [b"0", b"1", b"2"]
    for m in got:
        await m.ack()

    fetching = asyncio.create_task(puller.fetch(32, timeout=FETCH_TIMEOUT_S))
    await _waiting(harness, "PULL1", 1)  # the request is at the broker, and the stream is empty
    await harness.js.publish("p1.x", b"late")
    try:
        async with asyncio.timeout(DEADLINE_S):
            got = await fetching
    except TimeoutError:
        raise AssertionError(f"fetch(32) still held its one message {DEADLINE_S:g} s after it arrived") from None
    assert [m.data for m in got] == [b"late"]
    assert await puller.fetch(8, timeout=0.3) == []  # nothing left: an empty list at the timeout


async def test_two_pullers_in_a_closed_loop_never_sit_on_messages(harness: Harness) -> None:
    """Two replicas share one durable consumer; 16 messages circulate (each handled one is acked and
    replaced), so the next message only comes once a fetch hands over what it holds. A fetch that sat
    on its messages until its timeout would stall the loop far past the deadline."""
    await _consumer(harness, "PULL2", "p2.x")
    stop, handled = asyncio.Event(), [0]
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
                for m in await puller.fetch(32, timeout=FETCH_TIMEOUT_S):
                    task = asyncio.create_task(handle(m))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        finally:
            await asyncio.gather(*tasks, return_exceptions=True)
            await nc.close()

    replicas = [asyncio.create_task(replica()) for _ in range(2)]
    await _waiting(harness, "PULL2", 2)  # both replicas wait on the consumer: they contend from the start
    for _ in range(in_flight):
        await harness.js.publish("p2.x", b"first")
    try:
        async with asyncio.timeout(DEADLINE_S):
            await stop.wait()
    except TimeoutError:
        raise AssertionError(f"the loop stalled: {handled[0]} of {target} handled in {DEADLINE_S:g} s") from None
    finally:
        for r in replicas:  # each may still wait in a fetch with nothing left to come
            r.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*replicas, return_exceptions=True)
    assert handled[0] >= target
