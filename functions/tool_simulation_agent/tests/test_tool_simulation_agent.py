"""tool_simulation_agent through a real broker, the math environment and the simulated policy (which
also plays the tool simulator): calls answered by the simulator or the row's recordings, never run."""

from __future__ import annotations

from typing import Any

from broker.schemas import Start
from conftest import MATH_TASKS
from functions.math.env import ENVIRONMENT as MATH
from runtime.crashtest import assert_same_rewards, kill_between_steps
from runtime.model.client import register
from runtime.model.policy import SIMULATED_TOOL_OUTPUT
from runtime.testing import Harness, task_rows

PLAYS = {"tool_sim": "tool_simulator"}


def rows(n: int, **fields: Any) -> list[dict[str, Any]]:
    out = []
    for row in task_rows(MATH_TASKS)[:n]:
        params = {**row["responses_create_params"], "tools": MATH.tool_specs()}
        out.append({**row, "responses_create_params": params, **fields})
    return out


async def serve(h: Harness, accuracy: float = 1.0, **sim: Any) -> None:
    await h.simulate(MATH_TASKS, accuracy=accuracy, plays=PLAYS, **sim)
    await h.worker("math")


def starts(h: Harness, n: int, run_id: str = "t", **options: Any) -> list[Start]:
    return [
        h.start(row, agent="tool_simulation_agent", env="math", run_id=run_id, task_index=i, **options)
        for i, row in enumerate(rows(n))
    ]


async def test_calls_are_answered_by_the_tool_simulator_and_never_run(harness: Harness) -> None:
    await serve(harness)
    await harness.worker("tool_simulation_agent")
    for s in starts(harness, 3):
        await harness.submit(s)
    results = await harness.results("t", 3)
    for r in results:
        assert r.reward == 1.0, r.failure_reason
        outputs = [i for i in r.output if i["type"] == "function_call_output"]
        assert [o["output"] for o in outputs] == [SIMULATED_TOOL_OUTPUT]
        assert outputs[0]["gymbus"] == {"source": "tool_sim", "simulated": True}
        assert r.timings.tool_calls == 0  # the environment's calculator never ran
        assert r.agent_info["simulated_calls"] == 1
        assert r.agent_info["models"]["tool_sim"]["calls"] == 1
        assert r.usage.input_tokens > 0 and r.timings.model_calls == 2  # the policy's own usage, apart


async def test_recorded_outputs_answer_in_order(harness: Harness) -> None:
    await serve(harness)
    await harness.worker("tool_simulation_agent")
    [row] = rows(1, tool_outputs={"calculator": ["138"]})
    opts = {"agent_options": {"source": "recorded"}}
    await harness.submit(harness.start(row, agent="tool_simulation_agent", env="math", **opts))
    [r] = await harness.results("test", 1)
    [out] = [i for i in r.output if i["type"] == "function_call_output"]
    assert out["output"] == "138" and out["gymbus"] == {"source": "recorded", "simulated": True}
    assert r.reward == 1.0 and "models" not in r.agent_info


async def test_a_call_with_no_recording_fails_as_tool_sim_error(harness: Harness) -> None:
    await serve(harness)
    await harness.worker("tool_simulation_agent")
    [row] = rows(1, tool_outputs={"search": "x"})
    await harness.submit(
        harness.start(row, agent="tool_simulation_agent", env="math", agent_options={"source": "recorded"})
    )
    [r] = await harness.results("test", 1)
    assert r.failure_kind == "tool_sim_error" and r.reward is None
    assert "calculator" in (r.failure_reason or "") and "`tool_outputs` has: ['search']" in (r.failure_reason or "")


async def test_a_dead_tool_simulator_fails_the_rollout_naming_it(harness: Harness) -> None:
    await serve(harness)
    await register(harness.js, "tool_sim", ["http://127.0.0.1:1/v1"], attempts=1)  # nothing listens there
    await harness.worker("tool_simulation_agent")
    await harness.submit(starts(harness, 1, run_id="test")[0])
    [r] = await harness.results("test", 1)
    assert r.failure_kind == "tool_sim_error" and r.reward is None
    assert (r.failure_reason or "").startswith("tool simulator model 'tool_sim' failed: ")


async def test_killed_between_steps_it_resumes_with_the_same_reward(harness: Harness) -> None:
    await serve(harness, accuracy=0.5, latency_ms=300)  # rewards of both kinds
    clean, killed, kill = await kill_between_steps(harness, "tool_simulation_agent", starts(harness, 4))
    assert_same_rewards(clean, killed)
    assert {r.reward for r in clean} == {0.0, 1.0}
    assert kill.turns >= 1 and all(r.agent_info["simulated_calls"] == 1 for r in killed)
