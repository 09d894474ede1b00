"""The janitor ends what no handler will: rollouts past their deadline, and messages nobody serves."""

from __future__ import annotations

import asyncio

from broker import functions, inspect, topology
from runtime.engine.janitor import Janitor
from runtime.testing import Harness
from tests import fault_suite as fs


async def test_rollout_stuck_on_an_unserved_environment_times_out(harness: Harness) -> None:
    """The agent hands the rollout to `gym.tool.nowhere`, an environment whose workers are all away
    (registered once, served by none now): the reaper ends it."""
    await functions.write(harness.js, functions.Registration(role="env", name="nowhere"))
    await harness.simulate(fs.MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent", janitor=False)
    [start] = fs.starts("stuck", 1, env="nowhere", rollout_timeout_s=1.5)
    await harness.submit(start)
    janitor = Janitor(harness.js, harness.limits, scan_interval_s=0.3, grace_s=0.2, orphan_after_s=600)
    async with _running(janitor):
        [result] = await harness.results("stuck", 1, timeout=20)
    assert result.reward is None and result.failure_kind == "timeout"
    assert "rollout_timeout_s=1.5" in (result.failure_reason or "")
    assert "gym.tool.nowhere" in (result.failure_reason or "")
    assert janitor.stats["reaped"] == 1


async def test_start_for_an_unknown_agent_fails_naming_it(harness: Harness) -> None:
    """A Start on `gym.agent.nobody` (no such agent) fails as invalid_input and is dead-lettered."""
    [start] = fs.starts("unknown", 1, agent="nobody")
    await harness.submit(start)
    janitor = Janitor(harness.js, harness.limits, scan_interval_s=0.3, orphan_after_s=0.5)
    async with _running(janitor):
        [result] = await harness.results("unknown", 1, timeout=20)
    assert result.failure_kind == "invalid_input" and result.reward is None
    assert "unknown agent 'nobody'" in (result.failure_reason or "") and "`$.agent`" in (result.failure_reason or "")
    [letter] = await harness.read("gym.dead.nobody", stream=topology.DEAD_STREAM)
    assert letter.data and b"unknown agent" in letter.data
    assert await inspect.count(harness.js, topology.WORK_STREAM, "gym.agent.nobody") == 0


async def test_scans_run_in_one_janitor_at_a_time(harness: Harness) -> None:
    a = Janitor(harness.js, holder="a")
    b = Janitor(harness.js, holder="b")
    assert await a._lease() and not await b._lease()
    assert await a._lease(), "the holder renews its lease"


class _running:
    """Run a janitor for the duration of a block."""

    def __init__(self, janitor: Janitor) -> None:
        self.janitor, self.stop = janitor, asyncio.Event()

    async def __aenter__(self) -> None:
        self.task = asyncio.create_task(self.janitor.run(self.stop))

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await self.task
