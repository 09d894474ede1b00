"""`gymbus worker --http-port`: /healthz says when the worker can work, /metrics what it did."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from broker.server import EmbeddedServer
from conftest import MATH_TASKS, ROOT
from runtime.testing import Harness


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
        return resp.status, await resp.text()


async def until_status(url: str, status: int, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got, body = await get(url)
            if got == status:
                return body
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"{url} never answered {status}")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_healthz_and_metrics_during_a_run(tmp_path: Path, math_rows: list[dict]) -> None:
    nats_port, http_port = free_port(), free_port()
    env = {**os.environ, "GYMBUS_HTTP_PORT": str(http_port)}
    cmd = [sys.executable, "-m", "runtime", "worker", "math", "--nats", f"nats://127.0.0.1:{nats_port}"]
    worker = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{http_port}"
    try:
        body = await until_status(f"{base}/healthz", 503)  # no broker yet: serving, but not ready
        assert '"starting"' in body
        h = Harness(tmp_path / "broker")
        h.broker = EmbeddedServer(tmp_path / "broker", port=nats_port)  # the port the worker was given
        async with h:
            assert '"ok"' in await until_status(f"{base}/healthz", 200)
            await h.simulate(MATH_TASKS, accuracy=1.0)
            await h.worker("simple_agent", verify_inline=False)  # so the math process verifies too
            from functions.math.env import ENVIRONMENT

            tools = ENVIRONMENT.tool_specs()
            for i in range(3):
                row = math_rows[i]
                row = {**row, "responses_create_params": {**row["responses_create_params"], "tools": tools}}
                await h.submit(h.start(row, env="math", run_id="m1", task_index=i))  # math: a process
            results = await h.results("m1", 3)
            assert all(r.reward == 1.0 for r in results)
            await h.submit(b"not a message", subject="gym.tool.math")  # rejected: a failure of kind invalid_input
            rejected = ("gymbus_failures_total", (("function", "math"), ("kind", "invalid_input")))
            for _ in range(100):
                status, text = await get(f"{base}/metrics")
                got = samples(text)
                if rejected in got and got[("gymbus_in_flight", (("function", "math"),))] == 0:
                    break
                await asyncio.sleep(0.1)
            assert status == 200 and got[rejected] == 1
            assert got[("gymbus_messages_processed_total", (("function", "math"),))] == 6  # 3 tool + 3 verify
            assert got[("gymbus_handler_duration_seconds_count", (("function", "math"), ("role", "tool")))] == 4
            assert got[("gymbus_handler_duration_seconds_count", (("function", "math"), ("role", "verify")))] == 3
            assert got[("gymbus_queue_wait_seconds_count", (("function", "math"), ("role", "verify")))] == 3
            assert got[("gymbus_in_flight", (("function", "math"),))] == 0
            assert got[("gymbus_ready", (("function", "math"),))] == 1
            assert ("gymbus_messages_retried_total", (("function", "math"),)) in got

            worker.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(worker.wait, 30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
