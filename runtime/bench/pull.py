"""How fast a pull hands over its messages (runtime/engine/pull.py `Puller`): the figures that
tests/test_puller.py only bounds.

    python -m runtime.bench.pull                # prints one JSON line per measurement, then a table
    python -m runtime.bench.pull --rounds 200 --handled 5000

``late``: a fetch for 32 is waiting on an empty consumer; one message is published; how long from
the publish until the fetch returns it (a fetch that waited for its timeout would show the timeout).
``closed loop``: R replicas share one durable consumer while 16 messages circulate (each handled
message is acked and replaced); messages handled per second, and how long each fetch that returned
messages took. Against a fresh embedded nats-server (fsync on every write, as shipped).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig
from rich.console import Console
from rich.table import Table

from broker.connect import connect
from broker.server import EmbeddedServer
from runtime.bench.report import pct
from runtime.engine.pull import Puller

FETCH_TIMEOUT_S = 5.0
IN_FLIGHT = 16


async def _consumer(nc: Client, stream: str) -> None:
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.x"]))
    await js.add_consumer(stream, ConsumerConfig(durable_name="d", ack_policy=AckPolicy.EXPLICIT, ack_wait=30))


def _figures(name: str, seconds: list[float], **extra: Any) -> dict[str, Any]:
    ms = [s * 1000 for s in seconds]
    row = {"measurement": name, "fetches": len(ms), **extra}
    return (
        row
        | {f"fetch_ms_{k}": round(v, 2) for k, v in (("p50", pct(ms, 50)), ("p99", pct(ms, 99)))}
        | {
            "fetch_ms_max": round(max(ms, default=0.0), 2),
            "fetches_over_half_timeout": sum(s > FETCH_TIMEOUT_S / 2 for s in seconds),
        }
    )


async def late(nc: Client, rounds: int) -> dict[str, Any]:
    await _consumer(nc, "LATE")
    js, puller = nc.jetstream(), await Puller(nc, "LATE", "d").start()
    took: list[float] = []
    for _ in range(rounds):
        fetching = asyncio.create_task(puller.fetch(32, timeout=FETCH_TIMEOUT_S))
        while (await js.consumer_info("LATE", "d")).num_waiting < 1:
            await asyncio.sleep(0.001)
        t0 = time.perf_counter()
        await js.publish("LATE.x", b"late")
        msgs = await fetching
        took.append(time.perf_counter() - t0)
        for m in msgs:
            await m.ack()
    return _figures("late message, 1 puller", took)


async def closed_loop(url: str, nc: Client, replicas: int, handled_target: int) -> dict[str, Any]:
    stream = f"LOOP{replicas}"
    await _consumer(nc, stream)
    js, stop, handled, took = nc.jetstream(), asyncio.Event(), [0], []

    async def handle(m: Msg) -> None:
        await m.ack()
        handled[0] += 1
        if handled[0] >= handled_target:
            stop.set()
        elif not stop.is_set():
            await js.publish(f"{stream}.x", b"next")

    async def replica() -> None:
        own = await connect(url, name="bench-pull")
        puller, tasks = await Puller(own, stream, "d").start(), set()
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                msgs = await puller.fetch(32, timeout=FETCH_TIMEOUT_S)
                if msgs:
                    took.append(time.perf_counter() - t0)
                for m in msgs:
                    tasks.add(task := asyncio.create_task(handle(m)))
                    task.add_done_callback(tasks.discard)
        finally:
            await asyncio.gather(*tasks, return_exceptions=True)
            await own.close()

    running = [asyncio.create_task(replica()) for _ in range(replicas)]
    while (await js.consumer_info(stream, "d")).num_waiting < replicas:
        await asyncio.sleep(0.01)
    t0 = time.perf_counter()
    for _ in range(IN_FLIGHT):
        await js.publish(f"{stream}.x", b"first")
    await stop.wait()
    wall = time.perf_counter() - t0
    for r in running:
        r.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    name = f"closed loop, {IN_FLIGHT} in flight, {replicas} puller(s)"
    return _figures(name, took, handled=handled[0], handled_per_s=round(handled[0] / wall))


async def main(rounds: int, handled: int) -> list[dict[str, Any]]:
    with EmbeddedServer() as server:
        nc = await connect(server.url, name="bench-pull")
        try:
            rows = [await late(nc, rounds)]
            for replicas in (1, 2, 4):
                rows.append(await closed_loop(server.url, nc, replicas, handled))
        finally:
            await nc.close()
    return rows


def table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title=f"pull latency ({os.cpu_count()} cores, fetch timeout {FETCH_TIMEOUT_S:g} s)")
    for col in ("measurement", "fetches", "p50 ms", "p99 ms", "max ms", "> timeout/2", "handled/s"):
        t.add_column(col)
    for r in rows:
        cells = (r["fetch_ms_p50"], r["fetch_ms_p99"], r["fetch_ms_max"], r["fetches_over_half_timeout"])
        t.add_row(r["measurement"], str(r["fetches"]), *map(str, cells), str(r.get("handled_per_s", "-")))
    return t


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=100, help="late-message fetches (default 100)")
    parser.add_argument("--handled", type=int, default=2000, help="messages per closed loop (default 2000)")
    args = parser.parse_args()
    figures = asyncio.run(main(args.rounds, args.handled))
    for row in figures:
        print(json.dumps(row), flush=True)
    Console(stderr=True, width=120).print(table(figures))
