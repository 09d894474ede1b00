"""An environment whose verifier is pure and quick (``verify_inline``) is scored in the agent's last turn
when the agent worker imports the same code: one hop fewer. Another version of the code, or a verifier
raising there, leaves the rollout to the environment's verify worker, as before."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest
from nats.js import JetStreamContext

from broker import functions, topology
from conftest import MATH_TASKS
from runtime.sdk import Environment, Rollout, Task
from runtime.testing import Harness, task_rows

ROW = {
    **task_rows(MATH_TASKS)[0],
    "responses_create_params": {**task_rows(MATH_TASKS)[0]["responses_create_params"], "tools": []},
}


async def verifications_by_hop(js: JetStreamContext, env: str) -> int:
    info = await js.consumer_info(topology.WORK_STREAM, topology.durable("verify", env))
    return info.delivered.consumer_seq


async def test_math_is_verified_in_the_agents_last_turn(harness: Harness) -> None:
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent")
    await harness.worker("math")
    reg = await functions.read(harness.js, "env", "math")
    assert reg is not None and reg.verify_ref == "functions.math.env:ENVIRONMENT" and len(reg.verify_digest) == 64
    await harness.submit(harness.start(ROW, run_id="inline"))
    [result] = await harness.results("inline", 1)
    assert result.reward == 1.0 and result.timings.hops == 1  # Start -> done, in one transition
    assert result.timings.verify_s > 0 and result.verifier["extracted_answer"] == ROW["expected_answer"]
    assert await verifications_by_hop(harness.js, "math") == 0


async def test_another_version_of_the_environment_is_verified_by_hop(harness: Harness) -> None:
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("math")
    reg = await functions.read(harness.js, "env", "math")
    assert reg is not None
    await functions.write(harness.js, msgspec.structs.replace(reg, verify_digest="0" * 64))  # other code
    await harness.worker("simple_agent")
    await harness.submit(harness.start(ROW, run_id="other"))
    [result] = await harness.results("other", 1)
    assert result.reward == 1.0 and result.timings.hops == 2
    assert await verifications_by_hop(harness.js, "math") == 1


class Raises:
    """Its first call raises (as in an agent worker missing something the verifier needs)."""

    calls = 0


async def _verify_once_failing(task: Task, rollout: Rollout) -> float:  # type: ignore[type-arg]
    Raises.calls += 1
    if Raises.calls == 1:
        raise RuntimeError("not here")
    return 1.0


FLAKY = Environment(name="flaky", verify=_verify_once_failing, verify_inline=True)


async def test_a_verifier_raising_in_the_agents_turn_is_verified_by_its_environment(harness: Harness) -> None:
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker(FLAKY)
    reg = await functions.read(harness.js, "env", "flaky")
    assert reg is not None and reg.verify_ref.endswith(":FLAKY")
    await harness.worker("simple_agent")
    await harness.submit(harness.start(ROW, run_id="flaky", env="flaky"))
    [result] = await harness.results("flaky", 1)
    assert (result.reward, result.failure_kind, result.timings.hops, Raises.calls) == (1.0, None, 2, 2)
    assert await verifications_by_hop(harness.js, "flaky") == 1


def test_a_mistyped_switch_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMBUS_VERIFY_INLINE", "false")
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", "worker", "simple_agent", "--nats", "nats://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "GYMBUS_VERIFY_INLINE='false'" in line and "set it to 1" in line and "or 0" in line
