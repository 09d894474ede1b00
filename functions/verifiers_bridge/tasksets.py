"""A verifiers environment package, loaded once per worker process: its tasks out as rows, its rubric
scoring a gymbus rollout.

A verifiers (v1) environment is a taskset package (it exports its ``Taskset`` subclass in
``__all__``) loaded with ``load_environment``. Its tasks are the rows (the task's wire data rides in
the row), and its task class's ``@vf.reward``/``@vf.metric`` methods and plugged judges are the
rubric: gymbus runs the rollout, then builds verifiers' ``Trace`` of the conversation and calls the
task's own ``score`` on it.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Iterator
from typing import Any

from runtime.items import message_text, reasoning_text
from runtime.sdk import InvalidInput, VerifierError


@functools.lru_cache(maxsize=16)
def environment(taskset: str, args: str) -> Any:
    """``load_environment`` of the taskset package, with the taskset config's fields from ``args`` (JSON)."""
    import verifiers.v1 as vf
    from verifiers.v1.utils.generic import concrete_type
    from verifiers.v1.utils.loaders import environment_class, load_environment

    try:
        env_cls = environment_class(taskset)
        config_cls = concrete_type(env_cls, vf.EnvConfig, origin=vf.Env) or vf.EnvConfig
        return load_environment(config_cls.model_validate({"taskset": {"id": taskset, **json.loads(args)}}))
    except (ImportError, TypeError, ValueError) as exc:
        raise InvalidInput(f"verifiers taskset {taskset!r} does not load with {args}: {exc}") from None


def rows(taskset: str, args: dict[str, Any], limit: int | None = None) -> Iterator[dict[str, Any]]:
    """The taskset's tasks as NeMo Gym-shaped rows for the ``verifiers_bridge`` environment."""
    env = environment(taskset, json.dumps(args, sort_keys=True))
    for n, task in enumerate(env.taskset):
        if limit is not None and n >= limit:
            return
        data = task.data
        items = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
        prompt = data.prompt
        if isinstance(prompt, str):
            items.append({"role": "user", "content": prompt})
        else:
            items += [m.model_dump(mode="json", exclude_none=True) for m in prompt or []]
        yield {
            "responses_create_params": {"input": items},
            "verifiers": {"taskset": taskset, "args": args},
            "task": data.model_dump(mode="json", exclude_none=True),
            "env": "verifiers_bridge",
        }


async def score(
    taskset: str,
    args: dict[str, Any],
    data: dict[str, Any],
    given: list[dict[str, Any]],
    produced: list[dict[str, Any]],
) -> Any:
    """The task's own score of the conversation: its verifiers ``Trace`` once scored."""
    env = environment(taskset, json.dumps(args, sort_keys=True))
    task_cls = type(env.taskset).task_type()
    try:
        task = task_cls(task_cls.data_type().model_validate(data), env.taskset.config.task)
    except ValueError as exc:
        raise InvalidInput(f"task field `task` is not a task of verifiers taskset {taskset!r}: {exc}") from None
    needs = [fn.__name__ for kind in ("reward", "metric") for fn in task.hooks(kind) if _needs_runtime(fn)]
    if needs:
        raise VerifierError(f"taskset {taskset!r} scores with {needs}, which need a sandbox runtime the bridge has not")
    trace = _trace(task, given, produced)
    await task.score(trace)
    return trace


def _needs_runtime(fn: Any) -> bool:
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def _trace(task: Any, given: list[dict[str, Any]], produced: list[dict[str, Any]]) -> Any:
    """verifiers' Trace of one conversation: the task's input, then what the rollout produced (the
    model's turns marked as sampled, as verifiers marks them)."""
    import verifiers.v1 as vf

    nodes: list[Any] = []
    for items, by_model in ((given, False), (produced, True)):
        for message, assistant in messages(items):
            parent = len(nodes) - 1 if nodes else None
            nodes.append(vf.MessageNode(message=message, parent=parent, sampled=by_model and assistant))
    return vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        nodes=nodes,
        is_completed=True,
        ok=True,
    )


def messages(items: list[dict[str, Any]]) -> Iterator[tuple[Any, bool]]:
    """Responses items as verifiers messages (and whether the model produced each): an assistant
    turn's text, reasoning and function calls make one assistant message, as in Chat."""
    from verifiers.v1.types import AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage

    turn: dict[str, Any] | None = None
    for item in items:
        kind = item.get("type", "message")
        role = item.get("role", "assistant")
        if kind in ("function_call", "reasoning") or (kind == "message" and role == "assistant"):
            turn = turn or {"content": None, "reasoning_content": None, "tool_calls": []}
            if kind == "function_call":
                turn["tool_calls"].append(ToolCall(id=item["call_id"], name=item["name"], arguments=item["arguments"]))
            elif kind == "reasoning":
                turn["reasoning_content"] = reasoning_text(item)
            else:
                turn["content"] = (turn["content"] or "") + message_text(item)
            continue
        if turn is not None:
            yield AssistantMessage(**{**turn, "tool_calls": turn["tool_calls"] or None}), True
            turn = None
        if kind == "function_call_output":
            yield ToolMessage(tool_call_id=item["call_id"], content=str(item.get("output", ""))), False
        elif role in ("system", "developer"):
            yield SystemMessage(content=message_text(item)), False
        else:
            yield UserMessage(content=message_text(item)), False
    if turn is not None:
        yield AssistantMessage(**{**turn, "tool_calls": turn["tool_calls"] or None}), True
