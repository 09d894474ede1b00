"""The hot path's primitives, one at a time: what each costs in latency and in CPU, client and broker.

    python -m runtime.bench.micro            # prints one JSON line per primitive, then a table

Broker round trips are measured against a fresh embedded nats-server (fsync on every write, as
shipped, and off for comparison) at 1 and 16 concurrent callers; pure-CPU steps in-process.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import stamina
from rich.console import Console
from rich.table import Table

from broker import topology
from broker.connect import connect
from broker.publish import publish_raw
from broker.schemas import Session, Verify, encoder, session_decoder, session_encoder
from broker.server import EmbeddedServer
from broker.sessions import SessionStore
from runtime.bench.report import pct
from runtime.bench.workload import TASKS, Starts, task_rows
from runtime.engine.records import new_session
from runtime.engine.transitions import Delivery

Op = Callable[[int, int], Awaitable[Any]]
"""One operation: (caller, iteration) -> awaitable."""


def tool_session() -> Session:
    """A "tool" rollout's session as the verifier loads it: input, tool call, tool output, answer."""
    s = new_session(Starts("micro", "tool", task_rows())(0), 0, Delivery(published_at=time.time()))
    s.items += [
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "calculator", "arguments": '{"e": "138"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "138"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "\\boxed{138}"}]},
    ]
    s.step, s.phase = 3, "verify"
    return s


async def timed(name: str, op: Op, callers: int, n: int, procs: dict[str, psutil.Process]) -> dict[str, Any]:
    """Latency of each call, and CPU per call of each watched process, with ``callers`` running at once."""
    lat: list[float] = []

    async def caller(c: int) -> None:
        for i in range(n // callers):
            t0 = time.perf_counter()
            await op(c, i)
            lat.append(time.perf_counter() - t0)

    cpu0 = {k: _cpu(p) for k, p in procs.items()}
    t0 = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    wall = time.perf_counter() - t0
    row: dict[str, Any] = {"primitive": name, "callers": callers, "ops_per_s": round(len(lat) / wall)}
    row |= {"p50_us": round(pct(lat, 50) * 1e6), "p99_us": round(pct(lat, 99) * 1e6)}
    row |= {f"{k}_cpu_us": round((_cpu(p) - cpu0[k]) / len(lat) * 1e6, 1) for k, p in procs.items()}
    return row


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


async def broker_ops(sync_always: bool, n: int) -> list[dict[str, Any]]:
    rows = []
    with EmbeddedServer(sync_always=sync_always) as server:
        nc = await connect(server.url, name="gymbus-micro")
        js = nc.jetstream()
        await topology.ensure(js)
        store, session = SessionStore(js), tool_session()
        revs: dict[int, int] = {}
        verify = encoder.encode(Verify(session_id=session.session_id, step=3))
        assert server.proc is not None
        procs = {"client": psutil.Process(), "broker": psutil.Process(server.proc.pid)}
        tag = "fsync" if sync_always else "no fsync"

        async def cas(c: int, i: int) -> None:
            s = Session(**{**_fields(session), "session_id": f"micro.{c}.0"})
            revs[c] = await store.update(s, last=revs.get(c, 0))

        async def get(c: int, i: int) -> None:
            await store.get(f"micro.{c}.0", any_replica=True)

        async def pub(c: int, i: int) -> None:
            await publish_raw(js, topology.verify_subject("micro"), verify, {"Nats-Msg-Id": f"{tag}:{c}:{i}"})

        for callers in (1, 16):
            for name, op in (("KV CAS update", cas), ("KV get (direct)", get), ("publish + ack", pub)):
                rows.append(await timed(f"{name}, {tag}", op, callers, n, procs))
        await nc.close()
    return rows


def _fields(s: Session) -> dict[str, Any]:
    return {f: getattr(s, f) for f in s.__struct_fields__}


def cpu_only(n: int) -> list[dict[str, Any]]:
    """In-process steps: the retry wrapper, the session codec, the verifier (on varied answers: it caches)."""
    from functions.math.env import _check

    session = tool_session()
    blob = session_encoder.encode(session)
    answers = iter(range(10**9))

    async def stamina_context() -> None:
        async for attempt in stamina.retry_context(on=TimeoutError, timeout=120.0, wait_max=2.0, attempts=None):
            with attempt:
                return

    steps: list[tuple[str, Callable[[], Any]]] = [
        ("stamina.retry_context, async (one try)", lambda: asyncio.run(_repeat(stamina_context, n))),
        (f"session encode, msgpack ({len(blob)} B)", lambda: [session_encoder.encode(session) for _ in range(n)]),
        (f"session decode, msgpack ({len(blob)} B)", lambda: [session_decoder.decode(blob) for _ in range(n)]),
        (
            "math-verify check (verifier)",
            lambda: [_check(str(a := next(answers)), f"is \\boxed{{{a}}}.") for _ in range(n)],
        ),
    ]
    rows = []
    for name, fn in steps:
        t0 = time.process_time()
        fn()
        rows.append({"primitive": name, "callers": 1, "client_cpu_us": round((time.process_time() - t0) / n * 1e6, 1)})
    return rows


async def _repeat(fn: Callable[[], Awaitable[None]], n: int) -> None:
    for _ in range(n):
        await fn()


async def model_call(n: int, folder: Path) -> list[dict[str, Any]]:
    """One agent model call over HTTP to the simulated policy (L = 0), as the agent makes it."""
    from runtime.model.client import Endpoints, ModelClient
    from runtime.runs.stack import LocalStack

    stack = LocalStack(folder)
    stack.log_dir.mkdir(parents=True, exist_ok=True)
    url = await asyncio.to_thread(
        stack.start_simulator, str(TASKS), accuracy=1.0, latency_ms=0.0, seed=0, model="policy"
    )
    client = ModelClient(Endpoints(static=url))
    session = tool_session()
    procs = {"client": psutil.Process(), "policy": psutil.Process(stack.procs[0].proc.pid)}
    try:
        await client(session.items[:1], session.params, session)
        return [
            await timed(
                "model call over HTTP (L=0)",
                lambda c, i: client(session.items[:1], session.params, session),
                k,
                n,
                procs,
            )
            for k in (1, 16)
        ]
    finally:
        await client.close()
        await asyncio.to_thread(stack.stop)


async def main(n: int = 2000, folder: Path = Path("runs/bench-micro")) -> list[dict[str, Any]]:
    rows = await model_call(n, folder)
    for sync in (True, False):
        rows += await broker_ops(sync, n)
    return rows


def table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="hot-path primitives (µs; CPU per call)")
    cols = ["primitive", "callers", "ops_per_s", "p50_us", "p99_us", "client_cpu_us", "broker_cpu_us", "policy_cpu_us"]
    for c in cols:
        t.add_column(c, justify="left" if c == "primitive" else "right")
    for r in rows:
        t.add_row(*(str(r.get(c, "-")) for c in cols))
    return t


if __name__ == "__main__":
    out = cpu_only(2000) + asyncio.run(main())
    for r in out:
        print(json.dumps(r))
    Console(stderr=True, width=160).print(table(out))
