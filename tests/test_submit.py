"""`gymbus submit` and `gymbus init`: publishing to a running broker, provisioning it ahead of workers."""

from __future__ import annotations

import asyncio
import time

import pytest
from typer.testing import CliRunner

from broker import inspect, topology
from broker.schemas import Session, result_decoder
from conftest import MATH_TASKS
from runtime.cli import app
from runtime.engine.transitions import Runtime
from runtime.errors import InputError
from runtime.runs import rollouts
from runtime.runs.config import RunConfig
from runtime.runs.feed import stored_results
from runtime.runs.keys import Grid, Key
from runtime.runs.submit import submit
from runtime.testing import Harness


def config(nats: str, limit: int = 4) -> RunConfig:
    return RunConfig(input=str(MATH_TASKS), agent="simple_agent", env="math", nats=nats, limit=limit, repeats=2)


async def test_submit_publishes_once_and_workers_finish_the_run(harness: Harness) -> None:
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent")
    await harness.worker("math")
    cfg = config(harness.broker.url)

    first = await submit(cfg, "sub1")
    assert (first.expected, first.finished, first.submitted) == (8, 0, 8)
    results = await harness.results("sub1", 8)
    assert sorted((r.task_index, r.rollout_index) for r in results) == [(t, k) for t in range(4) for k in range(2)]
    assert all(r.reward == 1.0 and r.verifier.get("extracted_answer") for r in results)
    assert all(r.output[0]["type"] == "function_call" for r in results)  # the env's tools were offered

    again = await submit(cfg, "sub1")  # finished rollouts are not published again
    assert (again.finished, again.submitted) == (8, 0)
    with pytest.raises(InputError, match=r"limit 4 now 5.*--extend"):  # a run id is bound to what it ran
        await submit(config(harness.broker.url, limit=5), "sub1")
    bigger = await submit(config(harness.broker.url, limit=5), "sub1", extend=True)  # only the new task's rollouts
    assert (bigger.finished, bigger.submitted) == (8, 2)
    assert len(await harness.results("sub1", 10)) == 10


async def test_a_rollout_finishing_while_a_resume_reads_its_session_is_not_run_again(harness: Harness) -> None:
    """A resume reads the run's Results, then the sessions of the rollouts without one: a rollout that
    finishes in between shows a finished session and no Result. A second look at the Results finds it,
    so it is not run again as a new attempt (which took 5 to 13 of 768 rollouts of a resume right
    after a crash); a rollout whose Result is really gone (deleted) still is."""
    h = harness
    await h.simulate(MATH_TASKS, accuracy=1.0)
    await h.worker("simple_agent")
    await h.worker("math")
    cfg = config(h.broker.url, limit=1)
    assert (await submit(cfg, "look")).submitted == 2
    results = await h.results("look", 2)
    grid, keys = Grid([0], 2), [(0, 0), (0, 1)]

    async def finished(asked: list[Key]) -> set[Key]:  # what submit's second look reads: the stream
        stored = {(r.task_index, r.rollout_index) for r in await stored_results(h.js, "look")}
        return {k for k in asked if k in stored}

    # both sessions are finished and were "missing" from a first read taken before their Results
    attempts = await rollouts.plan(h.js, grid, iter(keys), "look", False, time.time(), finished)
    assert len(attempts) == 0, "a rollout with a Result was run again"

    [deleted] = [m async for m in inspect.messages(h.js, topology.RESULTS_STREAM, topology.result_subject("look"))][:1]
    await h.js.delete_msg(topology.RESULTS_STREAM, deleted.seq)
    gone = result_decoder.decode(deleted.data or b"")
    attempts = await rollouts.plan(h.js, grid, iter(keys), "look", False, time.time(), finished)
    assert list(attempts.items()) == [((gone.task_index, gone.rollout_index), 1)], "a deleted Result is run again"
    assert {r.attempt for r in results} == {0}


async def test_a_resume_restores_a_result_its_worker_never_published(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker finishing a rollout writes its session, then dies before publishing the Result (here
    the publish is skipped). With no Result ever removed from the stream, the resume does not run the
    rollout again: it nudges it, and the agent publishes the Result from the finished session, the
    same attempt and reward, once."""
    h = harness
    lost: list[str] = []
    emit = Runtime.emit

    async def dies_before_the_result(self: Runtime, s: Session, carry: tuple[bytes, int] | None = None) -> None:
        if s.phase == "done" and not lost:
            lost.append(s.session_id)
            return
        await emit(self, s, carry)

    monkeypatch.setattr(Runtime, "emit", dies_before_the_result)
    await h.simulate(MATH_TASKS, accuracy=1.0)
    await h.worker("simple_agent")
    await h.worker("math")
    cfg = config(h.broker.url, limit=1)
    assert (await submit(cfg, "unpublished")).submitted == 2
    [first] = await h.results("unpublished", 1)
    assert lost and lost[0] != first.session_id
    stored = await stored_results(h.js, "unpublished")
    assert len(stored) == 1, "the lost Result was published after all"

    again = await submit(cfg, "unpublished")
    assert (again.finished, again.submitted) == (1, 0)  # a nudge, not counted as submitted
    results = await h.results("unpublished", 2)
    restored = next(r for r in results if r.session_id == lost[0])
    assert restored.attempt == 0 and restored.reward == 1.0 and restored.failure_kind is None
    assert await inspect.count(h.js, topology.RESULTS_STREAM, topology.result_subject("unpublished")) == 2


async def test_submit_refuses_functions_nobody_serves(harness: Harness) -> None:
    with pytest.raises(InputError, match=r"no worker serves gym\.agent\.simple_agent"):
        await submit(config(harness.broker.url), "sub2")
    assert await harness.pending("gym.agent.simple_agent") == 0


def test_submit_without_broker_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GYMBUS_NATS_URL", raising=False)
    result = CliRunner().invoke(app, ["submit", "configs/quickstart.yaml"])
    assert result.exit_code == 2 and "no broker" in result.output


async def test_init_provisions_consumers_before_any_worker(harness: Harness) -> None:
    args = ["init", "--nats", harness.broker.url, "--agent", "simple_agent", "--env", "math"]
    result = await asyncio.to_thread(CliRunner().invoke, app, args)
    assert result.exit_code == 0, result.output
    assert "agent-simple_agent, tool-math, verify-math" in " ".join(result.output.split())
    for role, name in [("agent", "simple_agent"), ("tool", "math"), ("verify", "math")]:
        assert await topology.has_consumer(harness.js, role, name)  # type: ignore[arg-type]
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    assert (await submit(config(harness.broker.url), "sub3")).submitted == 8  # accepted before any worker runs
    assert await harness.pending("gym.agent.simple_agent") == 8


async def test_init_rejects_a_bad_function_name(harness: Harness) -> None:
    args = ["init", "--nats", harness.broker.url, "--agent", "my agent"]
    result = await asyncio.to_thread(CliRunner().invoke, app, args)
    assert result.exit_code == 2 and "'my agent' is not a valid name: use 1-64 ASCII letters" in result.output
