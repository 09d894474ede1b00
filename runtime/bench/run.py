"""Run one configuration end to end: fresh stack, warm-up, the measured closed loop, figures."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker import topology
from broker.connect import connect
from runtime.bench.grid import Bounds, Config
from runtime.bench.loop import ClosedLoop
from runtime.bench.meter import Meter
from runtime.bench.profiler import Profiler
from runtime.bench.report import Usage, figures
from runtime.bench.stack import BenchStack
from runtime.bench.workload import Starts, task_rows
from runtime.model.client import register


@dataclass(frozen=True)
class Settings:
    """How every configuration of a run is set up."""

    folder: Path
    bounds: Bounds
    worker_concurrency: int | None = None
    """Messages per worker and subject; None: max(64, C / W), so the workers never cap C."""
    broker_sync: str = "always"
    """The broker's fsync policy (`broker.server.sync_setting`): ``always`` as shipped, a duration, or ``default``."""
    uvloop: bool = False
    profile: bool = False
    """Record each worker with py-spy during the measured window (needs py-spy and ptrace rights)."""
    keep: bool = False
    """Keep each configuration's broker store and logs."""

    def concurrency_for(self, c: Config) -> int:
        return self.worker_concurrency or max(64, -(-c.concurrency // c.replicas))


async def measure(c: Config, s: Settings) -> dict[str, Any]:
    """Figures of ``c`` on a fresh stack (its processes are stopped before this returns)."""
    folder = s.folder / _slug(c)
    stack = BenchStack(folder, c, worker_concurrency=s.concurrency_for(c), sync=s.broker_sync, uvloop=s.uvloop)
    policy_url = await asyncio.to_thread(stack.start)
    try:
        return await _drive(c, s, stack, policy_url, folder)
    finally:
        await asyncio.to_thread(stack.stop)
        if not s.keep:
            shutil.rmtree(folder / "broker", ignore_errors=True)


async def _drive(c: Config, s: Settings, stack: BenchStack, policy_url: str, folder: Path) -> dict[str, Any]:
    nc = await connect(stack.nats_url, name="gymbus-bench")
    try:
        js = nc.jetstream()
        await topology.ensure(js)
        await register(js, "policy", [policy_url])
        await stack.wait_ready(js)
        rows = task_rows()
        await _warm_up(nc, c, rows, s.bounds)
        meter = Meter({**stack.pids(), "driver": os.getpid()})
        profiler = Profiler(folder / "profiles", {k: v for k, v in stack.pids().items() if k.startswith("worker")})
        idle = _workers(meter.rss())
        meter.start_sampling()
        marks: dict[str, dict[str, float]] = {}

        def on_warm() -> None:
            marks["warm"] = {**meter.cpu(), "machine": meter.machine_busy()}
            meter.reset_sampled_peak()
            if s.profile:
                profiler.start()

        def on_stop() -> None:
            marks["stop"] = {**meter.cpu(), "machine": meter.machine_busy()}
            profiler.stop()

        n = s.bounds.rollouts_for(c)
        loop = ClosedLoop(nc, Starts(f"bench-{secrets.token_hex(3)}", c.workload, rows), c.concurrency)
        out = await loop.run(n, s.bounds.seconds, s.bounds.drain_s, on_warm, on_stop)
        await meter.stop_sampling()
        cpu = {k: marks["stop"].get(k, 0.0) - marks.get("warm", {}).get(k, 0.0) for k in marks["stop"]}
        machine = cpu.pop("machine")
        usage = Usage(cpu, machine, meter.peak(), idle, _workers(meter.sampled_peak))
        result = {**figures(c, out, usage, len(out.rollouts)), "broker_sync": s.broker_sync}
        if s.profile:
            result["profiles"] = profiler.files()
        return result
    finally:
        await nc.close()


async def _warm_up(nc: Any, c: Config, rows: list[dict[str, Any]], bounds: Bounds) -> None:
    """A few rollouts nobody measures: lazy imports, HTTP connections, the broker's first writes."""
    if bounds.warmup <= 0:
        return
    loop = ClosedLoop(nc, Starts(f"warm-{secrets.token_hex(3)}", c.workload, rows), min(bounds.warmup, 8))
    out = await loop.run(bounds.warmup, 60.0, 60.0, lambda: None, lambda: None)
    if len(out.completed) < bounds.warmup:
        raise RuntimeError(f"warm-up finished {len(out.completed)} of {bounds.warmup} rollouts")


def _workers(values: dict[str, int]) -> int:
    return sum(v for k, v in values.items() if k.startswith("worker"))


def _slug(c: Config) -> str:
    return f"{c.workload}-L{c.latency_ms:g}-C{c.concurrency}-W{c.replicas}"
