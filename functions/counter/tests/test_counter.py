"""counter: state seeded per task and kept in the session, NeMo Gym-shaped rows through collect, the check."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.checking import check
from runtime.testing import collect_rows


async def test_check_passes_both_ways() -> None:
    report = await check("counter")
    assert report.ok, [t.problems for t in report.tasks]
    assert all(
        report.right(i).timings.tool_calls == 2 for i in range(len(report.tasks))
    )  # the state went through real tool calls


def _tool(name: str, properties: dict) -> dict:
    params = {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}
    return {"type": "function", "name": name, "description": "", "strict": True, "parameters": params}


TOOLS = [_tool("increment_counter", {"count": {"type": "integer", "description": ""}}), _tool("get_counter_value", {})]
NEMO_ROWS = [  # NeMo Gym example_session_state_mgmt rows' shape: the tools listed in the row, the counts beside
    {
        "responses_create_params": {"input": [{"role": "user", "content": "add 2 then add 2"}], "tools": TOOLS},
        "expected_count": 5,
        "initial_count": 1,
    },
    {
        "responses_create_params": {"input": [{"role": "user", "content": "add 8 and read it"}], "tools": TOOLS},
        "expected_count": 8,
    },
]


@pytest.mark.nemo_rows
async def test_nemo_gym_rows_run_unchanged(tmp_path: Path) -> None:
    _, rows = await collect_rows(tmp_path, NEMO_ROWS, env="counter", repeats=2)
    assert [r["reward"] for r in rows] == [1.0] * 4
    assert [r["verifier"]["final_count"] for r in rows] == [5, 5, 8, 8]
