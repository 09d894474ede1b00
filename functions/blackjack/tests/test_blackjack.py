"""blackjack: hand values, deterministic deals, step rewards, NeMo Gym-shaped rows, the check."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions.blackjack.env import ENVIRONMENT, deck, play, value
from runtime.checking import check
from runtime.sdk import Task
from runtime.testing import collect_rows


def test_hand_values() -> None:
    assert value(["A", "K"]) == 21 and value(["A", "A", "9"]) == 21 and value(["K", "Q", "5"]) == 25


def test_a_deal_is_the_same_wherever_it_is_replayed() -> None:
    task = Task(3, 1, ENVIRONMENT.check_meta({}), {}, [])
    assert deck(task) == deck(Task(3, 1, ENVIRONMENT.check_meta({}), {}, []))
    assert deck(task) != deck(Task(3, 2, ENVIRONMENT.check_meta({}), {}, []))
    reward, info = play(deck(task), 0)
    assert reward in (-1.0, 0.0, 1.0) and info["result"] in ("win", "draw", "loss")


async def test_check_passes_both_ways_with_step_rewards() -> None:
    report = await check("blackjack")
    assert report.ok, [t.problems for t in report.tasks]
    for i in range(len(report.tasks)):
        steps = report.wrong(i).verifier["step_rewards"]
        assert steps[-1] == -1.0 and all(s == 0.0 for s in steps[:-1])  # hits until the bust
        assert report.right(i).verifier["step_rewards"][-1] == 1.0


NEMO_ROWS = [  # NeMo Gym blackjack rows' shape: a system prompt and a gymnasium agent_ref, nothing else
    {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "You are playing Blackjack. Hit or stand."},
                {"role": "user", "content": "Deal me in."},
            ]
        },
        "agent_ref": {"type": "responses_api_agents", "name": "blackjack_gymnasium_agent"},
    }
] * 2


@pytest.mark.nemo_rows
async def test_nemo_gym_rows_run_unchanged(tmp_path: Path) -> None:
    _, rows = await collect_rows(tmp_path, NEMO_ROWS, env="blackjack", repeats=2, limits={"max_steps": 12})
    assert all(r["reward"] in (-1.0, 0.0, 1.0) for r in rows), [r.get("failure_reason") for r in rows]
    assert all(r["verifier"]["step_rewards"] for r in rows)
    assert len({tuple(r["verifier"]["player"]) for r in rows}) > 1  # each rollout has its own deal
