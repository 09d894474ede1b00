"""``env_lost``: a pinned environment's state is gone. Failed by default; a run that retries it starts
the rollout over as a new attempt (bounded by the delivery budget), and it still ends exactly once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from broker import topology
from runtime.engine.retry import DEFAULT_RETRY
from runtime.testing import Harness
from tests import fault_suite as fs

RETRY_LOST = [*sorted(DEFAULT_RETRY), "env_lost"]


async def _run(tmp_path: Path, faults: dict[int, str], **options: object) -> list:
    async with Harness(tmp_path / "broker", limits=topology.Limits(ack_wait_s=2.0, max_deliver=3)) as h:
        await h.simulate(fs.MATH_TASKS, accuracy=1.0)
        await h.worker("simple_agent")
        await h.worker(fs.FAULTS_ENV)
        for start in fs.starts("lost", 4, env="faults", faults=faults, **options):
            await h.submit(start)
        return await h.final_results("lost")


async def test_a_retried_env_lost_starts_the_rollout_over_and_it_ends_once(tmp_path: Path) -> None:
    results = await _run(tmp_path, {1: "lost_once", 2: "lost_once"}, retry=RETRY_LOST)
    assert sorted(Counter(r.session_id for r in results).values()) == [1, 1, 1, 1]  # no Result of a lost attempt
    assert {r.task_index: (r.attempt, r.reward) for r in results} == {
        0: (0, 1.0),
        1: (1, 1.0),
        2: (1, 1.0),
        3: (0, 1.0),
    }


async def test_env_lost_every_time_ends_as_env_lost_once_the_attempts_are_spent(tmp_path: Path) -> None:
    results = await _run(tmp_path, {0: "lost"}, retry=RETRY_LOST)
    [lost] = [r for r in results if r.task_index == 0]
    assert (lost.failure_kind, lost.reward, lost.attempt) == ("env_lost", None, 2)
    assert "gave up after 3 attempts" in (lost.failure_reason or "")
    assert len(results) == 4 and all(r.reward == 1.0 for r in results if r.task_index)
