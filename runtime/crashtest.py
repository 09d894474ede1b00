"""Kill an agent's worker between two of a rollout's steps and check that the rollout resumes.

    clean, killed = await kill_between_steps(h, "refinement_agent", starts)   # env worker(s) already running
    assert_same_rewards(clean, killed)

The agent runs as a real worker process (``gymbus worker AGENT``), so a SIGKILL is a real crash. The
rollouts run twice on the same harness (its broker, simulated policy and environment workers): once
undisturbed (run ``clean``), then again (run ``killed``) with the agent's worker SIGKILLed as soon as
any rollout has committed ``after`` model turns, and a new worker started. Whatever the dead worker
held (an unacknowledged step, or nothing: the next message waiting at the environment) comes back
from the broker; each rollout must end with exactly one Result and the reward of its clean run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
from nats.js.errors import NotFoundError

from broker import topology
from broker.schemas import Result, Start, session_id
from runtime.testing import Harness, wait_until

ROOT = Path(__file__).resolve().parent.parent
ACK_WAIT_S = 2
"""The agent's ack wait in these runs: a step held by the dead worker comes back after it."""


def spawn_worker(function: str, nats_url: str, **env: str) -> subprocess.Popen[bytes]:
    """``gymbus worker FUNCTION`` as a child process (its output discarded)."""
    return subprocess.Popen(
        [sys.executable, "-m", "runtime", "worker", function, "--nats", nats_url],
        cwd=ROOT,
        env={**os.environ, "GYMBUS_ACK_WAIT_S": str(ACK_WAIT_S), "GYMBUS_MAX_DELIVER": "10", **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@dataclass
class Killed:
    """What the kill hit: the turns the first rollout had committed, and whether the dead worker held
    an unacknowledged step then (mid-step) or nothing (between steps)."""

    turns: int
    held: int


Until = Callable[[Harness, list[str]], Awaitable[int]]


async def turns_committed(h: Harness, sids: list[str]) -> int:
    """The most model turns any of the rollouts has committed."""
    sessions = [await h.session(sid) for sid in sids]
    return max((s.turns_taken for s in sessions if s is not None and s.result is None), default=0)


async def kill_between_steps(
    h: Harness,
    agent: str,
    starts: list[Start],
    *,
    after: int = 1,
    until: Until = turns_committed,
    timeout: float = 90.0,
) -> tuple[list[Result], list[Result], Killed]:
    """Run ``starts`` clean, then again killing the agent's worker once ``until`` reaches ``after``;
    returns both runs' Results (sorted by task and repeat, every duplicate included) and the kill."""
    worker = spawn_worker(agent, h.broker.url)
    try:
        clean = await _run(h, starts, "clean", timeout)
        killed_starts = [msgspec.structs.replace(s, run_id="killed") for s in starts]
        sids = [session_id("killed", s.task_index, s.rollout_index) for s in killed_starts]
        for s in killed_starts:
            await h.submit(s)
        turns = await wait_until(lambda: _reached(h, sids, until, after), f"a rollout with {after} turns", timeout)
        held = await _held(h, agent)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        worker = spawn_worker(agent, h.broker.url)
        await h.results("killed", len(starts), timeout=timeout)
        killed = await h.final_results("killed", timeout=timeout)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    return clean, _sorted(killed), Killed(turns, held)


async def _run(h: Harness, starts: list[Start], run_id: str, timeout: float) -> list[Result]:
    for s in starts:
        await h.submit(msgspec.structs.replace(s, run_id=run_id))
    await h.results(run_id, len(starts), timeout=timeout)
    return _sorted(await h.final_results(run_id, timeout=timeout))


async def _reached(h: Harness, sids: list[str], until: Until, after: int) -> int:
    n = await until(h, sids)
    return n if n >= after else 0


async def _held(h: Harness, agent: str) -> int:
    """Messages the agent's consumer has handed out and not seen acknowledged."""
    try:
        info = await h.js.consumer_info(topology.WORK_STREAM, topology.durable("agent", agent))
    except NotFoundError:
        return 0
    return info.num_ack_pending


def _sorted(results: list[Result]) -> list[Result]:
    return sorted(results, key=lambda r: (r.task_index, r.rollout_index, r.attempt))


def assert_same_rewards(clean: list[Result], killed: list[Result]) -> None:
    """One Result per rollout in each run, none failed, and each rollout's reward as in the clean run."""
    for run, results in (("clean", clean), ("killed", killed)):
        keys = [(r.task_index, r.rollout_index) for r in results]
        assert len(keys) == len(set(keys)), f"{run}: a rollout has more than one Result: {keys}"
        failed = [f"{r.session_id}: {r.failure_kind}: {r.failure_reason}" for r in results if r.failed]
        assert not failed, f"{run}: {failed}"
    assert [(r.task_index, r.rollout_index) for r in clean] == [(r.task_index, r.rollout_index) for r in killed]
    assert [r.reward for r in killed] == [r.reward for r in clean], "the killed run's rewards differ"
