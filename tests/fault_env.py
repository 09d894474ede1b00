"""faults: the math environment with faults chosen per task (the task row's ``fault`` field).

    fault       where        what happens                                   failure kind
    verifier    verify       raises, until GYMBUS_FAULTS_FIXED=1           verifier_error (then replay)
    tool        calculator   raises                                         tool_error
    crash       calculator   kills its worker process (os._exit)           worker_lost
    slow        calculator   sleeps GYMBUS_FAULTS_SLOW_S (3 s)              - (tests ack-wait handling)
    huge        calculator   returns GYMBUS_FAULTS_HUGE_MIB (9) MiB         context_length
    cancel      calculator   raises Cancelled                               cancelled
    internal    calculator   raises a bare GymError (a gymbus bug)          internal
    lost        calculator   raises EnvLost (a pinned server died)          env_lost
    lost_once   calculator   raises EnvLost on a rollout's first attempt    env_lost (retried: a new attempt)
    sandbox     calculator   runs code in a sandbox that cannot start       sandbox_error

A test double, not a shipped environment: serve it with ``gymbus worker tests.fault_env:ENVIRONMENT``.
"""

from __future__ import annotations

import asyncio
import os

import msgspec

from functions.math.env import calculator as math_calculator
from functions.math.env import verify as math_verify
from runtime.errors import Cancelled, EnvLost, GymError
from runtime.sandbox import Sandbox, SandboxConfig
from runtime.sdk import Context, Environment, Rollout, Task, Verdict, tool

LOST: set[str] = set()
"""Rollouts ``lost_once`` has lost already (in this process)."""


class Meta(msgspec.Struct, frozen=True):
    expected_answer: str | int | float
    fault: str = "none"


@tool(context=True)
async def calculator(ctx: Context[Meta], expression: str) -> str:
    """Evaluate an arithmetic expression such as (3 + 4) * 12 / 7 and return the result."""
    match ctx.task.meta.fault:
        case "tool":
            raise RuntimeError("the calculator's backend is down")
        case "crash":
            os._exit(137)
        case "slow":
            await asyncio.sleep(float(os.environ.get("GYMBUS_FAULTS_SLOW_S", "3")))
        case "huge":
            return "9" * int(float(os.environ.get("GYMBUS_FAULTS_HUGE_MIB", "9")) * 2**20)
        case "cancel":
            raise Cancelled("the user cancelled this rollout")
        case "internal":
            raise GymError("an invariant broke")
        case "lost":
            raise EnvLost("the server holding this rollout's state died")
        case "lost_once" if ctx.session_id not in LOST:
            LOST.add(ctx.session_id)
            raise EnvLost("the server holding this rollout's state died")
        case "sandbox":  # an interpreter that is not there: the sandbox, not the code, failed
            await Sandbox(SandboxConfig(python="/nonexistent/python3", allow_same_uid=True)).run("print(1)")
    return await math_calculator(expression)


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """math's verifier, poisoned for tasks with ``fault: verifier`` until GYMBUS_FAULTS_FIXED=1."""
    if task.meta.fault == "verifier" and os.environ.get("GYMBUS_FAULTS_FIXED") != "1":
        raise ZeroDivisionError("the verifier divides by zero on this task")
    return await math_verify(task, rollout)  # type: ignore[arg-type]


ENVIRONMENT = Environment(name="faults", meta=Meta, tools=[calculator], verify=verify)
