"""Workers killed with SIGKILL mid-run and restarted lose no rollout and duplicate none."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

from nats.js.errors import NotFoundError

from broker import topology
from conftest import MATH_TASKS, ROOT
from runtime.testing import Harness


def spawn(function: str, url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GYMBUS_ACK_WAIT_S": "2", "GYMBUS_MAX_DELIVER": "20"}
    return subprocess.Popen(
        [sys.executable, "-m", "runtime", "worker", function, "--nats", url],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def test_sigkilled_workers_lose_no_rollout(harness: Harness, math_rows: list[dict]) -> None:
    await harness.simulate(MATH_TASKS, accuracy=1.0, latency_ms=400)
    from functions.math.env import ENVIRONMENT

    tools = ENVIRONMENT.tool_specs()
    n = 48
    workers = {f: spawn(f, harness.broker.url) for f in ("simple_agent", "math")}
    for i in range(n):
        row = math_rows[i % len(math_rows)]
        row = {**row, "responses_create_params": {**row["responses_create_params"], "tools": tools}}
        await harness.submit(harness.start(row, agent="simple_agent", env="math", run_id="crash", task_index=i))

    in_flight_at_kill = []
    for victim, role in (("simple_agent", "agent"), ("math", "tool"), ("simple_agent", "agent")):
        in_flight_at_kill.append(await until_in_flight(harness, role, victim))
        workers[victim].send_signal(signal.SIGKILL)
        workers[victim].wait()
        workers[victim] = spawn(victim, harness.broker.url)

    results = await harness.results("crash", n, timeout=90)
    await harness.settled(timeout=60)  # every redelivery handled: no Result can still come
    for proc in workers.values():
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)

    stored = await harness.read(topology.result_subject("crash"))
    assert len(stored) == n == len({r.session_id for r in stored}), "every rollout exactly once"
    assert all(r.reward == 1.0 for r in stored), [r.failure_reason for r in stored if r.reward != 1.0]
    assert in_flight_at_kill[0] > 0 and in_flight_at_kill[2] > 0, "the agent kills hit unacked work"
    assert len(results) == n


async def until_in_flight(harness: Harness, role: str, name: str, timeout: float = 10.0) -> int:
    """Wait until the consumer has unacked messages (work in a worker's hands); returns how many."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        try:
            info = await harness.js.consumer_info(topology.WORK_STREAM, topology.durable(role, name))  # type: ignore[arg-type]
        except NotFoundError:  # the worker has not created its consumer yet
            await asyncio.sleep(0.05)
            continue
        if info.num_ack_pending:
            return info.num_ack_pending
        await asyncio.sleep(0.01)
    return 0
