"""The janitor ends what no handler will: rollouts past their deadline, and messages nobody serves."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from broker import functions, inspect, topology
from broker.sessions import Deadlines
from conftest import MATH_TASKS, ROOT
from runtime.engine.janitor import Janitor
from runtime.engine.records import new_session
from runtime.engine.transitions import Delivery
from runtime.testing import Harness, start_message, task_rows
from tests import fault_suite as fs

ROW = task_rows(MATH_TASKS)[0]


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


async def test_the_reaper_reads_only_what_was_written_since_its_last_look(harness: Harness) -> None:
    """The sessions bucket holds every rollout finished within done_ttl_s (over 100,000 in a large run);
    each look of the reaper reads the writes since its last, and still finds every live session past
    its deadline, and none that ended or expired."""
    deadlines = Deadlines(harness.js)
    stores = []
    for k, timeout in enumerate([0.01, 0.01, 3600.0, 0.01]):
        start = start_message(ROW, agent="a", env="e", run_id="dl", rollout_index=k, rollout_timeout_s=timeout)
        s = new_session(start, 0, Delivery(published_at=time.time()))
        stores.append((s, await harness.store.create(s)))
    done, rev = stores[3]
    done.phase = "done"
    await harness.store.update(done, last=rev, ttl_s=600)
    sids = [s.session_id for s, _ in stores]

    assert sorted(await deadlines.overdue(time.time() + 1)) == sids[:2]  # live and overdue; not 2 (later), not 3 (done)
    assert deadlines.reads == 4  # 4 keys, one value each (the bucket keeps no history)
    assert await deadlines.overdue(time.time() + 1) == sids[:2] and deadlines.reads == 4  # nothing written since
    s0, rev0 = stores[0]
    s0.phase = "done"
    await harness.store.update(s0, last=rev0, ttl_s=600)
    await harness.store.delete(sids[1])
    assert await deadlines.overdue(time.time() + 1) == [] and deadlines.reads == 6  # the two new writes only

    # another bucket under the same name (a broker started on a new store): read from its start
    await harness.js.delete_stream(f"KV_{topology.SESSIONS}")
    await topology.ensure(harness.js, harness.limits)
    s, _ = stores[0]
    s.phase = "model"
    await harness.store.create(s)
    assert await deadlines.overdue(time.time() + 1) == [s.session_id] and deadlines.reads == 7


class _running:
    """Run a janitor for the duration of a block."""

    def __init__(self, janitor: Janitor) -> None:
        self.janitor, self.stop = janitor, asyncio.Event()

    async def __aenter__(self) -> None:
        self.task = asyncio.create_task(self.janitor.run(self.stop))

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await self.task


@pytest.mark.parametrize(
    "variable,value,says",
    [
        ("GYMBUS_DONE_TTL_S", "0", "GYMBUS_DONE_TTL_S=0: a finished session must stay at least 1 s"),
        ("GYMBUS_DONE_TTL_S", "ten", "GYMBUS_DONE_TTL_S='ten' is not a valid done_ttl_s"),
        ("GYMBUS_ACK_WAIT_S", "30s", "GYMBUS_ACK_WAIT_S='30s' is not a valid ack_wait_s"),
    ],
)
def test_a_limit_mistyped_in_the_environment_is_named_in_one_line(variable: str, value: str, says: str) -> None:
    """Was a traceback-less "a gymbus bug?" line for a malformed value, and 0 went through to the broker."""
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", "worker", "math", "--nats", "nats://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, variable: value},
    )
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert says in line and "bug" not in line


@pytest.mark.parametrize("command", [["worker", "math"], ["janitor"]])
async def test_a_janitor_setting_mistyped_in_the_environment_is_named_in_one_line(
    harness: Harness, command: list[str]
) -> None:
    """Was "ValueError: could not convert string to float (a gymbus bug?)" from a worker, and the
    variables were ignored altogether by `gymbus janitor`."""
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "runtime", *command, "--nats", harness.broker.url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "GYMBUS_JANITOR_STALL_S": "20s"},
    )
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "GYMBUS_JANITOR_STALL_S='20s' is not a number of seconds" in line and "bug" not in line
