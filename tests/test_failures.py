"""Every failure kind, driven through its real path, ends as one failed Result with no reward.

No code path may turn an exception into a reward of 0 (a crashed verifier, a dead model or a lost
worker is not a wrong answer). The test enumerates `FailureKind`, so a new kind without a case fails.
"""

from __future__ import annotations

import asyncio
import typing
from collections.abc import Awaitable, Callable

import msgspec
import pytest

from broker import topology
from broker.schemas import FailureKind, Result
from runtime.engine.janitor import Janitor
from runtime.model.client import register
from runtime.sdk import Agent, AgentContext, CallTools, Finish, function_calls
from runtime.testing import Harness
from tests import fault_suite as fs
from tests.faulty_policy import FaultyPolicy

Case = Callable[[Harness], Awaitable[None]]


async def _workers(h: Harness, accuracy: float = 1.0) -> None:
    await h.simulate(fs.MATH_TASKS, accuracy=accuracy)
    await h.worker("simple_agent")
    await h.worker(fs.FAULTS_ENV)


async def _fault(h: Harness, fault: str) -> None:
    await _workers(h)
    [start] = fs.starts("kind", 1, env="faults", faults={0: fault})
    await h.submit(start)


async def invalid_input(h: Harness) -> None:
    await _workers(h)
    [start] = fs.starts("kind", 1, env="faults")
    await h.submit(msgspec.structs.replace(start, responses_create_params={"input": 5}))


async def _policy(h: Harness, **faults: typing.Any) -> None:
    upstream = await h.simulate(fs.MATH_TASKS, accuracy=1.0)
    proxy = FaultyPolicy(upstream, **faults)
    await register(h.js, "policy", [await proxy.start()])
    h.cleanups.append(proxy.stop)
    await h.worker("simple_agent")
    await h.worker(fs.FAULTS_ENV)
    [start] = fs.starts("kind", 1, env="faults", step_timeout_s=1.0)
    await h.submit(start)


async def judge_error(h: Harness) -> None:
    """llm_judge with a judge that answers without a verdict."""
    from runtime.model.serving import InThread
    from runtime.model.simulator import SimConfig, Simulator
    from runtime.testing import task_rows

    examples = fs.ROOT / "functions" / "llm_judge" / "data" / "example.jsonl"
    await h.simulate(examples, env="llm_judge", accuracy=1.0)
    mute = InThread(Simulator({}, SimConfig(model="policy")).app()).__enter__()
    h.cleanups.append(lambda: asyncio.to_thread(mute.__exit__))  # type: ignore[attr-defined]
    await register(h.js, "judge", [f"{mute.url}/v1"])
    await h.worker("simple_agent")
    await h.worker("llm_judge")
    await h.submit(h.start(task_rows(examples)[0], run_id="kind", env="llm_judge"))


async def worker_lost(h: Harness) -> None:
    """Two deliveries taken by 'workers' that die before answering; then the broker gives up."""
    await topology.ensure_consumer(h.js, "agent", "ghost", h.limits)
    [start] = fs.starts("kind", 1, agent="ghost")
    await h.submit(start, subject=topology.agent_subject("ghost"))
    psub = await h.js.pull_subscribe_bind(consumer="agent-ghost", stream=topology.WORK_STREAM)
    stop = asyncio.Event()
    janitor = asyncio.create_task(Janitor(h.js, h.limits, holder="test").run(stop))
    h.cleanups.append(lambda: _stop(stop, janitor))
    for _ in range(h.limits.max_deliver + 1):  # the last pull is refused: the advisory goes out
        try:
            await psub.fetch(1, timeout=h.limits.ack_wait_s + 0.5)
        except TimeoutError:
            pass


async def _compacting(ctx: AgentContext) -> CallTools | Finish:
    """An agent that compacts its history (drops the first item) before its second turn."""
    if ctx.turns_taken:
        del ctx.items[0]
    calls = function_calls(await ctx.respond())
    return CallTools(calls) if calls else Finish()


