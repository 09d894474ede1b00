"""instruction_following: every IFEval instruction type both ways, grading modes, bad rows, NeMo Gym rows, the check."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions.instruction_following import ifeval
from functions.instruction_following.env import ENVIRONMENT
from runtime.checking import check
from runtime.errors import InvalidInput
from runtime.testing import collect_rows

CASES: dict[str, tuple[dict, str, str]] = {  # instruction -> (kwargs, a response that follows it, one that does not)
    "keywords:existence": ({"keywords": ["owl"]}, "An owl hoots.", "A cat meows."),
    "keywords:frequency": ({"keyword": "go", "frequency": 2, "relation": "at least"}, "go go", "go"),
    "keywords:forbidden_words": ({"forbidden_words": ["bad"]}, "good", "not bad"),
    "keywords:letter_frequency": ({"letter": "z", "let_frequency": 2, "let_relation": "less than"}, "zoo", "zzz"),
    "language:response_language": (
        {"language": "fr"},
        "Je pense que le temps est beau aujourd'hui.",
        "The weather is nice.",
    ),
    "length_constraints:number_sentences": ({"num_sentences": 2, "relation": "less than"}, "One.", "One. Two. Three."),
    "length_constraints:number_paragraphs": ({"num_paragraphs": 2}, "a\n***\nb", "a\n***\n***\nb"),
    "length_constraints:number_words": ({"num_words": 3, "relation": "at least"}, "one two three", "one two"),
    "length_constraints:nth_paragraph_first_word": (
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
        "First.\n\nThen, more.",
        "First.\n\nAfter.",
    ),
    "detectable_content:number_placeholders": ({"num_placeholders": 1}, "Dear [name]", "Dear you"),
    "detectable_content:postscript": ({"postscript_marker": "P.P.S"}, "Hi.\nP.P.S. bye", "Hi. bye"),
    "detectable_format:number_bullet_lists": ({"num_bullets": 2}, "* a\n* b", "* a"),
    "detectable_format:constrained_response": ({}, "My answer is no.", "No."),
    "detectable_format:number_highlighted_sections": ({"num_highlights": 1}, "*key* point", "key point"),
    "detectable_format:multiple_sections": (
        {"section_spliter": "Part", "num_sections": 2},
        "Part 1\na\nPart 2\nb",
        "Part 1\na",
    ),
    "detectable_format:json_format": ({}, '{"a": 1}', "{a: 1}"),
    "detectable_format:title": ({}, "<<Hello>>\ntext", "Hello\ntext"),
    "combination:two_responses": ({}, "one\n******\ntwo", "one\n******\none"),
    "combination:repeat_prompt": ({"prompt_to_repeat": "Say hi."}, "Say hi. Hi!", "Hi!"),
    "startend:end_checker": ({"end_phrase": "The end."}, "Story. The end.", "The end. Story."),
    "change_case:capital_word_frequency": (
        {"capital_frequency": 2, "capital_relation": "at least"},
        "NASA and ESA",
        "Nasa and Esa",
    ),
    "change_case:english_capital": (
        {},
        "THE WEATHER TODAY IS SUNNY WITH A LIGHT BREEZE FROM THE WEST.",
        "The weather today is sunny.",
    ),
    "change_case:english_lowercase": ({}, "the weather today is sunny with a light breeze.", "The weather is sunny."),
    "punctuation:no_comma": ({}, "no commas here", "one, two"),
    "startend:quotation": ({}, '"quoted"', "not quoted"),
}


def test_every_ifeval_type_has_a_case() -> None:
    assert set(CASES) == set(ifeval.CHECKS) and len(CASES) == 25


@pytest.mark.parametrize("instruction", sorted(CASES))
def test_each_instruction_both_ways(instruction: str) -> None:
    kwargs, good, bad = CASES[instruction]
    args = ifeval.arguments(instruction, kwargs)
    assert ifeval.CHECKS[instruction](good, **args) is True
    assert ifeval.CHECKS[instruction](bad, **args) is False


def test_bad_rows_name_what_is_wrong() -> None:
    with pytest.raises(InvalidInput, match="'last_word:last_word_answer' is not one of the 25 IFEval"):
        ENVIRONMENT.check_meta({"instruction_id_list": ["last_word:last_word_answer"], "kwargs": [{}]})
    with pytest.raises(InvalidInput, match=r"'keywords:existence' needs kwargs \['keywords'\]"):
        ENVIRONMENT.check_meta({"instruction_id_list": ["keywords:existence"], "kwargs": [{"keyword": "x"}]})
    with pytest.raises(InvalidInput, match="no `instruction_id_list`"):
        ENVIRONMENT.check_meta({"prompt": "hi"})


async def test_check_passes_both_ways() -> None:
    report = await check("instruction_following")
    assert report.ok, [t.problems for t in report.tasks]
    followed = report.right(3).verifier["followed"]
    assert followed == dict.fromkeys(followed, True) and len(followed) == 3


NEMO_ROWS = [
    {  # NeMo Gym's dataset format: the fields under verifier_metadata, kwargs with nulls
        "id": 1,
        "responses_create_params": {
            "input": [{"role": "user", "content": "Say hello without commas."}],
            "tools": [],
            "parallel_tool_calls": False,
        },
        "verifier_metadata": {
            "instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"],
            "prompt": "Say hello without commas.",
            "kwargs": [None, {"num_words": 40, "relation": "less than", "keywords": None}],
            "grading_mode": "fraction",
        },
    },
    {  # the legacy top-level form
        "id": 2,
        "responses_create_params": {"input": [{"role": "user", "content": "Use the word 'yes'."}]},
        "instruction_id_list": ["keywords:existence"],
        "prompt": "Use the word 'yes'.",
        "kwargs": [{"keywords": ["yes"]}],
    },
]


@pytest.mark.nemo_rows
async def test_nemo_gym_rows_run_unchanged(tmp_path: Path) -> None:
    _, rows = await collect_rows(tmp_path, NEMO_ROWS, env="instruction_following")
    assert all(r["reward"] is not None for r in rows), [r.get("failure_reason") for r in rows]
    assert set(rows[0]["verifier"]["followed"]) == {"punctuation:no_comma", "length_constraints:number_words"}
    assert rows[1]["verifier"]["followed"] == {"keywords:existence": False}  # the simulated policy has no reference
