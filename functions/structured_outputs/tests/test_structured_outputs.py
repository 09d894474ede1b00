"""structured_outputs: partial credit by field, unparseable replies, tool-call payloads, NeMo Gym rows, the check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from functions.structured_outputs.env import ENVIRONMENT, score, verify
from runtime.checking import check
from runtime.errors import InvalidInput
from runtime.sdk import Rollout, Task
from runtime.testing import collect_rows

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "value,reward",
    [
        ({"name": "A", "age": 3}, 1.0),
        ({"name": "A", "age": "3"}, 2 / 3),  # age wrong; tags optional and absent
        ({"name": "A"}, 2 / 3),  # age missing
        ({"name": 1, "age": "x", "tags": 5}, 0.0),
        ({"name": "A", "age": 3, "other": 1}, 3 / 4),  # a field the schema forbids counts against it
        ([1, 2], 0.0),
    ],
)
def test_partial_credit_by_field(value: object, reward: float) -> None:
    got, errors = score(SCHEMA, value, partial=True)
    assert got == pytest.approx(reward)
    assert (got == 1.0) == (errors == [])


def text(t: str) -> Rollout:
    return Rollout(
        output=[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": t}]}], state={}
    )


async def test_unparseable_replies_are_wrong_with_the_reason() -> None:
    task = Task(0, 0, ENVIRONMENT.check_meta({"schema": SCHEMA}), {}, [])
    bad = await verify(task, text("{name: A"))
    assert bad.reward == 0.0 and "not valid json" in bad.info["reason"]
    fenced = await verify(task, text('```json\n{"name": "A", "age": 3}\n```'))
    assert fenced.reward == 1.0


def test_bad_schemas_are_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="not a valid JSON Schema"):
        ENVIRONMENT.check_meta({"schema": {"type": "nonsense"}})
    with pytest.raises(InvalidInput, match="exactly one of `schema`"):
        ENVIRONMENT.check_meta({})


async def test_check_passes_both_ways() -> None:
    report = await check("structured_outputs")
    assert report.ok, [t.problems for t in report.tasks]


PAYLOAD = {"type": "object", "properties": {"city": {"type": "string"}, "rank": {"type": "integer"}}}
TOOLS = [
    {
        "type": "function",
        "name": f"response_tool_{i}",
        "description": "Return the extraction.",
        "parameters": {"type": "object", "properties": {"extraction": PAYLOAD}, "required": ["extraction"]},
    }
    for i in (1, 2)
]
NEMO_ROWS = [  # NeMo Gym structured_outputs v4 rows' shape: schema_str, tool_call response, payload key, distractors
    {
        "responses_create_params": {
            "input": [{"role": "system", "content": "Extract."}, {"role": "user", "content": "Oslo ranks 3rd."}],
            "tools": TOOLS,
            "tool_choice": "auto",
            "parallel_tool_calls": True,
        },
        "schema_str": json.dumps(PAYLOAD),
        "schema_type": "json",
        "response_mode": "tool_call",
        "tool_name": "response_tool_2",
        "tool_payload_key": "extraction",
        "num_tools": 2,
        "agent_ref": {"type": "responses_api_agents", "name": "structured_outputs_v4_simple_agent"},
    },
]


@pytest.mark.nemo_rows
async def test_nemo_gym_rows_run_unchanged(tmp_path: Path) -> None:
    _, rows = await collect_rows(tmp_path, NEMO_ROWS, env="structured_outputs", agent="one_shot")
    assert [r["reward"] for r in rows] == [1.0]
    assert rows[0]["num_tools"] == 2 and rows[0]["agent"] == "one_shot"
