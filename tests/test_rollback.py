"""What a power cut under a sync interval can do to one rollout, replayed exactly: its last step's
session write is lost while the message that step emitted survives (the two live in different
streams, fsynced on their own timers). The survivor must not be applied to the older state, and
nothing is left to run the step the session is at: the survivor, finding the session behind it on a
second look, starts the rollout over as a new attempt, which ends with its reward."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker import inspect, topology
from broker.publish import publish_raw
from broker.schemas import result_decoder
from runtime.engine.janitor import Janitor
from runtime.engine.registry import register
from runtime.engine.transitions import Runtime
from runtime.runs import rollouts
from runtime.runs.config import RunConfig
from runtime.runs.keys import Attempts, Grid, Live
from runtime.runs.submit import submit
from runtime.runs.tasks import TaskRow
from runtime.sdk import load
from runtime.testing import Harness
from tests import fault_suite as fs

KV = f"KV_{topology.SESSIONS}"


async def wait_for_step(h: Harness, sid: str, step: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while (s := await h.session(sid)) is None or s.step < step:
        assert time.monotonic() < deadline, f"{sid} never reached step {step}: {s}"
        await asyncio.sleep(0.05)


async def test_a_rolled_back_step_whose_message_survived_starts_the_rollout_over(harness: Harness) -> None:
    h = harness
    await h.simulate(fs.MATH_TASKS, accuracy=1.0)
    [start] = fs.starts("rollback", 1, rollout_timeout_s=600.0)
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
    assert await h.pending(topology.resume_subject("simple_agent")) == 1

    # the cut: step 2's session write is lost (the key reads as step 1 again), Resume(2) survived
    headers = {k: v for k, v in (step1.headers or {}).items() if not k.startswith("Nats-Expected")}
    await publish_raw(h.js, f"$KV.{topology.SESSIONS}.{sid}", step1.data or b"", headers)
    rolled_back = await h.session(sid)
    assert rolled_back is not None and (rolled_back.step, rolled_back.phase, rolled_back.attempt) == (1, "tools", 0)

    # no janitor: the workers alone find the rollback and start the rollout over, long before its deadline
    await h.worker("simple_agent", janitor=False)
    await h.worker("math", janitor=False)
    [result] = await h.results("rollback", 1, timeout=30)
    assert result.failure_kind is None and result.reward == 1.0, result
    assert result.attempt == 1, result  # attempt 0's survivor was never applied to the older state
    session = await h.session(sid)
    assert session is not None and session.attempt == 1 and session.phase == "done"
    assert await inspect.count(h.js, topology.RESULTS_STREAM, topology.result_subject("rollback")) == 1
    assert await h.pending(topology.agent_subject("simple_agent")) == 0
    assert await h.pending(topology.resume_subject("simple_agent")) == 0
    assert await h.pending(topology.tool_subject("math")) == 0


@pytest.mark.parametrize(
    ("survivor", "functions"),
    [("Tools", ["simple_agent"]), ("Resume", ["simple_agent", "math"])],
)
async def test_a_session_lost_whole_while_its_message_survived_starts_the_rollout_over(
    harness: Harness, survivor: str, functions: list[str]
) -> None:
    """Every write of the session is lost, its Start's ack is kept, and the message after its last
    write survived: the Tools after the agent's first step, or the agent's Resume after the tool
    step. Each carried the session (a Resume on the subject only workers publish to), so the
    rollout starts over from it rather than ending as `internal`."""
    h = harness
    await h.simulate(fs.MATH_TASKS, accuracy=1.0)
    run = f"lost{survivor.lower()}"
    [start] = fs.starts(run, 1, rollout_timeout_s=600.0)
    sid = f"{run}.0.0"
    kept = topology.tool_subject("math") if survivor == "Tools" else topology.resume_subject("simple_agent")
    await register(h.js, load("math"))
    await h.submit(start)
    for step, function in enumerate(functions, 1):  # one function at a time: each commits one step
        await h.worker(function, janitor=False)
        await wait_for_step(h, sid, step)
        await h.stop_workers()
    await h.js.purge_stream(KV, subject=f"$KV.{topology.SESSIONS}.{sid}")  # the cut: no write of it kept
    assert await h.session(sid) is None and await h.pending(kept) == 1

    await h.worker("simple_agent", janitor=False)
    await h.worker("math", janitor=False)
    [result] = await h.results(run, 1, timeout=30)
    assert result.failure_kind is None and result.reward == 1.0 and result.attempt == 1, result
    assert await inspect.count(h.js, topology.RESULTS_STREAM, topology.result_subject(run)) == 1
    assert await h.pending(kept) == 0


async def _stalled(h: Harness, run: str) -> RunConfig:
    """A one-rollout run left as a cut can leave it: the ack of its step-2 Resume kept (the work
    stream synced), the session write of that step lost (the bucket had not), the broker back up.
    No message is left to run the step the session is at. Returns the run's configuration."""
    await h.simulate(fs.MATH_TASKS, accuracy=1.0)
    cfg = RunConfig(input=str(fs.MATH_TASKS), agent="simple_agent", env="math", nats=h.broker.url, limit=1)
    sid = f"{run}.0.0"
    await register(h.js, load("math"))
    for role in ("tool", "verify"):  # as `gymbus init` does: math's work waits for its workers
        await topology.ensure_consumer(h.js, role, "math")
    await h.worker("simple_agent", janitor=False)
    assert (await submit(cfg, run)).submitted == 1
    await wait_for_step(h, sid, 1)
    await h.stop_workers()
    await h.worker("math", janitor=False)
    await wait_for_step(h, sid, 2)  # Resume(2) published
    await h.stop_workers()
    await h.js.purge_stream(topology.WORK_STREAM, subject=topology.resume_subject("simple_agent"))  # consumed
    assert await h.pending(topology.resume_subject("simple_agent")) == 0
    # the broker comes back from the cut: its duplicate window knows only the messages it kept
    await asyncio.to_thread(h.broker.restart)
    await wait_for_step(h, sid, 2)  # readable again (the client reconnects)
    return cfg


