"""wordle: feedback with repeated letters, step rewards in the Result, NeMo Gym-shaped rows, the check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from functions.wordle.env import feedback
from runtime.checking import check
from runtime.testing import collect_rows


@pytest.mark.parametrize(
    "guess,target,marks",
    [
        ("crane", "crane", "GGGGG"),
        ("speed", "abide", "__Y_Y"),
        ("eerie", "there", "Y_Y_G"),
        ("zzzzz", "crane", "_____"),
    ],
)
def test_feedback(guess: str, target: str, marks: str) -> None:
    assert feedback(guess, target) == marks


async def test_check_passes_both_ways_and_records_step_rewards() -> None:
    report = await check("wordle")
    assert report.ok, [t.problems for t in report.tasks]
    assert report.right(0).verifier["step_rewards"] == [1.0]
    assert report.wrong(0).verifier["step_rewards"] == [0.0] * 6


def _tool(name: str, props: dict) -> dict:
    schema = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
    return {"type": "function", "name": name, "description": name, "parameters": schema, "strict": True}


TOOLS = [
    _tool("submit_guess", {"guess": {"type": "string"}}),
    _tool("check_word_validity", {"word": {"type": "string"}}),
    _tool("get_game_state", {}),
]
NEMO_ROWS = [  # NeMo Gym wordle rows' shape: the tools in the row, custom_target, a gymnasium agent_ref
    {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "Play Wordle."},
                {"role": "user", "content": "Make your first guess."},
            ],
            "tools": TOOLS,
            "parallel_tool_calls": False,
            "temperature": 1.0,
        },
        "word_length": 5,
        "max_turns": 6,
        "agent_ref": {"type": "responses_api_agents", "name": "wordle_gymnasium_agent"},
        "custom_target": target,
    }
    for target in ("brick", "gnome")
]


@pytest.mark.nemo_rows
async def test_nemo_gym_rows_run_unchanged(tmp_path: Path) -> None:
    _, rows = await collect_rows(tmp_path, NEMO_ROWS, env="wordle", limits={"max_steps": 10})
    assert [r["reward"] for r in rows] == [1.0, 1.0], [r.get("failure_reason") for r in rows]
    assert rows[0]["verifier"]["guesses"] == ["brick"] and rows[0]["verifier"]["step_rewards"] == [1.0]
    assert json.dumps(rows[1]["custom_target"]) == '"gnome"'
