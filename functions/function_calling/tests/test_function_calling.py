"""function_calling: matching (unordered, ordered, partial credit), malformed arguments, NeMo Gym rows, the check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from functions.function_calling.env import ENVIRONMENT, verify
from runtime.checking import check
from runtime.sdk import Rollout, Task
from runtime.testing import collect_rows


def calls(*made: tuple[str, object]) -> Rollout:
    items = [
        {
            "type": "function_call",
            "call_id": f"c{i}",
            "name": n,
            "arguments": a if isinstance(a, str) else json.dumps(a),
        }
        for i, (n, a) in enumerate(made)
    ]
    return Rollout(output=items, state={})


def task(**meta: object) -> Task:
    return Task(0, 0, ENVIRONMENT.check_meta(meta), {}, [])


WANT = [{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {"y": "a"}}]


async def test_partial_credit_per_call_and_order() -> None:
    both = await verify(task(expected_calls=WANT), calls(("g", {"y": "a"}), ("f", {"x": 1, "extra": True})))
    assert both.reward == 1.0  # unordered; extra arguments allowed
    half = await verify(task(expected_calls=WANT), calls(("f", {"x": 1}), ("g", {"y": "b"})))
    assert half.reward == 0.5 and half.info["matched"] == 1
    extra = await verify(task(expected_calls=WANT), calls(("f", {"x": 1}), ("g", {"y": "a"}), ("h", {}), ("h", {})))
    assert extra.reward == 0.5  # two of four made calls were expected
    ordered = await verify(task(expected_calls=WANT, ordered=True), calls(("g", {"y": "a"}), ("f", {"x": 1})))
    assert ordered.reward == 0.0
    strict = await verify(task(expected_calls=WANT, partial_credit=False), calls(("f", {"x": 1})))
    assert strict.reward == 0.0


async def test_malformed_arguments_and_text_instead_of_calls_are_wrong() -> None:
    assert (await verify(task(expected_answers=WANT[:1]), calls(("f", "{not json")))).reward == 0.0
    assert (await verify(task(expected_answers=WANT[:1]), Rollout(output=[], state={}))).reward == 0.0


async def test_check_passes_both_ways() -> None:
    report = await check("function_calling")
    assert report.ok, [t.problems for t in report.tasks]


TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
NEMO_ROWS = [
    {  # xlam_fc's shape
        "responses_create_params": {
            "input": [{"role": "user", "content": "Weather in Bern and Graz?"}],
            "tools": [TOOL],
        },
        "expected_answers": [
            {"name": "get_weather", "arguments": {"city": "Bern"}},
            {"name": "get_weather", "arguments": {"city": "Graz"}},
        ],
        "id": 7,
        "agent_ref": {"type": "responses_api_agents", "name": "xlam_fc_simple_agent"},
    },
    {  # single_step_tool_use_with_argument_comparison's shape
        "responses_create_params": {"input": [{"role": "user", "content": "Weather in Riga"}], "tools": [TOOL]},
        "expected_action": {"type": "function_call", "name": "get_weather", "arguments": '{"city": "Riga"}'},
    },
]


@pytest.mark.nemo_rows
async def test_nemo_gym_rows_run_unchanged(tmp_path: Path) -> None:
    _, rows = await collect_rows(tmp_path, NEMO_ROWS, env="function_calling", agent="one_shot")
    assert [r["reward"] for r in rows] == [1.0, 1.0]
    assert rows[0]["agent"] == "one_shot" and rows[0]["verifier"]["matched"] == 2
