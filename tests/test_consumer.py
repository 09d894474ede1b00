"""The worker's continuous pull requests (runtime/engine/pull.py `Consumer`) against a real nats-server.

A worker keeps its free handler slots asked for with lingering, overlapping pull requests; the
broker does not say which request a message answers, so the consumer counts what is asked in all.
These tests pin what the worker relies on: a message is handed over the moment it arrives, with two
replicas too; no more is asked than there are free slots; what a request leaves unfilled when it
expires is asked again; a stopping consumer asks for nothing more once its open requests end.
"""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from broker.connect import connect
from runtime.engine.pull import Consumer, Slots
from runtime.testing import Harness, wait_until

DEADLINE_S = 60.0


async def _consumer(h: Harness, stream: str, subject: str, ack_wait: float = 30) -> None:
    await h.js.add_stream(StreamConfig(name=stream, subjects=[subject]))
    await h.js.add_consumer(stream, ConsumerConfig(durable_name="d", ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait))


async def test_each_message_is_handed_over_as_it_arrives_and_no_more_is_asked_than_slots_are_free(
    harness: Harness,
) -> None:
    await _consumer(harness, "CONS1", "c1.x")
    got: list[Msg] = []
    slots = Slots(4)
    consumer = await Consumer(harness.nc, "CONS1", "d").start(slots, got.append)  # type: ignore[arg-type]
    loop = asyncio.create_task(consumer.run(threshold=1, expires=0.5))
    try:
        for i in range(6):
            await harness.js.publish("c1.x", str(i).encode())
        await wait_until(lambda: _true(len(got) == 4), "the first 4 messages handed over")
        # every slot is taken: nothing is asked for, so the other 2 stay at the broker, even across expiries
        await wait_until(lambda: _true(consumer.asked == 0), "nothing asked while every slot is busy")
        info = await harness.js.consumer_info("CONS1", "d")
        assert info.num_pending == 2 and info.num_ack_pending == 4 and len(got) == 4 and slots.free == 0

        for m in got[:2]:  # two handlers end: two slots free, asked for at once
            await m.ack()
            slots.give()
        await wait_until(lambda: _true(len(got) == 6), "the last 2 messages handed over")
        assert [m.data for m in got] == [str(i).encode() for i in range(6)]

        # idle, with two slots free: requests expire (408 with the count left) and are sent again, so a
        # message published now is handed over without waiting for anything but the broker
        for m in got[2:4]:
            await m.ack()
            slots.give()
        await wait_until(lambda: _true(consumer.requests >= 6), "requests sent again after expiring unfilled")
        await harness.js.publish("c1.x", b"late")
        await wait_until(lambda: _true(len(got) == 7), "a message published to an idle consumer")
        assert got[-1].data == b"late" and consumer.asked <= slots.free
    finally:
        slots.close()
        await asyncio.wait_for(loop, DEADLINE_S)


async def test_two_consumers_in_a_closed_loop_never_sit_on_messages(harness: Harness) -> None:
    """Two replicas share one durable consumer; 16 messages circulate (each handled one is acked and
    replaced). A consumer that held a delivered message until its request expired would stall the
    loop far past the deadline."""
    await _consumer(harness, "CONS2", "c2.x")
    stop, handled = asyncio.Event(), [0, 0]
    in_flight, target = 16, 600

    async def replica(k: int) -> None:
        nc = await connect(harness.broker.url, name=f"test-consumer-{k}")
        slots, tasks = Slots(8), set[asyncio.Task[None]]()

        async def handle(m: Msg) -> None:  # as the worker does: each message in its own task
            await m.ack()
            handled[k] += 1
            slots.give()
            if sum(handled) >= target:
                stop.set()
            elif not stop.is_set():
                await harness.js.publish("c2.x", b"next")

        def take(m: Msg) -> None:
            task = asyncio.create_task(handle(m))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        consumer = await Consumer(nc, "CONS2", "d").start(slots, take)
        loop = asyncio.create_task(consumer.run(threshold=2, expires=30.0))
        await stop.wait()
        slots.close()
        await asyncio.gather(*tasks, return_exceptions=True)
        loop.cancel()
        await nc.close()

    replicas = [asyncio.create_task(replica(k)) for k in range(2)]
    await wait_until(lambda: _waiting(harness, "CONS2", 2), "both replicas asking")
    for _ in range(in_flight):
        await harness.js.publish("c2.x", b"first")
    try:
        async with asyncio.timeout(DEADLINE_S):
            await stop.wait()
    except TimeoutError:
        raise AssertionError(f"the loop stalled: {sum(handled)} of {target} handled in {DEADLINE_S:g} s") from None
    finally:
        stop.set()
        await asyncio.gather(*replicas, return_exceptions=True)
    assert sum(handled) >= target and min(handled) > 0  # both replicas took their share


