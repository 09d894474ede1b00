"""similarity: each metric's range and ordering, NeMo Gym translation rows through collect, the check."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions.similarity.env import similarity
from runtime.checking import check
from runtime.testing import collect_rows


@pytest.mark.parametrize("metric", ["chrf", "edit", "token_set"])
def test_identical_is_one_unrelated_is_low_and_closer_scores_higher(metric: str) -> None:
    gold = "the quick brown fox jumps over the lazy dog"
    assert similarity(metric, gold, gold) == pytest.approx(1.0)
    assert similarity(metric, "", gold) == 0.0
    near = similarity(metric, "the quick brown fox jumped over a lazy dog", gold)
    far = similarity(metric, "a cat sleeps", gold)
    assert 0.0 <= far < near < 1.0


def test_token_set_ignores_word_order() -> None:
    assert similarity("token_set", "red white blue", "blue white red") == 1.0


async def test_check_passes_both_ways() -> None:
    report = await check("similarity")
    assert report.ok, [t.problems for t in report.tasks]


NEMO_ROWS = [  # NeMo Gym wmt_translation rows' shape: source text, reference translation, language codes and names
    {
        "responses_create_params": {
            "input": [{"role": "user", "content": "Translate to Italian: Good morning, friends."}]
        },
        "text": "Good morning, friends.",
        "translation": "Buongiorno, amici.",
        "source_language": "en",
        "target_language": "it_IT",
        "source_lang_name": "English",
        "target_lang_name": "Italian",
        "agent_ref": {"type": "responses_api_agents", "name": "wmt_translation_simple_agent"},
    }
]


@pytest.mark.nemo_rows
async def test_nemo_gym_rows_run_unchanged(tmp_path: Path) -> None:
    _, rows = await collect_rows(tmp_path, NEMO_ROWS, env="similarity", repeats=4, accuracy=0.5)
    rewards = sorted(r["reward"] for r in rows)
    assert set(rewards) <= {0.0, 1.0} and rows[0]["target_language"] == "it_IT"
    assert rows[0]["verifier"]["metric"] == "chrf"
