"""Measurements behind two design proposals (runtime/bench/README.md): each runs on a fresh embedded broker.

- sessions partitioned over N KV streams: does the fsync-bound CAS rate scale with N?
- one JetStream atomic batch per hop (session CAS + next message): does it commit and abort as one,
  and at what rate?
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from nats.aio.client import Client

from broker import topology
from broker.connect import connect
from broker.schemas import Session
from broker.server import EmbeddedServer
from broker.sessions import SessionStore
from runtime.bench.micro import _fields, tool_session


async def partitioned_cas(streams: int, callers: int = 16, n: int = 1200) -> dict[str, Any]:
    """CAS writes/s of ``callers`` sessions spread over ``streams`` KV buckets, fsync on every write."""
    with EmbeddedServer(sync_always=True) as server:
        nc = await connect(server.url, name="gymbus-designs")
        js = nc.jetstream()
        stores = []
        for b in range(streams):
            await js.add_stream(topology.kv_stream(f"sessions-{b}", ttl_s=3600))
            stores.append(SessionStore(js, f"sessions-{b}"))
        base = _fields(tool_session())

        async def caller(c: int) -> None:
            s, rev = Session(**{**base, "session_id": f"p.{c}.0"}), 0
            for _ in range(n // callers):
                rev = await stores[c % streams].update(s, last=rev)

        t0 = time.perf_counter()
        await asyncio.gather(*(caller(c) for c in range(callers)))
        rate = n / (time.perf_counter() - t0)
        await nc.close()
    return {"design": f"session CAS over {streams} KV stream(s), fsync", "callers": callers, "per_s": round(rate)}


async def _batch(nc: Client, key: str, last: int, step: int, payload: bytes) -> dict[str, Any]:
    """Session CAS (``st.<key>``, expecting ``last``) and the next message (``wk.tool``), committed together."""
    bid = f"{key}-{step}"
    state = {"Nats-Batch-Id": bid, "Nats-Batch-Sequence": "1", "Nats-Expected-Last-Subject-Sequence": str(last)}
    await nc.publish(f"st.{key}", payload, headers=state)
    commit = {"Nats-Batch-Id": bid, "Nats-Batch-Sequence": "2", "Nats-Batch-Commit": "1", "Nats-Msg-Id": bid}
    return json.loads((await nc.request("wk.tool", b"{}", headers=commit, timeout=10)).data)


async def atomic_batches(sync_always: bool, callers: int, n: int = 400) -> dict[str, Any]:
    """Checks that a stale CAS aborts the whole batch, then times chains of batches."""
    with EmbeddedServer(sync_always=sync_always) as server:
        nc = await connect(server.url, name="gymbus-designs")
        config = {"name": "S", "subjects": ["st.>", "wk.>"], "storage": "file", "allow_atomic": True}
        await nc.request("$JS.API.STREAM.CREATE.S", json.dumps(config).encode(), timeout=5)
        first = await _batch(nc, "probe", 0, 1, b"s1")
        stale = await _batch(nc, "probe", 0, 2, b"s2")
        state = json.loads((await nc.request("$JS.API.STREAM.INFO.S", b"", timeout=5)).data)["state"]
        atomic = "error" not in first and "error" in stale and state["messages"] == 2

        async def caller(c: int) -> None:
            last = 0
            for k in range(n // callers):
                ack = await _batch(nc, f"c{c}", last, k, b"x" * 844)
                last = ack["seq"] - 1

        t0 = time.perf_counter()
        await asyncio.gather(*(caller(c) for c in range(callers)))
        rate = n / (time.perf_counter() - t0)
        await nc.close()
    tag = "fsync" if sync_always else "no fsync"
    return {"design": f"atomic batch: CAS + message, {tag}", "callers": callers, "per_s": round(rate), "atomic": atomic}


async def main() -> list[dict[str, Any]]:
    rows = [await partitioned_cas(k) for k in (1, 2, 4)]
    for sync in (True, False):
        rows += [await atomic_batches(sync, c) for c in (1, 16)]
    return rows


if __name__ == "__main__":
    for row in asyncio.run(main()):
        print(json.dumps(row))
