"""The simulated policy follows the session's task, so an agent that adds user turns is still answered
(it used to look the task up by the last user message and answer "I do not know" after a new one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.sdk import Agent, AgentContext, Finish
from runtime.testing import Harness, task_rows

ROOT = Path(__file__).resolve().parent.parent


async def double_check(ctx: AgentContext) -> Finish:
    """Answer, then be asked to double-check, and answer again: the second answer is scored."""
    await ctx.respond(tools=[])
    ctx.items.append({"type": "message", "role": "user", "content": "Please double-check and answer again."})
    await ctx.respond(tools=[])
    return Finish()


AGENT = Agent(name="double_check", step=double_check)


@pytest.mark.parametrize("env", ["mcqa", "math"])  # a reference-playing environment, and the answer-key one
async def test_an_agent_that_adds_a_user_turn_is_still_answered(harness: Harness, env: str) -> None:
    tasks = ROOT / "functions" / env / "data" / "example.jsonl"
    await harness.simulate(tasks, env=env, accuracy=1.0)
    await harness.worker(AGENT)
    await harness.worker(env)
    rows = task_rows(tasks)[:4]
    for i, row in enumerate(rows):
        await harness.submit(harness.start(row, run_id="turns", task_index=i, agent="double_check", env=env))
    results = await harness.results("turns", len(rows), timeout=60)
    assert [r.reward for r in results] == [1.0] * len(rows), [r.verifier for r in results]
    assert all(r.timings.model_calls == 2 for r in results)
    assert harness.sim is not None and harness.sim.calls == 2 * len(rows)


def test_the_answer_book_keeps_the_references_of_recent_rollouts_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reference is kept per (task, rollout) while the rollout's turns ask for it; a run of a million
    rollouts kept a million of them in the simulated policy. An evicted one is made again, the same."""
    from functions.counter.env import ENVIRONMENT
    from runtime.model import policy

    monkeypatch.setattr(policy, "REFS_KEPT", 4)
    rows = ROOT / "functions/counter/data/example.jsonl"
    book = policy.AnswerBook.from_files([rows], env="counter", known=ENVIRONMENT)
    row = book.rows[0]
    first = book.reference(row, "run.0.0")
    for k in range(1, 10):
        assert book.reference(row, f"run.0.{k}") is not None
    assert len(book._refs) == 4 and (0, 0) not in book._refs
    again = book.reference(row, "run.0.0")
    assert again is not first and again == first
