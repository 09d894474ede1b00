"""Benchmark the sandbox: start-up per backend, and a code environment's throughput.

    python -m runtime.bench.sandbox [--backend process ...] [--runs 200] [--seconds 20] [--concurrency 16]

1. Start-up: median and p99 ms to run ``print(1)`` to completion, one run at a time, per backend
   (what every code rollout pays at least once), and the CPU ms each run costs the host (this
   process and the sandboxed processes; not the Docker engine's), which load elsewhere does not inflate.
2. Throughput: ``code_gen`` at C rollouts in flight (a closed loop: a new Start for every Result)
   through the real stack ``gymbus collect`` starts (embedded broker, the simulated policy answering
   every task with its reference solution, one worker process per function), process backend:
   rollouts/s and end-to-end p50/p99, each rollout running its task's 3 unit tests.

Each line is JSON and carries the 1-minute load average: figures from a busy machine are not comparable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg

from broker import topology
from broker.connect import connect
from broker.publish import publish
from broker.schemas import Options, Start, result_decoder, session_id
from runtime.errors import SandboxError
from runtime.model.client import register
from runtime.runs.stack import LocalStack
from runtime.sandbox.config import BACKENDS, SandboxConfig
from runtime.sandbox.core import Sandbox
from runtime.testing import task_rows

CODE_GEN = Path(__file__).parents[2] / "functions" / "code_gen" / "data" / "example.jsonl"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _cpu_s() -> float:
    """CPU of this process and its reaped children (the sandboxed runs; for docker, the engine's work is not here)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


async def startup(backend: str, runs: int) -> dict[str, object]:
    sandbox = Sandbox(SandboxConfig.from_env(backend=backend))
    for _ in range(3):  # warm: the backend's one-time setup, the page cache
        await sandbox.run("print(1)")
    times = []
    cpu0 = _cpu_s()
    for _ in range(runs):
        t0 = time.perf_counter()
        outcome = await sandbox.run("print(1)")
        times.append((time.perf_counter() - t0) * 1000)
        assert outcome.stdout == "1\n", outcome
    cpu_ms = (_cpu_s() - cpu0) / runs * 1000
    return {
        "bench": "startup",
        "backend": backend,
        "runs": runs,
        "median_ms": round(statistics.median(times), 1),
        "p99_ms": round(_pct(times, 0.99), 1),
        "cpu_ms_per_run": round(cpu_ms, 1),
        "load_1m": round(os.getloadavg()[0], 2),
    }


async def throughput(seconds: float, concurrency: int) -> dict[str, object]:
    rows = task_rows(CODE_GEN)
    with tempfile.TemporaryDirectory(prefix="gymbus-bench-sandbox-") as folder:
        stack = LocalStack(Path(folder))
        try:
            url = stack.start_broker()
            policy = stack.start_simulator(str(CODE_GEN), accuracy=1.0, latency_ms=0, seed=0, model="policy")
            nc = await connect(url, name="sandbox-bench")
            js = nc.jetstream()
            await topology.ensure(js)
            await register(js, "policy", [policy])
            for fn in ("simple_agent", "code_gen"):
                await topology.ensure_consumer(js, "agent" if fn == "simple_agent" else "verify", fn)
                stack.start_worker(fn, 0, concurrency=concurrency)
            return await _loop(nc, rows, seconds, concurrency)
        finally:
            stack.stop()


async def _loop(nc: Client, rows: list[dict], seconds: float, concurrency: int) -> dict[str, object]:
    js = nc.jetstream()
    run_id = f"bench-{int(time.time())}"
    sent: dict[str, float] = {}
    done: list[float] = []
    rewards: list[float | None] = []
    free = asyncio.Semaphore(concurrency)

    async def on_result(msg: NatsMsg) -> None:
        result = result_decoder.decode(msg.data)
        done.append(time.perf_counter() - sent.pop(result.session_id, time.perf_counter()))
        rewards.append(result.reward)
        free.release()

    await nc.subscribe(topology.result_subject(run_id), cb=on_result)
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        await free.acquire()
        row = rows[n % len(rows)]
        msg = Start(
            run_id=run_id,
            task_index=n,
            agent="simple_agent",
            env="code_gen",
            responses_create_params=row["responses_create_params"],
            meta={k: v for k, v in row.items() if k != "responses_create_params"},
            options=Options(),
        )
        sid = session_id(run_id, n, 0)
        sent[sid] = time.perf_counter()
        await publish(js, topology.agent_subject("simple_agent"), msg, f"{sid}:start:0")
        n += 1
    finished = len(done)
    elapsed = time.perf_counter() - start
    await nc.close()
    return {
        "bench": "code_gen",
        "backend": "process",
        "concurrency": concurrency,
        "seconds": round(elapsed, 1),
        "rollouts": finished,
        "rollouts_per_s": round(finished / elapsed, 1),
        "e2e_p50_ms": round(_pct(done, 0.5) * 1000),
        "e2e_p99_ms": round(_pct(done, 0.99) * 1000),
        "mean_reward": round(sum(r or 0 for r in rewards) / max(1, len(rewards)), 3),
        "load_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="default: every backend")
    parser.add_argument("--runs", type=int, default=200, help="print(1) runs per backend")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the throughput loop")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--no-throughput", action="store_true")
    args = parser.parse_args(argv)
    for backend in args.backend or list(BACKENDS):
        try:
            print(json.dumps(asyncio.run(startup(backend, args.runs))), flush=True)
        except SandboxError as exc:
            print(json.dumps({"bench": "startup", "backend": backend, "skipped": exc.reason}), flush=True)
    if not args.no_throughput:
        print(json.dumps(asyncio.run(throughput(args.seconds, args.concurrency))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