async def history_changed(h: Harness) -> None:
    """token_exact with an agent that changes the history the last model turn covered."""
    await h.simulate(fs.MATH_TASKS, accuracy=1.0)
    await h.worker(Agent(name="compacting", step=_compacting))
    await h.worker(fs.FAULTS_ENV)
    [start] = fs.starts("kind", 1, env="faults", token_exact=True)
    await h.submit(msgspec.structs.replace(start, agent="compacting"))


async def _stop(stop: asyncio.Event, task: asyncio.Task[None]) -> None:
    stop.set()
    await task


async def _second_model(h: Harness, agent: str, model: str, role: str) -> None:
    """An agent whose second model (a user or tool simulator) nothing serves: it fails past its retry."""
    from functions.math.env import ENVIRONMENT as MATH
    from runtime.testing import task_rows

    await h.simulate(fs.MATH_TASKS, accuracy=1.0, plays={model: role})
    await register(h.js, model, ["http://127.0.0.1:1/v1"], attempts=1)  # nothing listens there
    await h.worker(agent)
    await h.worker("math")
    row = task_rows(fs.MATH_TASKS)[0]
    row["responses_create_params"]["tools"] = MATH.tool_specs()
    await h.submit(h.start(row, agent=agent, env="math", run_id="kind"))


async def harness_error(h: Harness) -> None:
    """harness_agent whose harness exits with an error."""
    import sys

    from runtime.testing import task_rows

    await _workers(h)
    await h.worker("math")
    await h.worker("harness_agent")
    command = [sys.executable, "-c", "raise SystemExit('the harness gives up')"]
    row = task_rows(fs.MATH_TASKS)[0]
    await h.submit(h.start(row, agent="harness_agent", env="math", run_id="kind", agent_options={"command": command}))


CASES: dict[FailureKind, Case] = {
    "invalid_input": invalid_input,
    "model_error": lambda h: _policy(h, mode="reject"),
    "context_length": lambda h: _policy(h, mode="context"),
    "tool_error": lambda h: _fault(h, "tool"),
    "verifier_error": lambda h: _fault(h, "verifier"),
    "sandbox_error": lambda h: _fault(h, "sandbox"),
    "judge_error": judge_error,
    "timeout": lambda h: _policy(h, hang=1.0, hang_s=10.0),
    "worker_lost": worker_lost,
    "cancelled": lambda h: _fault(h, "cancel"),
    "internal": lambda h: _fault(h, "internal"),
    "history_changed": history_changed,
    "user_sim_error": lambda h: _second_model(h, "user_sim_agent", "user_sim", "user_simulator"),
    "tool_sim_error": lambda h: _second_model(h, "tool_simulation_agent", "tool_sim", "tool_simulator"),
    "harness_error": harness_error,
    "env_lost": lambda h: _fault(h, "lost"),
}


def test_every_failure_kind_has_a_case() -> None:
    assert set(CASES) == set(typing.get_args(FailureKind))


@pytest.mark.parametrize("kind", list(CASES))
async def test_failure_is_never_a_reward(tmp_path: typing.Any, kind: FailureKind) -> None:
    limits = topology.Limits(ack_wait_s=1.0, max_deliver=2)
    async with Harness(tmp_path / "broker", limits=limits) as h:
        await CASES[kind](h)
        [result] = await h.results("kind", 1, timeout=30)
        stored = await h.final_results("kind")  # every delivery and advisory handled: no second Result can come
    assert len(stored) == 1, stored
    assert result.failure_kind == kind, result
    assert result.reward is None and result.failure_reason
    assert msgspec.json.decode(msgspec.json.encode(result)).get("reward") is None  # absent on the wire
    assert _retried_once_at_most(result, kind)


def _retried_once_at_most(result: Result, kind: str) -> bool:
    """Deterministic kinds end on the first delivery; their reasons never mention giving up."""
    gave_up = "gave up after" in (result.failure_reason or "")
    return gave_up == (kind in ("tool_error", "verifier_error", "sandbox_error", "internal"))
