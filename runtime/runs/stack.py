"""The local stack: what ``gymbus collect`` starts when no broker URL is given.

An embedded nats-server on the run folder's store, the simulated policy when no model URL is
configured, and one worker process per function replica, all as plain child processes of the CLI,
running the same commands the compose services run. Everything is stopped when the run ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import IO

from nats.js import JetStreamContext

from broker import functions
from broker.server import EmbeddedServer, die_with_parent

log = logging.getLogger("gymbus.stack")


def gymbus_command(*args: str) -> list[str]:
    """``gymbus ARGS`` as a command line that works without the console script on PATH."""
    return [sys.executable, "-m", "runtime", *args]


class Process:
    """A child process whose output goes to a log file."""

    def __init__(self, name: str, cmd: list[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.cmd = cmd
        self.log_path = log_dir / f"{name}.log"
        self._log: IO[bytes] = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE if name.startswith("policy") else self._log,
            stderr=self._log,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            preexec_fn=die_with_parent,
        )

    def read_ready_line(self, timeout: float = 60.0) -> dict[str, object]:
        """The first stdout line (a JSON object), which the simulated policy prints once listening."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        os.set_blocking(self.proc.stdout.fileno(), False)
        buf = b""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
            chunk = self.proc.stdout.read() or b""
            buf += chunk
            if b"\n" in buf:
                return json.loads(buf.split(b"\n", 1)[0])
            time.sleep(0.02)
        raise RuntimeError(f"{self.name} did not start within {timeout}s; see {self.log_path}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 15.0) -> None:
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()
        self._log.close()


class LocalStack:
    """Broker, simulated policy and workers for one run, as child processes."""

    def __init__(self, run_dir: Path, env: dict[str, str] | None = None) -> None:
        self.run_dir = run_dir
        self.env = env or {}
        """Extra environment of every child (e.g. where to write spans)."""
        self.log_dir = run_dir / "logs"
        self.broker: EmbeddedServer | None = None
        self.procs: list[Process] = []
        self.model_url: str | None = None
        self.restarts: Counter[str] = Counter()

    @property
    def nats_url(self) -> str:
        assert self.broker is not None
        return self.broker.url

    def start_broker(self) -> str:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.broker = EmbeddedServer(
            self.run_dir / "broker", log_file=self.log_dir / "nats-server.log", die_with_parent=True
        ).start()
        return self.broker.url

    def start_simulator(
        self,
        tasks: str,
        *,
        accuracy: float,
        latency_ms: float,
        seed: int,
        model: str,
        env: str | None = None,
        plays: dict[str, str] | None = None,
    ) -> str:
        proc = Process(
            "policy-simulated",
            gymbus_command(
                "simulate",
                "--tasks",
                tasks,
                "--accuracy",
                str(accuracy),
                "--latency-ms",
                str(latency_ms),
                "--seed",
                str(seed),
                "--model",
                model,
                "--port",
                "0",
                *(["--env", env] if env else []),
                *[arg for name, role in (plays or {}).items() for arg in ("--plays", f"{name}={role}")],
            ),
            self.log_dir,
            self.env,
        )
        self.procs.append(proc)
        self.model_url = str(proc.read_ready_line()["url"])
        return self.model_url

    def start_worker(self, ref: str, replica: int, *, concurrency: int) -> Process:
        name = ref.split(":")[0].rsplit(".", 1)[-1]
        proc = Process(
            f"worker-{name}-{replica}",
            gymbus_command("worker", ref, "--nats", self.nats_url, "--concurrency", str(concurrency)),
            self.log_dir,
            self.env,
        )
        self.procs.append(proc)
        return proc

    def start_profiler(self) -> Process:
        """The profiling consumer, so ``gymbus profile --run`` and ``gymbus status`` see the run live."""
        proc = Process("profiler", gymbus_command("profiler", "--nats", self.nats_url), self.log_dir)
        self.procs.append(proc)
        return proc

    async def wait_registered(
        self, js: JetStreamContext, agents: set[str], envs: set[str], since: float, timeout: float = 300
    ) -> None:
        """Until each function has registered since ``since`` (its worker is up and its tools are known
        to the agents), so the run's first Starts never meet an environment whose worker is starting."""
        deadline = time.monotonic() + timeout
        wanted: list[tuple[functions.FunctionRole, str]] = [("agent", a) for a in sorted(agents)]
        wanted += [("env", e) for e in sorted(envs)]
        for role, name in wanted:
            while (reg := await functions.read(js, role, name)) is None or reg.written_at < since:
                if dead := [p for p in self.check() if p.startswith("worker-")]:
                    raise RuntimeError(f"{dead[0]} exited while starting; see {self.log_dir / dead[0]}.log")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{role} {name!r} did not register within {timeout:g}s; see {self.log_dir}")
                await asyncio.sleep(0.1)

    def check(self) -> list[str]:
        """Names of child processes that died."""
        return [p.name for p in self.procs if not p.alive()]

    def restart_exited_workers(self, concurrency: int) -> None:
        """Start again every worker process that exited (its messages are redelivered to the new one)."""
        for proc in [p for p in self.procs if p.name.startswith("worker-") and not p.alive()]:
            self.restarts[proc.name] += 1
            log.warning(
                "%s exited (%s); restarting it (restart %d)", proc.name, proc.proc.returncode, self.restarts[proc.name]
            )
            self.procs.remove(proc)
            ref = proc.cmd[proc.cmd.index("worker") + 1]
            self.start_worker(ref, int(proc.name.rsplit("-", 1)[1]), concurrency=concurrency)

    def stop_workers(self) -> None:
        """Stop the workers, each draining what it holds (which may still call the model and publish)."""
        workers = [p for p in self.procs if p.name.startswith("worker-")]
        for p in workers:
            p.signal(signal.SIGTERM)
        for p in workers:
            p.stop()
        self.procs = [p for p in self.procs if p not in workers]

    def stop(self) -> None:
        """Workers first (draining in-flight work may still call the model), then the policy, then the broker."""
        self.stop_workers()
        for p in self.procs:
            p.stop()
        self.procs.clear()
        if self.broker is not None:
            self.broker.stop()
            self.broker = None
