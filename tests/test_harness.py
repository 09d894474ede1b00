"""The test harness never lets a test pass on what did not happen: every wait fails loudly on its
deadline, and a Start goes to the functions under test, never to a default one."""

from __future__ import annotations

import pytest

from runtime.errors import UsageError
from runtime.testing import Harness, start_message


async def test_results_that_do_not_arrive_fail_the_test(harness: Harness, math_rows: list[dict]) -> None:
    """Nobody serves the agent: the wait fails saying how many arrived, on which subject, and what waits."""
    await harness.submit(start_message(math_rows[0], agent="nobody", env="math", run_id="none"))
    with pytest.raises(TimeoutError) as raised:
        await harness.results("none", 1, timeout=0.3)
    assert "0 of 1 results arrived on gym.result.none within 0.3 s" in str(raised.value)
    assert "gym.agent.nobody: 1" in str(raised.value)


async def test_work_that_never_settles_fails_the_test(harness: Harness, math_rows: list[dict]) -> None:
    await harness.submit(start_message(math_rows[0], agent="nobody", env="math", run_id="stuck"))
    with pytest.raises(TimeoutError, match=r"waiting for the work to settle.*gym\.agent\.nobody: 1"):
        await harness.settled(timeout=0.3)


async def test_start_goes_to_the_functions_the_harness_serves(harness: Harness, math_rows: list[dict]) -> None:
    with pytest.raises(UsageError, match=r"agent= not given, and the harness runs workers for none"):
        harness.start(math_rows[0])
    await harness.worker("simple_agent")
    with pytest.raises(UsageError, match=r"pass env='NAME'"):
        harness.start(math_rows[0])
    await harness.worker("math")
    start = harness.start(math_rows[0], run_id="r", task_index=2)
    assert (start.agent, start.env, start.run_id, start.task_index) == ("simple_agent", "math", "r", 2)
    assert harness.start(math_rows[0], env="countdown").env == "countdown"  # named: taken as given
    await harness.worker("tests.fault_env:ENVIRONMENT")
    with pytest.raises(UsageError, match=r"runs workers for 2 \(faults, math\)"):
        harness.start(math_rows[0])


async def test_settled_returns_only_once_the_work_is_done(harness: Harness, math_rows: list[dict]) -> None:
    """Settled straight after submitting: by then the rollout has run through every hop and its Result
    is stored, so a count taken after it is final."""
    from conftest import MATH_TASKS
    from functions.math.env import ENVIRONMENT

    await harness.simulate(MATH_TASKS, accuracy=1.0, latency_ms=200)
    await harness.worker("simple_agent")
    await harness.worker("math")
    row = {**math_rows[0], "responses_create_params": {**math_rows[0]["responses_create_params"]}}
    row["responses_create_params"]["tools"] = ENVIRONMENT.tool_specs()
    await harness.submit(harness.start(row, run_id="once"))
    [result] = await harness.final_results("once")
    assert result.reward == 1.0 and result.timings.hops == 3  # agent, tool, agent (math verified in its turn)
