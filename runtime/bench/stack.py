"""One fresh stack per configuration: an embedded nats-server, the simulated policy, W workers per function.

It is `runtime.runs.stack.LocalStack` (the stack `gymbus collect` starts), so every process runs the
same command as in production: ``python -m runtime worker|simulate ...``.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from nats.js import JetStreamContext

from broker import topology
from broker.server import EmbeddedServer
from broker.topology import Role
from runtime.bench.grid import Config
from runtime.bench.workload import TASKS
from runtime.runs.stack import LocalStack

FUNCTIONS = ("simple_agent", "math")


class BenchStack:
    """Start, inspect and stop the processes of one configuration."""

    def __init__(self, folder: Path, config: Config, *, worker_concurrency: int, sync: str, uvloop: bool) -> None:
        self.config = config
        self.local = LocalStack(folder)
        self.worker_concurrency = worker_concurrency
        self.sync = sync
        self.uvloop = uvloop

    @property
    def nats_url(self) -> str:
        return self.local.nats_url

    def start(self) -> str:
        """Start everything; returns the policy's base URL."""
        self.local.log_dir.mkdir(parents=True, exist_ok=True)
        self.local.broker = EmbeddedServer(
            self.local.run_dir / "broker",
            log_file=self.local.log_dir / "nats-server.log",
            sync=self.sync,
            die_with_parent=True,
        ).start()
        url = self.local.start_simulator(
            str(TASKS), accuracy=0.75, latency_ms=self.config.latency_ms, seed=0, model="policy"
        )
        if self.uvloop:
            os.environ["GYMBUS_UVLOOP"] = "1"  # read by `gymbus worker`; the children inherit it
        try:
            for fn in FUNCTIONS:
                for replica in range(self.config.replicas):
                    self.local.start_worker(fn, replica, concurrency=self.worker_concurrency)
        finally:
            os.environ.pop("GYMBUS_UVLOOP", None)
        return url

    def pids(self) -> dict[str, int]:
        """Process name -> pid: ``broker``, ``policy``, ``worker-<function>-<replica>``."""
        assert self.local.broker is not None and self.local.broker.proc is not None
        out = {"broker": self.local.broker.proc.pid}
        for p in self.local.procs:
            out["policy" if p.name.startswith("policy") else p.name] = p.proc.pid
        return out

    async def wait_ready(self, js: JetStreamContext, timeout_s: float = 90.0) -> None:
        """Until every replica has a pull request waiting on each of its consumers."""
        deadline = time.monotonic() + timeout_s
        wanted: list[tuple[Role, str]] = [("agent", "simple_agent"), ("tool", "math"), ("verify", "math")]
        while time.monotonic() < deadline:
            dead = self.local.check()
            if dead:
                raise RuntimeError(f"{dead} exited during start-up; see {self.local.log_dir}")
            if all([await _waiting(js, role, name) >= self.config.replicas for role, name in wanted]):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"workers not ready within {timeout_s:g}s; see {self.local.log_dir}")

    def stop(self) -> None:
        self.local.stop()


async def _waiting(js: JetStreamContext, role: Role, name: str) -> int:
    try:
        info = await js.consumer_info(topology.WORK_STREAM, topology.durable(role, name))
    except Exception:
        return 0
    return info.num_waiting or 0
