"""multi_reward: components and weights, the profile's components, NeMo Gym-shaped rows, the check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from functions.multi_reward.env import ENVIRONMENT, verify
from runtime.checking import check
from runtime.sdk import Rollout, Task
from runtime.testing import collect_rows

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def task(**meta: object) -> Task:
    return Task(0, 0, ENVIRONMENT.check_meta(meta), {"tools": [TOOL]}, [])


def out(*items: dict) -> Rollout:
    return Rollout(output=list(items), state={})


def fc(args: str) -> dict:
    return {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": args}


def msg(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


async def test_each_component_on_its_own() -> None:
    t = task(expected_call={"name": "get_weather", "arguments": {"city": "Oslo"}})
    assert (await verify(t, out(fc('{"city": "Oslo"}')))).info["components"] == {
        "correctness": 1.0,
        "schema_valid": 1.0,
        "format": 1.0,
    }
    wrong_city = await verify(t, out(fc('{"city": "Rome"}'), msg("Done.")))
    assert wrong_city.info["components"] == {"correctness": 0.0, "schema_valid": 1.0, "format": 0.0}
    assert wrong_city.reward == 1.0
    broken = await verify(t, out(fc("{city")))
    assert broken.info["components"] == {"correctness": 0.0, "schema_valid": 0.0, "format": 1.0}


async def test_weights() -> None:
    t = task(expected_answer="14", max_words=5, weights={"correctness": 2.0, "length": 0.5})
    verdict = await verify(t, out(msg("\\boxed{14}")))
    assert verdict.reward == 2.0 + 1.0 + 0.5


async def test_check_passes_both_ways() -> None:
    report = await check("multi_reward")
    assert report.ok, [t.problems for t in report.tasks]


NEMO_ROWS = [  # NeMo Gym example_tool_call_multireward rows' shape: the tool in the row, the expected call
    {
        "responses_create_params": {"input": [{"role": "user", "content": f"Weather in {city}?"}], "tools": [TOOL]},
        "expected_call": {"name": "get_weather", "arguments": {"city": city}},
    }
    for city in ("Perth", "Accra")
]


@pytest.mark.nemo_rows
async def test_nemo_gym_rows_run_unchanged_and_the_profile_shows_components(tmp_path: Path) -> None:
    summary, rows = await collect_rows(tmp_path, NEMO_ROWS, env="multi_reward", agent="one_shot", repeats=2)
    assert [r["reward"] for r in rows] == [3.0] * 4
    assert rows[0]["verifier"]["components"] == {"correctness": 1.0, "schema_valid": 1.0, "format": 1.0}
    profile = json.loads((summary.run_dir / "profile.json").read_text())
    assert set(profile["components"]) == {"correctness", "schema_valid", "format"}
    assert profile["components"]["correctness"]["mean"] == 1.0