async def _ends_with_its_reward(h: Harness, run: str) -> None:
    [result] = await h.results(run, 1, timeout=30)
    assert result.failure_kind is None and result.reward == 1.0 and result.attempt == 0, result
    assert await inspect.count(h.js, topology.RESULTS_STREAM, topology.result_subject(run)) == 1


async def test_a_step_whose_message_was_consumed_but_whose_write_was_lost_is_redone_on_resume(
    harness: Harness,
) -> None:
    """The run's resume sends the stalled rollout's Start again under its attempt, a nudge, and the
    agent publishes again what the session calls for: the rollout ends with its reward instead of
    waiting for its deadline."""
    h = harness
    cfg = await _stalled(h, "nudge")
    await h.worker("simple_agent", janitor=False)
    await h.worker("math", janitor=False)
    again = await submit(cfg, "nudge")  # the resume: the rollout is in flight, so it is nudged, not re-run
    assert (again.finished, again.submitted) == (0, 0)
    await _ends_with_its_reward(h, "nudge")


async def test_a_stalled_session_is_nudged_by_the_janitor_when_nobody_resumes(harness: Harness) -> None:
    """Nobody resumes the run (a trainer waits on its Results): the janitor finds the session unwritten
    for ``stall_after_s``, within the work stream's duplicate window, and publishes again the message
    its state calls for, once per write; the rollout ends with its reward long before its deadline."""
    h = harness
    await _stalled(h, "stall")
    await h.worker("simple_agent", janitor=False)
    await h.worker("math", janitor=False)
    janitor = Janitor(h.js, h.limits, stall_after_s=0.5)
    rt = Runtime(h.js, h.store)
    await janitor.reap(rt)  # reads the bucket's live sessions and their last writes
    assert janitor.deadlines is not None
    written = janitor.deadlines.written["stall.0.0"]
    assert await janitor.nudge_stalled(rt, now=written + 0.1) == 0  # not unwritten long enough yet
    # past half the duplicate window a copy of a message still waiting might not be dropped: the reaper's
    assert await janitor.nudge_stalled(rt, now=written + h.limits.work_dedupe_s / 2) == 0
    assert await janitor.nudge_stalled(rt, now=written + 1) == 1
    assert await janitor.nudge_stalled(rt, now=written + 2) == 0  # once per write
    await _ends_with_its_reward(h, "stall")


async def test_a_nudge_never_fails_the_rollout_it_nudges(harness: Harness) -> None:
    """A row that cannot be a Start fails the rollouts submitted now, with the reason; a rollout in
    flight is only nudged, never given a failed Result beside the one it will end with."""
    h = harness
    attempts = Attempts(Grid([0, 1], 1))
    attempts.set((0, 0), 0)
    attempts.live[(0, 0)] = Live(2, {})  # in flight, at step 2
    attempts.set((1, 0), 0)  # submitted now
    rows = {i: TaskRow(i, None, error="line is not a JSON object") for i in (0, 1)}
    cfg = RunConfig(input=str(fs.MATH_TASKS), agent="simple_agent", env="math", nats=h.broker.url)
    assert await rollouts.publish_starts(h.js, cfg, "badrows", rows, attempts) == 1
    # publish_starts returns once every publish is acknowledged: what the stream holds now is all of it
    stored = [m async for m in inspect.messages(h.js, topology.RESULTS_STREAM, topology.result_subject("badrows"))]
    failed = [result_decoder.decode(m.data or b"") for m in stored]
    assert [(r.task_index, r.failure_kind) for r in failed] == [(1, "invalid_input")]
