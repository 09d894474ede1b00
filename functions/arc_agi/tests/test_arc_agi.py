"""arc_agi: grid parsing (malformed grids are wrong answers with a reason), NeMo Gym-shaped rows, the check."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions.arc_agi.env import ENVIRONMENT, parse_grid, verify
from runtime.checking import check
from runtime.sdk import Rollout, Task
from runtime.testing import collect_rows


def reply(text: str) -> Rollout:
    return Rollout(
        output=[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}], state={}
    )


@pytest.mark.parametrize(
    "text,why",
    [
        ("I am not sure.", "no grid found"),
        ("\\boxed{[[1,2],[3,4]}", "not valid JSON"),  # a bracket short
        ("\\boxed{[[1,2],[3]]}", "rows differ in length"),
        ("\\boxed{[[1,12]]}", "integers 0-9"),
        ("\\boxed{[[1,2],[3,4],]}", "not valid JSON"),
    ],
)
def test_malformed_grids_say_why(text: str, why: str) -> None:
    grid, reason = parse_grid(text)
    assert grid is None and reason is not None and why in reason


async def test_exact_match_only() -> None:
    task = Task(0, 0, ENVIRONMENT.check_meta({"expected_output": [[1, 2], [3, 4]]}), {}, [])
    assert (await verify(task, reply("\\boxed{[[1, 2], [3, 4]]}"))).reward is True
    assert (await verify(task, reply("first [[0]] then [[1,2],[3,4]]"))).reward is True  # the last bare grid
    wrong = await verify(task, reply("\\boxed{[[1, 2]]}"))
    assert wrong.reward is False and "shape 1x2, expected 2x2" in wrong.info["reason"]


async def test_check_passes_both_ways() -> None:
    report = await check("arc_agi")
    assert report.ok, [t.problems for t in report.tasks]


NEMO_ROWS = [  # NeMo Gym arc_agi rows' shape: train pairs, test_input, expected_output, task_id
    {
        "responses_create_params": {
            "input": [{"role": "user", "content": "Rule: swap columns.\nTest Input:\n1 2\n3 4"}]
        },
        "train": [{"input": [[5, 6]], "output": [[6, 5]]}],
        "test_input": [[1, 2], [3, 4]],
        "expected_output": [[2, 1], [4, 3]],
        "task_id": "t-swap",
    },
    {
        "responses_create_params": {"input": [{"role": "user", "content": "Rule: keep.\nTest Input:\n7"}]},
        "train": [{"input": [[1]], "output": [[1]]}],
        "test_input": [[7]],
        "expected_output": [[7]],
        "task_id": "t-keep",
    },
]


@pytest.mark.nemo_rows
async def test_nemo_gym_rows_run_unchanged(tmp_path: Path) -> None:
    _, rows = await collect_rows(tmp_path, NEMO_ROWS, env="arc_agi")
    assert [r["reward"] for r in rows] == [1.0, 1.0]
    assert rows[0]["task_id"] == "t-swap" and rows[0]["verifier"]["extracted_answer"] == "[[2, 1], [4, 3]]"