async def test_a_stopping_consumer_asks_for_nothing_more_and_ends_with_its_last_request(harness: Harness) -> None:
    """What an open request still brings after the slots close is handed over (the worker drains it);
    once that request has ended, the consumer's loop ends and later messages stay at the broker."""
    await _consumer(harness, "CONS3", "c3.x")
    got: list[Msg] = []
    slots = Slots(8)
    consumer = await Consumer(harness.nc, "CONS3", "d").start(slots, got.append)  # type: ignore[arg-type]
    loop = asyncio.create_task(consumer.run(threshold=1, expires=2.0))
    await wait_until(lambda: _waiting(harness, "CONS3", 1), "a request waiting")
    slots.close()  # stopping, with its request still open at the broker
    await harness.js.publish("c3.x", b"in flight")
    await asyncio.wait_for(loop, DEADLINE_S)  # ends once its open request has (2 s, and its grace)
    assert [m.data for m in got] == [b"in flight"]
    requests = consumer.requests
    await harness.js.publish("c3.x", b"after")
    info = await harness.js.consumer_info("CONS3", "d")
    assert consumer.requests == requests, "a stopped consumer sent a pull request"
    assert (info.num_waiting, info.num_pending, info.num_ack_pending) == (0, 1, 1), info


async def _true(value: bool) -> bool:
    return value


async def _waiting(h: Harness, stream: str, n: int) -> bool:
    return (await h.js.consumer_info(stream, "d")).num_waiting >= n


async def test_a_request_the_broker_refuses_is_taken_back_and_asked_again(harness: Harness) -> None:
    """A consumer that takes one waiting request (``max_waiting`` 1) refuses a second with 409 and no
    count: the consumer takes back all that request asked for, asks again a moment later, and every
    message is handed over with never more in hand than there are slots."""
    await harness.js.add_stream(StreamConfig(name="CONS4", subjects=["c4.x"]))
    config = ConsumerConfig(durable_name="d", ack_policy=AckPolicy.EXPLICIT, ack_wait=30, max_waiting=1)
    await harness.js.add_consumer("CONS4", config)
    got: list[Msg] = []
    slots = Slots(4)
    lowest = [slots.free]

    def take(m: Msg) -> None:
        got.append(m)
        lowest[0] = min(lowest[0], slots.free)

    consumer = await Consumer(harness.nc, "CONS4", "d").start(slots, take)  # type: ignore[arg-type]
    loop = asyncio.create_task(consumer.run(threshold=1, expires=5.0))
    try:
        await wait_until(lambda: _waiting(harness, "CONS4", 1), "the first request waiting")
        for i in range(2):
            await harness.js.publish("c4.x", str(i).encode())
        await wait_until(lambda: _true(len(got) == 2), "2 messages on the first request")
        sent = consumer.requests
        for m in got:  # 2 slots back: a second request, refused while the first still waits for 2 more
            await m.ack()
            slots.give()
        await wait_until(lambda: _true(consumer.requests >= sent + 2), "the refused request asked again")
        assert consumer.asked <= slots.free
        for i in range(2, 6):
            await harness.js.publish("c4.x", str(i).encode())
        await wait_until(lambda: _true(len(got) == 6), "all 6 messages handed over")
        assert sorted(m.data for m in got) == [str(i).encode() for i in range(6)] and lowest[0] >= 0
    finally:
        slots.close()
        await asyncio.wait_for(loop, DEADLINE_S)
