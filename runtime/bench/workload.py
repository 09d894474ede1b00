"""The two workloads as Start messages: "answer" offers no tools, "tool" offers the math calculator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from broker.schemas import Options, Start
from runtime.bench.grid import Workload

TASKS = Path(__file__).resolve().parents[2] / "functions" / "math" / "data" / "example.jsonl"
"""The answer key the simulated policy serves, and the tasks the rollouts cycle through."""


def task_rows(path: Path = TASKS) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def calculator_specs() -> list[dict[str, Any]]:
    """The math environment's tools as a Responses ``tools`` list (what `collect` would offer)."""
    from functions.math.env import ENVIRONMENT

    return ENVIRONMENT.tool_specs()


class Starts:
    """Start number ``i`` of a run: task ``i mod n``, repeat ``i div n``, so every session id is new."""

    def __init__(self, run_id: str, workload: Workload, rows: list[dict[str, Any]]) -> None:
        self.run_id = run_id
        self.rows = rows
        self.tools = calculator_specs() if workload == "tool" else []

    def __call__(self, i: int) -> Start:
        task, repeat = i % len(self.rows), i // len(self.rows)
        row = self.rows[task]
        params = dict(row["responses_create_params"])
        if self.tools:
            params["tools"] = self.tools
        return Start(
            run_id=self.run_id,
            task_index=task,
            rollout_index=repeat,
            agent="simple_agent",
            env="math",
            responses_create_params=params,
            meta={k: v for k, v in row.items() if k != "responses_create_params"},
            options=Options(max_steps=4, rollout_timeout_s=300.0, step_timeout_s=120.0),
        )
