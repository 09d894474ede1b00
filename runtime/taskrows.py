"""A task row as an environment reads it: its verifier fields checked against the environment's
``meta``, with errors that name the row's field and the environment."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from runtime.errors import InvalidInput

if TYPE_CHECKING:
    from runtime.sdk import Environment, Task

STEP_REWARDS = "_step_rewards"
"""Where `Context.step_reward` keeps a rollout's step rewards, in the environment's state."""
TERMINATED = "_terminated"
"""Where `Context.step_reward(..., terminated=True)` records that the episode is over."""


def convert_meta(env: str, meta_type: type | None, meta: Mapping[str, Any]) -> Any:
    """``meta`` as ``meta_type`` (unchanged when None); InvalidInput naming the field and the environment."""
    if meta_type is None:
        return meta
    try:
        return msgspec.convert(meta, meta_type)
    except msgspec.ValidationError as exc:
        raise InvalidInput(f"environment {env!r}: {row_error(str(exc))}") from exc


def row_error(error: str) -> str:
    """A msgspec error about the meta, told of the task row (whose top level the meta is)."""
    missing = "Object missing required field "
    if error.startswith(missing):
        field, _, at = error[len(missing) :].partition(" - at ")
        return f"the task row has no field {field}{' under ' + at if at else ''} (required)"
    return f"task field {error.replace('`$', '`$.meta', 1)}"


def row_parts(row: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """A NeMo Gym-shaped row's create params without ``input``, its input items, and its verifier fields."""
    params = dict(row.get("responses_create_params") or {})
    raw = params.pop("input", [])
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw)
    return params, items, {k: v for k, v in row.items() if k != "responses_create_params"}


def task_of(env: Environment, row: Mapping[str, Any], index: int = 0, rollout_index: int = 0) -> Task[Any]:
    """A task row as ``env``'s `Task` (what the simulated policy and ``gymbus check`` hand a reference)."""
    from runtime.sdk import Task

    params, items, meta = row_parts(row)
    return Task(index=index, rollout_index=rollout_index, meta=env.check_meta(meta), params=params, input=items)


def step_rewards(state: Mapping[str, Any]) -> list[float]:
    """The rewards an environment's tools recorded step by step (`Context.step_reward`), in order."""
    return list(state.get(STEP_REWARDS, []))


def terminated(state: Mapping[str, Any]) -> bool:
    """Whether an environment's tools said the episode is over (`Context.step_reward`)."""
    return bool(state.get(TERMINATED, False))
