"""``gymbus check ENV``: prove an environment's verifier both ways on the real stack.

A verifier that rewards everything, or nothing, is the most common environment bug. The check runs
every example task of the environment through an embedded broker, real workers (its agent and the
environment) and the simulated policy playing the environment's reference (runtime/reference.py):
once at accuracy 1 (the right script) and once at accuracy 0 (the plausible wrong one). It passes
only if every rollout ends, none fails, and each task earns the environment's maximum reward the
first time and its minimum the second.
"""

from __future__ import annotations

import asyncio
import importlib
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from broker.schemas import Options, Result, Start
from runtime.errors import InputError, InvalidInput
from runtime.model.client import register
from runtime.routing import route
from runtime.sdk import Agent, Environment, load
from runtime.testing import Harness, task_rows

MAX_STEPS = 16
"""Turns a checked rollout may take (games need several)."""


@dataclass
class TaskCheck:
    index: int
    right: Result | None = None
    wrong: Result | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class Report:
    env: str
    tasks_file: Path
    reward_range: tuple[float, float]
    tasks: list[TaskCheck]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.tasks) and all(t.ok for t in self.tasks)

    def right(self, task: int) -> Result:
        """Task ``task``'s Result at accuracy 1 (it must have ended)."""
        result = self.tasks[task].right
        assert result is not None, f"task {task} never ended at accuracy 1"
        return result

    def wrong(self, task: int) -> Result:
        """Task ``task``'s Result at accuracy 0 (it must have ended)."""
        result = self.tasks[task].wrong
        assert result is not None, f"task {task} never ended at accuracy 0"
        return result


def examples_of(env: Environment, ref: str) -> Path:
    """The environment's example tasks: ``data/example.jsonl`` next to its module."""
    module = importlib.import_module(ref.partition(":")[0] if ":" in ref else f"functions.{ref}")
    return Path(module.__file__ or ".").parent / "data" / "example.jsonl"


def load_env(ref: str) -> Environment:
    try:
        fn = load(ref)
    except (LookupError, ImportError) as exc:
        raise InputError(f"ENV {ref!r}: {exc} (functions/<name>/, or module:OBJECT)") from None
    if not isinstance(fn, Environment):
        raise InputError(f"ENV {ref!r} is an agent, not an environment")
    return fn


async def check(ref: str, tasks: Path | None = None, *, agent: str | None = None, timeout_s: float = 120.0) -> Report:
    """Run the check of environment ``ref`` (a name under functions/ or module:OBJECT), through its
    rows' agents, or through ``agent`` (a name or module:OBJECT) for every row."""
    env = load_env(ref)
    through = _load_agent(agent) if agent else None
    path = tasks or examples_of(env, ref)
    if not path.is_file():
        raise InputError(f"environment {env.name!r} has no example tasks at {path} (give --tasks FILE)")
    rows = task_rows(path)
    if not rows:
        raise InputError(f"{path} holds no task rows")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with tempfile.TemporaryDirectory(prefix="gymbus-check-") as tmp:
        async with Harness(Path(tmp) / "broker") as h:
            await h.simulate(path, env=env, accuracy=1.0, plays=_plays(through))
            assert h.sim is not None and h.model_url is not None
            for model in env.models:
                await register(h.js, model.name, [h.model_url])
            starts = [_start(env, row, i, through.name if through else None) for i, row in enumerate(rows)]
            for name in sorted({s.agent for s in starts}):
                await h.worker(through if through is not None and through.name == name else name)
            await h.worker(env)
            right = await _pass(h, starts, "check-right", timeout_s)
            h.sim.config.accuracy = 0.0
            wrong = await _pass(h, starts, "check-wrong", timeout_s)
    report = Report(env.name, path, env.reward_range, [], loop.time() - started)
    for i in range(len(rows)):
        report.tasks.append(_judge(env, TaskCheck(i, right.get(i), wrong.get(i))))
    return report


def _plays(agent: Agent | None) -> dict[str, str]:
    """The agent's other models (user, tool simulators) with its default settings, for the simulator to play."""
    try:
        models = agent.models_for(agent.config_of({})) if agent is not None else []
    except InvalidInput:
        models = []
    return {m.name: m.role for m in models if m.role != "judge"}


def _load_agent(ref: str) -> Agent:
    try:
        fn = load(ref)
    except (LookupError, ImportError) as exc:
        raise InputError(f"--agent {ref!r}: {exc}") from None
    if not isinstance(fn, Agent):
        raise InputError(f"--agent {ref!r} is an environment, not an agent")
    return fn


def _start(env: Environment, row: dict[str, Any], index: int, agent: str | None) -> Start:
    r = route(row, env.agent, env.name)
    if r.env != env.name:
        raise InputError(f"example task {index} runs on environment {r.env!r}, not {env.name!r}")
    params = dict(row.get("responses_create_params") or {})
    if "tools" not in params and env.by_name:
        params["tools"] = env.tool_specs()
    return Start(
        run_id="check",
        task_index=index,
        agent=agent or r.agent,
        env=env.name,
        responses_create_params=params,
        meta={k: v for k, v in row.items() if k != "responses_create_params"},
        options=Options(max_steps=MAX_STEPS, seed=env.seed is not None),
    )


async def _pass(h: Harness, starts: list[Start], run_id: str, timeout_s: float) -> dict[int, Result]:
    for s in starts:
        await h.submit(msgspec.structs.replace(s, run_id=run_id))
    results = await h.results(run_id, len(starts), timeout=timeout_s)
    return {r.task_index: r for r in results}


def _judge(env: Environment, t: TaskCheck) -> TaskCheck:
    low, high = env.reward_range
    for label, result, want in (("accuracy 1", t.right, high), ("accuracy 0", t.wrong, low)):
        if result is None:
            t.problems.append(f"{label}: the rollout never ended")
        elif result.failed:
            t.problems.append(f"{label}: failed ({result.failure_kind}: {result.failure_reason})")
        elif result.reward is None or not math.isclose(result.reward, want, abs_tol=1e-9):
            info = ", ".join(f"{k}={v!r}" for k, v in list(result.verifier.items())[:4])
            t.problems.append(f"{label}: reward {result.reward:g}, expected {want:g} ({info})")
    return t
