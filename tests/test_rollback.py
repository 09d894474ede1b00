"""What a power cut under a sync interval can do to one rollout, replayed exactly: its last step's
session write is lost while the message that step emitted survives (the two live in different
streams, fsynced on their own timers). The survivor must not be applied to the older state, and
the rollout must still end, as a typed failure, when its deadline passes (the janitor)."""

from __future__ import annotations

import asyncio
import time

from broker import inspect, topology
from broker.publish import publish_raw
from runtime.engine.janitor import Janitor
from runtime.engine.registry import register
from runtime.sdk import load
from runtime.testing import Harness
from tests import fault_suite as fs

KV = f"KV_{topology.SESSIONS}"


async def wait_for_step(h: Harness, sid: str, step: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while (s := await h.session(sid)) is None or s.step < step:
        assert time.monotonic() < deadline, f"{sid} never reached step {step}: {s}"
        await asyncio.sleep(0.05)


async def test_a_rolled_back_step_whose_message_survived_ends_as_a_timeout(harness: Harness) -> None:
    h = harness
    await h.simulate(fs.MATH_TASKS, accuracy=1.0)
    [start] = fs.starts("rollback", 1, rollout_timeout_s=4.0)
    sid = "rollback.0.0"
    await register(h.js, load("math"))  # math is known, but none of its workers runs yet
    await h.worker("simple_agent", janitor=False)
    await h.submit(start)
    await wait_for_step(h, sid, 1)  # the agent asked for a tool: step 1, phase tools
    await h.stop_workers()
    step1 = await h.js.get_msg(KV, subject=f"$KV.{topology.SESSIONS}.{sid}", direct=True)
    await h.worker("math", janitor=False)
    await wait_for_step(h, sid, 2)  # tool outputs committed (step 2), Resume(2) published for the agent
    await h.stop_workers()
    assert await h.pending(topology.agent_subject("simple_agent")) == 1

    # the cut: step 2's session write is lost (the key reads as step 1 again), Resume(2) survived
    headers = {k: v for k, v in (step1.headers or {}).items() if not k.startswith("Nats-Expected")}
    await publish_raw(h.js, f"$KV.{topology.SESSIONS}.{sid}", step1.data or b"", headers)
    rolled_back = await h.session(sid)
    assert rolled_back is not None and (rolled_back.step, rolled_back.phase) == (1, "tools")

    await h.worker("simple_agent", janitor=False)
    await h.worker("math", janitor=False)
    janitor = Janitor(h.js, h.limits, scan_interval_s=0.3, grace_s=0.2, orphan_after_s=600)
    stop = asyncio.Event()
    task = asyncio.create_task(janitor.run(stop))
    try:
        [result] = await h.results("rollback", 1, timeout=30)
    finally:
        stop.set()
        await task
    assert result.reward is None and result.failure_kind == "timeout", result
    assert "waiting on gym.tool.math (phase tools, step 1)" in (result.failure_reason or "")
    assert await inspect.count(h.js, topology.RESULTS_STREAM, topology.result_subject("rollback")) == 1
    assert await h.pending(topology.agent_subject("simple_agent")) == 0  # the survivor was dropped, not applied
