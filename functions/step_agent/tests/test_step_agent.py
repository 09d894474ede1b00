"""step_agent through a real broker, the games and the simulated policy playing their references."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from runtime.checking import check
from runtime.crashtest import assert_same_rewards, kill_between_steps
from runtime.sdk import Context, Environment, Reference, Rollout, Task, call, tool
from runtime.testing import Harness, task_rows

WORDLE = Path(__file__).parents[2] / "wordle" / "data" / "example.jsonl"


async def test_the_games_check_both_ways_through_it() -> None:
    for game in ("wordle", "blackjack"):
        report = await check(game, agent="step_agent")
        assert report.ok, [t.problems for t in report.tasks]
        for t in report.tasks:
            for result in (report.right(t.index), report.wrong(t.index)):
                episode = result.agent_info["episode"]
                assert episode["terminated"] and not episode["truncated"]
                assert episode["step_rewards"] == result.verifier["step_rewards"]
                assert episode["return"] == sum(episode["step_rewards"])


class Meta(msgspec.Struct, frozen=True):
    goal: int = 3


async def reset(ctx: Context[Meta]) -> None:
    ctx.state["position"] = 0


@tool(context=True)
async def move(ctx: Context[Meta], steps: int) -> dict[str, Any]:
    """Walk forward."""
    ctx.state["position"] += steps
    done = ctx.state["position"] >= ctx.task.meta.goal
    ctx.step_reward(1.0 if done else 0.0, terminated=done)
    return {"position": ctx.state["position"], "done": done}


async def verify(task: Task[Meta], rollout: Rollout) -> bool:
    return bool(rollout.state["position"] >= task.meta.goal)


def reference(task: Task[Meta]) -> Reference:
    """A text turn (no action), then two calls at once (one is run), then the last move."""
    pair = [call("move", steps=2), call("move", steps=9)]
    return Reference(right=["Let me think.", pair, call("move", steps=2)], wrong="No.")


WALK = Environment(name="walk", meta=Meta, seed=reset, tools=[move], verify=verify, reference=reference, steps=True)


def walk_tasks(tmp_path: Path) -> Path:
    tasks = tmp_path / "walk.jsonl"
    tasks.write_text(json.dumps({"responses_create_params": {"input": "Walk to 3.", "tools": WALK.tool_specs()}}))
    return tasks


async def test_one_action_per_step_and_a_nudge_for_a_reply_without_one(harness: Harness, tmp_path: Path) -> None:
    tasks = walk_tasks(tmp_path)
    await harness.simulate(tasks, env=WALK, accuracy=1.0)
    await harness.worker("step_agent")
    await harness.worker(WALK)
    await harness.submit(harness.start(task_rows(tasks)[0], agent="step_agent", env="walk", seed=True))
    [r] = await harness.results("test", 1)
    assert r.reward == 1.0, r.failure_reason
    assert r.agent_info["episode"] == {
        "return": 1.0,
        "step_rewards": [0.0, 1.0],
        "steps": 2,
        "invalid_replies": 1,
        "terminated": True,
        "truncated": False,
    }
    outputs = [i["output"] for i in r.output if i["type"] == "function_call_output"]
    assert json.loads(outputs[0]) == {"position": 2, "done": False}  # the first call of the pair ran
    assert outputs[1] == "error: one action per step; this call was not run"  # the second did not
    assert r.timings.tool_calls == 2 and r.timings.model_calls == 3


async def test_a_model_that_never_acts_is_truncated(harness: Harness, tmp_path: Path) -> None:
    tasks = walk_tasks(tmp_path)
    await harness.simulate(tasks, env=WALK, accuracy=0.0)
    await harness.worker("step_agent")
    await harness.worker(WALK)
    options = {"agent_options": {"max_invalid": 2}}
    await harness.submit(harness.start(task_rows(tasks)[0], agent="step_agent", env="walk", seed=True, **options))
    [r] = await harness.results("test", 1)
    assert r.reward == 0.0
    episode = r.agent_info["episode"]
    assert episode["truncated"] and not episode["terminated"] and episode["invalid_replies"] == 3


async def test_killed_between_steps_it_resumes_with_the_same_reward(harness: Harness) -> None:
    await harness.simulate(WORDLE, env="wordle", accuracy=0.5, latency_ms=250)
    await harness.worker("wordle")
    starts = [
        harness.start(row, agent="step_agent", env="wordle", task_index=i, seed=True, max_steps=12)
        for i, row in enumerate(task_rows(WORDLE)[:4])
    ]
    clean, killed, kill = await kill_between_steps(harness, "step_agent", starts)
    assert_same_rewards(clean, killed)
    assert {r.reward for r in clean} == {0.0, 1.0}
    assert [r.agent_info["episode"] for r in killed] == [r.agent_info["episode"] for r in clean]
    assert kill.turns >= 1
