"""Routing a run's task rows (runtime/routing.py) and checking each against its environment before any
model call: a row that cannot run fails as ``invalid_input``."""

from __future__ import annotations

from typing import Any

from runtime.errors import InvalidInput
from runtime.routing import environment, route
from runtime.sdk import Environment


def route_tasks(rows: list[Any], agent: str, env: str, default: Environment | None) -> dict[str, Environment]:
    """Route every task row (``TaskRow``: sets its ``agent`` and ``env``) and check its fields against
    its environment, so a row that cannot run fails as ``invalid_input`` before any model call (its
    ``error``). Returns the environments the rows run on that import here, by name."""
    envs: dict[str, Environment] = {env: default} if default is not None else {}
    for task in rows:
        if task.row is None:
            continue
        try:
            r = route(task.row, agent, env)
        except InvalidInput as exc:
            task.error = f"task row {task.index}: {exc.reason}"
            continue
        task.agent, task.env = r.agent, r.env
        found = envs.get(r.env) or environment(r.env)
        if found is None:
            if r.env != env:
                task.error = f"task row {task.index}: environment {r.env!r} is not under functions/ here"
            continue
        envs[r.env] = found
        try:
            found.check_meta({k: v for k, v in task.row.items() if k != "responses_create_params"})
        except InvalidInput as exc:
            task.error = f"task row {task.index}: {exc.reason}"
    return envs
