"""llm_judge: the judge through the model tier (usage recorded), the swap check, judge_error for a reply with no
verdict, the fleet-wide bound on judge calls across replicas, NeMo Gym-shaped rows, the check."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from unittest import mock

import pytest

from broker.schemas import Session, Usage
from functions.llm_judge.env import ENVIRONMENT, verdict, verify
from runtime import judges
from runtime.checking import check
from runtime.errors import JudgeError
from runtime.model.client import ModelOutput, register
from runtime.model.serving import InThread
from runtime.model.simulator import SimConfig, Simulator
from runtime.sdk import Rollout, Task
from runtime.testing import Harness, collect_rows, task_rows

EXAMPLES = Path(__file__).parent.parent / "data" / "example.jsonl"


def test_verdicts() -> None:
    assert verdict("same [[A=B]]") is True and verdict("[[A=B]] no wait [[A!=B]]") is False
    with pytest.raises(JudgeError, match=r"judge 'judge' gave no verdict"):
        verdict("They look equivalent to me.")


async def test_check_passes_both_ways_and_records_judge_usage() -> None:
    report = await check("llm_judge")
    assert report.ok, [t.problems for t in report.tasks]
    usage = report.right(0).verifier["models"]["judge"]
    assert usage["calls"] == 2 and usage["input_tokens"] > 0  # the swap check asked twice
    assert report.right(0).verifier["swap_agree"] is True


async def test_swap_disagreement_is_recorded_and_scored_per_row(harness: Harness) -> None:
    answers = iter(["[[A=B]]", "[[A!=B]]"])

    async def judge(items: list, params: dict, session: Session) -> ModelOutput:
        text = next(answers)
        return ModelOutput(
            [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}], Usage(), {}
        )

    meta = ENVIRONMENT.check_meta({"expected_answer": "4", "reward_if_swap_fails": 0.25})
    session = Session(
        session_id="r.0.0",
        run_id="r",
        task_index=0,
        agent="a",
        env="llm_judge",
        model="policy",
        step=1,
        phase="verify",
        params={},
    )
    reply = Rollout(
        output=[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]}], state={}
    )
    with judges.bound(harness.js, session) as binding:
        binding.respond = judge  # the judge's two answers, in order
        got = await verify(Task(0, 0, meta, {}, [{"role": "user", "content": "2+2?"}]), reply)
    assert got.reward == 0.25 and got.info == {"verdicts": [True, False], "swap_agree": False}


async def test_a_reply_without_a_verdict_is_a_judge_error_not_a_reward(harness: Harness) -> None:
    await harness.simulate(EXAMPLES, env="llm_judge", accuracy=1.0)
    mute = Simulator({}, SimConfig(model="policy"))  # knows no task: answers "I do not know this one."
    with InThread(mute.app()) as server:
        await register(harness.js, "judge", [f"{server.url}/v1"])
        await harness.worker("simple_agent")
        await harness.worker("llm_judge")
        await harness.submit(harness.start(task_rows(EXAMPLES)[0], run_id="mute", env="llm_judge"))
        [result] = await harness.results("mute", 1, timeout=30)
    assert result.failure_kind == "judge_error" and result.reward is None
    assert "gave no verdict" in (result.failure_reason or "")


async def test_judge_calls_are_bounded_fleet_wide(harness: Harness) -> None:
    """Two replicas of the environment, eight rollouts at once, a slow judge: never more than 2 calls in flight."""
    await harness.simulate(EXAMPLES, env="llm_judge", accuracy=1.0)
    assert harness.sim is not None and harness.sim.book is not None
    slow = Simulator({}, SimConfig(model="policy", latency_ms=150, accuracy=1.0), book=harness.sim.book)
    with InThread(slow.app()) as server, mock.patch.dict(os.environ, {"GYMBUS_FLEET_LIMIT_JUDGE": "2"}):
        await register(harness.js, "judge", [f"{server.url}/v1"])
        await harness.worker("simple_agent")
        await harness.worker("llm_judge")
        await harness.worker("llm_judge")
        rows = task_rows(EXAMPLES)
        for i, row in enumerate(rows):
            await harness.submit(harness.start(row, run_id="fleet", task_index=i, env="llm_judge"))
        peak, done = 0, asyncio.create_task(harness.results("fleet", len(rows), timeout=60))
        while not done.done():
            peak = max(peak, slow.in_flight)
            await asyncio.sleep(0.005)
        results = done.result()
        assert await judges.in_flight(harness.js, "judge", 2) == 0  # every slot given back
    assert [r.reward for r in results] == [1.0] * len(rows)
    assert slow.calls == 2 * len(rows)
    assert 1 <= peak <= 2


NEMO_ROWS = [  # NeMo Gym equivalence_llm_judge / math_with_judge rows' shape: question and expected_answer
    {
        "responses_create_params": {"input": [{"role": "user", "content": "Who wrote Hamlet?"}]},
        "question": "Who wrote Hamlet?",
        "expected_answer": "shakespeare",
    },
    {
        "responses_create_params": {"input": [{"role": "user", "content": "Sum of 1..10?"}]},
        "question": "Sum of 1..10?",
        "expected_answer": "55",
        "agent_ref": {"type": "responses_api_agents", "name": "math_with_judge_simple_agent"},
    },
]


@pytest.mark.nemo_rows
async def test_nemo_gym_rows_run_unchanged(tmp_path: Path) -> None:
    _, rows = await collect_rows(tmp_path, NEMO_ROWS, env="llm_judge")
    assert [r["reward"] for r in rows] == [1.0, 1.0], [r.get("failure_reason") for r in rows]
    assert rows[1]["verifier"]["models"]["judge"]["calls"] == 2
