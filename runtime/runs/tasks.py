"""Task rows: read from a JSONL file, and turned into the Start messages of a run."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.manifests import RunDefaults
from broker.schemas import Options, Start
from runtime.errors import InputError
from runtime.runs.config import RunConfig


@dataclass
class TaskRow:
    index: int
    row: dict[str, Any] | None
    error: str | None = None
    """Why the line is not a task, or cannot run (its rollouts fail with this reason, before any model call)."""
    agent: str | None = None
    """The agent the row runs on, when it is not the run's (see runtime/routing.py)."""
    env: str | None = None
    """The environment the row runs on, when it is not the run's."""


def read_tasks(path: str | Path, limit: int | None = None) -> list[TaskRow]:
    """Task rows in file order; a line that is not a JSON object becomes a row with an error.
    InputError if the file is missing or holds no line at all."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"input file {str(p)!r} does not exist (input: in the config, or --input)")
    rows: list[TaskRow] = []
    with p.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            if limit is not None and len(rows) >= limit:
                break
            rows.append(_row(p.name, lineno, len(rows), line))
    if not rows:
        raise InputError(f"input file {str(p)!r} holds no task rows (one JSON object per line)")
    return rows


def _row(name: str, lineno: int, index: int, line: str) -> TaskRow:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        return TaskRow(index, None, f"{name} line {lineno} is not valid JSON: {exc}")
    if not isinstance(row, dict):
        return TaskRow(index, None, f"{name} line {lineno} is a JSON {type(row).__name__}, not an object")
    return TaskRow(index, row)


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (what a run's identity records of its input)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def run_defaults(cfg: RunConfig) -> RunDefaults:
    """What the run's rollouts get where their row says nothing: written into the run's manifest, and
    applied by the agent workers (so a row published by any other producer runs the same way)."""
    return RunDefaults(sampling=cfg.sampling, options=cfg.limits.options(), env_tools=cfg.env_tools)


def build_start(cfg: RunConfig, run_id: str, task: TaskRow, rollout: int, attempt: int) -> Start:
    """The Start of one rollout of a task row, as the row is: its create params unchanged and its other
    fields as meta. The run's defaults are in its manifest (`run_defaults`), not in the Start."""
    assert task.row is not None
    meta = {k: v for k, v in task.row.items() if k != "responses_create_params"}
    params = task.row.get("responses_create_params")
    agent = task.agent or cfg.agent
    return Start(
        run_id=run_id,
        task_index=task.index,
        rollout_index=rollout,
        attempt=attempt,
        agent=agent,
        env=task.env or cfg.env,
        model=cfg.model.name,
        responses_create_params=params,  # type: ignore[arg-type]  # a wrong type fails at the agent, naming the field
        meta=meta,
        **_agent_options(cfg, agent),
    )


def _agent_options(cfg: RunConfig, agent: str) -> dict[str, Options]:
    """The run agent's own settings (``agent_options``), the only options a Start carries: every other
    one is in the manifest's defaults, and a row routed to another agent gets none of them."""
    if agent != cfg.agent or not cfg.agent_options:
        return {}
    return {"options": Options(agent_options=cfg.agent_options)}
