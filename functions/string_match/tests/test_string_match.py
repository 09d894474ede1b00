"""string_match: extraction modes, comparison rules, NeMo Gym-shaped rows through collect, the check both ways."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions.string_match.env import extract, matches
from runtime.checking import check
from runtime.testing import collect_rows


@pytest.mark.parametrize(
    "text,mode,found",
    [
        ("so \\boxed{\\text{Paris}}", "boxed", "Paris"),
        ("Final answer: Saturn.", "final_answer", "Saturn."),
        ("no marker but \\boxed{42}", "final_answer", "42"),
        ("line one\n\nPacific Ocean\n", "last_line", "Pacific Ocean"),
        ("  Au ", "full_response", "Au"),
        ("nothing boxed", "boxed", None),
    ],
)
def test_extraction_modes(text: str, mode: str, found: str | None) -> None:
    assert extract(text, mode) == found  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "gold,answer,case_sensitive,same",
    [
        ("Paris", "paris.", False, True),
        ("12,000", "12000.0", False, True),
        ("red, green, blue", "blue, red, green", False, True),
        ("Au", "au", True, False),
        ("Au", " Au ", True, True),
        ("80", "81", False, False),
    ],
)
def test_comparison(gold: str, answer: str, case_sensitive: bool, same: bool) -> None:
    assert matches(gold, answer, case_sensitive) is same


async def test_check_passes_both_ways() -> None:
    report = await check("string_match")
    assert report.ok, [t.problems for t in report.tasks]


def _row(question: str, **fields: object) -> dict:
    content = [{"type": "input_text", "text": question}]
    return {"responses_create_params": {"input": [{"role": "user", "type": "message", "content": content}]}, **fields}


NEMO_ROWS = [  # NeMo Gym string_match rows' shape: typed input parts, extraction_mode, case_sensitive
    _row("Largest desert? Use \\boxed{}.", expected_answer="Sahara", extraction_mode="boxed", case_sensitive=False),
    _row("7*6? End with 'Final answer: <answer>'.", expected_answer="42", extraction_mode="final_answer"),
    _row("Closest star? Last line only.", expected_answer="the Sun", extraction_mode="last_line"),
]


@pytest.mark.nemo_rows
async def test_nemo_gym_rows_run_unchanged(tmp_path: Path) -> None:
    _, rows = await collect_rows(tmp_path, NEMO_ROWS, env="string_match")
    assert [r["reward"] for r in rows] == [1.0, 1.0, 1.0]
    assert [r["extraction_mode"] for r in rows] == ["boxed", "final_answer", "last_line"]
