"""user_sim_agent through a real broker, mcqa and the simulated policy, which also plays the user."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from broker.schemas import Result
from runtime.crashtest import assert_same_rewards, kill_between_steps
from runtime.model.client import register
from runtime.model.policy import SIMULATED_USER, USER_STOP
from runtime.testing import Harness, task_rows

MCQA = Path(__file__).parents[2] / "mcqa" / "data" / "example.jsonl"
PLAYS = {"user_sim": "user_simulator"}


async def serve(h: Harness, accuracy: float = 1.0, **sim: Any) -> None:
    await h.simulate(MCQA, env="mcqa", accuracy=accuracy, plays=PLAYS, **sim)
    await h.worker("mcqa")


async def run(h: Harness, n: int, **fields: Any) -> list[Result]:
    for i, row in enumerate(task_rows(MCQA)[:n]):
        await h.submit(h.start({**row, **fields.pop("row", {})}, agent="user_sim_agent", task_index=i, **fields))
    return sorted(await h.results("test", n), key=lambda r: r.task_index)


async def test_the_user_speaks_until_its_stop_signal(harness: Harness) -> None:
    await serve(harness)
    await harness.worker("user_sim_agent")
    for r in await run(harness, 3):
        assert r.reward == 1.0, r.failure_reason
        said = [i for i in r.output if i.get("role") == "user"]
        assert [i["content"] for i in said] == [SIMULATED_USER[0], SIMULATED_USER[1].replace(USER_STOP, "").strip()]
        assert all(i["gymbus"] == {"source": "user_sim", "role": "user_simulator"} for i in said)
        assert r.agent_info["user_turns"] == 2 and r.agent_info["ended_by"] == "user"
        assert r.agent_info["models"]["user_sim"]["calls"] == 2
        assert r.timings.model_calls == 2  # the policy's calls; the user's are counted apart


async def test_a_turn_budget_ends_the_conversation(harness: Harness) -> None:
    await serve(harness)
    await harness.worker("user_sim_agent")
    [r] = await run(harness, 1, agent_options={"max_user_turns": 1})
    assert r.reward == 1.0 and r.agent_info["user_turns"] == 1 and r.agent_info["ended_by"] == "turn budget"


async def test_the_user_simulator_sees_the_dialogue_from_its_side(harness: Harness) -> None:
    await serve(harness)
    assert harness.sim is not None
    harness.sim.record = True
    await harness.worker("user_sim_agent")
    persona = {"persona": "A botanist.", "goal": "Check the gas."}
    [r] = await run(harness, 1, row={"user": persona}, agent_options={"max_user_turns": 1})
    assert r.reward == 1.0
    asked = [json.loads(b) for b in harness.sim.received if json.loads(b).get("model") == "user_sim"]
    [request] = asked
    roles = [m.get("role") for m in request["input"]]
    assert roles == ["system", "assistant", "user"]  # its own opening is the assistant's, the policy's reply the user's
    assert "A botanist." in request["input"][0]["content"] and USER_STOP in request["input"][0]["content"]


async def test_a_bad_user_field_fails_the_rollout_naming_it(harness: Harness) -> None:
    await serve(harness)
    await harness.worker("user_sim_agent")
    [r] = await run(harness, 1, row={"user": {"persona": 7}})
    assert r.failure_kind == "invalid_input" and "$.user.persona" in (r.failure_reason or "")


async def test_a_dead_user_simulator_fails_as_user_sim_error(harness: Harness) -> None:
    await serve(harness)
    await register(harness.js, "user_sim", ["http://127.0.0.1:1/v1"], attempts=1)
    await harness.worker("user_sim_agent")
    [r] = await run(harness, 1)
    assert r.failure_kind == "user_sim_error" and r.reward is None
    assert (r.failure_reason or "").startswith("user simulator model 'user_sim' failed: ")


async def test_killed_between_steps_it_resumes_with_the_same_reward(harness: Harness) -> None:
    await serve(harness, accuracy=0.5, latency_ms=250)
    starts = [harness.start(row, agent="user_sim_agent", task_index=i) for i, row in enumerate(task_rows(MCQA)[:4])]
    clean, killed, kill = await kill_between_steps(harness, "user_sim_agent", starts)
    assert_same_rewards(clean, killed)
    assert {r.reward for r in clean} == {0.0, 1.0}
    assert [r.agent_info["user_turns"] for r in killed] == [2] * 4 and kill.turns >= 1
