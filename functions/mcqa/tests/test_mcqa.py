"""mcqa: every grading mode, malformed replies, NeMo Gym-shaped rows through collect, and the check both ways."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions.mcqa.env import ENVIRONMENT, Meta, extract
from runtime.checking import check
from runtime.errors import InvalidInput
from runtime.testing import collect_rows

OPTIONS = [{"A": "Circle"}, {"B": "Square"}, {"C": "Triangle"}]


def meta(mode: str = "strict_single_letter_boxed", **extra: object) -> Meta:
    return ENVIRONMENT.check_meta({"options": OPTIONS, "expected_answer": "B", "grading_mode": mode, **extra})


@pytest.mark.parametrize(
    "mode,text,letter",
    [
        ("strict_single_letter_boxed", "so \\boxed{C} then \\boxed{B}", "B"),
        ("strict_single_letter_boxed", "\\boxed{\\text{B}}", "B"),
        ("strict_single_letter_boxed", "\\boxed{B: Square}", "B"),
        ("strict_single_letter_boxed", "\\boxed{Square}", None),  # text is lenient_boxed's job
        ("strict_single_letter_boxed", "\\boxed{Z}", None),  # not an option letter
        ("strict_single_letter_boxed", "no box at all", None),
        ("lenient_boxed", "\\boxed{square}", "B"),
        ("lenient_answer_colon", "thinking...\nAnswer: Triangle", "C"),
        ("lenient_answer_colon", "Answer: b", "B"),
        ("lenient_answer_colon_md", "**Answer:** C", "C"),
        ("last_letter", "A is tempting but I pick B", "B"),
    ],
)
def test_grading_modes(mode: str, text: str, letter: str | None) -> None:
    assert extract(text, meta(mode)) == letter


def test_output_regex_comes_first() -> None:
    m = meta(template_metadata={"output_regex": r"Final Choice:\s*([A-Za-z])"})
    assert extract("Final Choice: c (not \\boxed{B})", m) == "C"


def test_bad_rows_name_the_field_and_the_environment() -> None:
    with pytest.raises(InvalidInput, match=r"environment 'mcqa': the task row has no field `options`"):
        ENVIRONMENT.check_meta({"expected_answer": "B"})
    with pytest.raises(InvalidInput, match=r"environment 'mcqa'.*`expected_answer` 'E' is not one of the options"):
        ENVIRONMENT.check_meta({"options": OPTIONS, "expected_answer": "E"})
    with pytest.raises(InvalidInput, match=r"grading_mode"):
        ENVIRONMENT.check_meta({"options": OPTIONS, "expected_answer": "B", "grading_mode": "fuzzy"})


async def test_check_passes_both_ways() -> None:
    report = await check("mcqa")
    assert report.ok, [t.problems for t in report.tasks]
    assert len(report.tasks) >= 8
    assert {report.right(i).reward for i in range(len(report.tasks))} == {1.0}
    assert {report.wrong(i).reward for i in range(len(report.tasks))} == {0.0}


NEMO_ROWS: list[dict] = [  # NeMo Gym mcqa rows' shape: options as one-key objects, a letter, a grading mode, a uuid
    {
        "responses_create_params": {
            "input": [{"role": "user", "content": "Which is a mammal?\nA: Trout\nB: Dolphin\nC: Gecko"}]
        },
        "options": [{"A": "Trout"}, {"B": "Dolphin"}, {"C": "Gecko"}],
        "expected_answer": "B",
        "grading_mode": "strict_single_letter_boxed",
        "uuid": "row-1",
    },
    {
        "responses_create_params": {"input": [{"role": "user", "content": "2+2?\nA: 3\nB: 5\nC: 4\nD: 22"}]},
        "options": [{"A": "3"}, {"B": "5"}, {"C": "4"}, {"D": "22"}],
        "expected_answer": "C",
        "grading_mode": "lenient_answer_colon",
        "uuid": "row-2",
        "agent_ref": {"type": "responses_api_agents", "name": "mcqa_simple_agent"},
    },
    {"responses_create_params": {"input": [{"role": "user", "content": "Missing options"}]}, "expected_answer": "A"},
]


@pytest.mark.nemo_rows
async def test_nemo_gym_rows_run_unchanged(tmp_path: Path) -> None:
    _, rows = await collect_rows(tmp_path, NEMO_ROWS, env="mcqa")
    assert [r["reward"] for r in rows[:2]] == [1.0, 1.0]
    assert rows[0]["uuid"] == "row-1" and rows[1]["agent_ref"]["name"] == "mcqa_simple_agent"  # the row, unchanged
    assert rows[2]["failure_kind"] == "invalid_input"
    assert "environment 'mcqa': the task row has no field `options`" in rows[2]["failure_reason"]
    assert rows[2]["response"]["output"] == [] and not rows[2]["timings"].get("model_calls")  # before any model call
