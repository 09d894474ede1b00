"""verifiers_bridge: a verifiers environment package's tasks and rubric, its rollouts run by gymbus.

Rows come from ``gymbus tasks verifiers TASKSET`` (each carries the taskset it came from and the
task's wire data); gymbus runs the rollout (any gymbus agent, the model through gymbus's model tier),
then the verifier loads the taskset with verifiers' ``load_environment`` (once per worker process)
and scores the conversation with the task's own rewards, metrics and judges. The reward is their
weighted sum, as verifiers computes it; each reward is reported as a component.
"""

from __future__ import annotations

from typing import Any

import msgspec

from runtime.sdk import Environment, Reference, Rollout, Task, Verdict


class Source(msgspec.Struct, frozen=True, kw_only=True):
    taskset: str
    """The taskset package (its import name, as ``load_environment`` takes it)."""
    args: dict[str, Any] = {}
    """The taskset config's fields it was loaded with."""


class Meta(msgspec.Struct, frozen=True, kw_only=True):
    verifiers: Source
    task: dict[str, Any]
    """The task's wire data (verifiers' ``TaskData``, as JSON)."""


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """The task's own rubric over the conversation."""
    from functions.verifiers_bridge import tasksets

    m = task.meta
    trace = await tasksets.score(m.verifiers.taskset, m.verifiers.args, m.task, task.input, rollout.output)
    rewards = {name: r.score for name, r in trace.rewards.items() if r is not None}
    metrics = {name: v for name, v in trace.metrics.items() if v is not None}
    return Verdict(trace.reward, {"components": rewards, "metrics": metrics, "taskset": m.verifiers.taskset})


def reference(task: Task[Meta]) -> Reference:
    """A task whose data has an ``answer`` is played right with it (verifiers' tasks often carry one)."""
    answer = task.meta.task.get("answer")
    if not isinstance(answer, str):
        raise LookupError("this verifiers task has no `answer` for the simulated policy to play")
    return Reference(right=answer, wrong="I cannot tell.")


ENVIRONMENT = Environment(name="verifiers_bridge", meta=Meta, verify=verify, reference=reference)
