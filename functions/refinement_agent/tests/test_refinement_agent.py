"""refinement_agent through a real broker and the simulated policy: a failed check's feedback goes back
to the model, the reward is the final answer's, every attempt's reward is recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from broker.schemas import Result, Start
from runtime.answers import last_boxed
from runtime.crashtest import assert_same_rewards, kill_between_steps
from runtime.sdk import Environment, Reference, Rollout, Task, Verdict
from runtime.testing import Harness, task_rows

MCQA = Path(__file__).parents[2] / "mcqa" / "data" / "example.jsonl"


class Meta(msgspec.Struct, frozen=True):
    expected_answer: str


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    answer = last_boxed(rollout.text)
    return Verdict(answer == task.meta.expected_answer, {"extracted_answer": answer, "feedback": "Recount."})


def reference(task: Task[Meta]) -> Reference:
    """A model that gets it right on its second try (after feedback), or never."""
    return Reference(right=["\\boxed{-1}", f"\\boxed{{{task.meta.expected_answer}}}"], wrong="\\boxed{-1}")


QUIZ = Environment(name="quiz", meta=Meta, verify=verify, reference=reference)


def quiz_rows(tmp_path: Path, n: int = 4) -> Path:
    path = tmp_path / "quiz.jsonl"
    ask = "What is {k} + {k}? Answer in \\boxed{{}}."
    rows = [{"responses_create_params": {"input": ask.format(k=k)}, "expected_answer": f"{2 * k}"} for k in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


async def run(h: Harness, rows: list[dict[str, Any]], env: str, n_results: int, **options: Any) -> list[Result]:
    for i, row in enumerate(rows):
        await h.submit(h.start(row, agent="refinement_agent", env=env, task_index=i, **options))
    return sorted(await h.results("test", n_results), key=lambda r: r.task_index)


async def test_feedback_leads_to_a_right_second_attempt(harness: Harness, tmp_path: Path) -> None:
    tasks = quiz_rows(tmp_path)
    await harness.simulate(tasks, env=QUIZ, accuracy=1.0)
    await harness.worker("refinement_agent")
    await harness.worker(QUIZ)
    for r in await run(harness, task_rows(tasks), "quiz", 4):
        assert r.reward == 1.0 and r.verifier["attempts"] == [0.0, 1.0], r
        feedback = [i for i in r.output if i.get("gymbus", {}).get("source") == "verifier"]
        assert len(feedback) == 1 and "Recount." in feedback[0]["content"]
        assert feedback[0]["gymbus"] == {"source": "verifier", "attempt": 1, "reward": 0.0}
        assert r.agent_info == {"corrections": 1} and r.timings.model_calls == 2


async def test_a_model_that_never_gets_it_spends_its_corrections(harness: Harness, tmp_path: Path) -> None:
    tasks = quiz_rows(tmp_path, 2)
    await harness.simulate(tasks, env=QUIZ, accuracy=0.0)
    await harness.worker("refinement_agent")
    await harness.worker(QUIZ)
    for r in await run(harness, task_rows(tasks), "quiz", 2, agent_options={"max_corrections": 3}):
        assert r.reward == 0.0 and r.verifier["attempts"] == [0.0] * 4
        assert r.agent_info == {"corrections": 3} and r.timings.model_calls == 4


async def test_with_a_shipped_environment_a_right_first_answer_ends_at_its_check(harness: Harness) -> None:
    rows = task_rows(MCQA)[:4]
    await harness.simulate(MCQA, env="mcqa", accuracy=1.0)
    await harness.worker("refinement_agent")
    await harness.worker("mcqa")
    for r in await run(harness, rows, "mcqa", 4):
        assert r.reward == 1.0 and r.verifier["attempts"] == [1.0] and r.timings.model_calls == 1


async def test_wrong_answers_on_a_shipped_environment_get_its_verdict_back(harness: Harness) -> None:
    rows = task_rows(MCQA)[:2]
    await harness.simulate(MCQA, env="mcqa", accuracy=0.0)
    await harness.worker("refinement_agent")
    await harness.worker("mcqa")
    for r in await run(harness, rows, "mcqa", 2, agent_options={"max_corrections": 1}):
        assert r.reward == 0.0 and r.verifier["attempts"] == [0.0, 0.0]
        [feedback] = [i for i in r.output if i.get("gymbus", {}).get("source") == "verifier"]
        assert "The answer read from your reply" in feedback["content"]
        assert "expected" not in feedback["content"].lower()  # the verifier's gold answer is never shown


async def test_killed_between_steps_it_resumes_with_the_same_reward(harness: Harness, tmp_path: Path) -> None:
    tasks = quiz_rows(tmp_path)
    await harness.simulate(tasks, env=QUIZ, accuracy=0.5, latency_ms=300)
    await harness.worker(QUIZ)
    starts: list[Start] = [
        harness.start(row, agent="refinement_agent", env="quiz", run_id="r", task_index=i)
        for i, row in enumerate(task_rows(tasks))
    ]
    clean, killed, kill = await kill_between_steps(harness, "refinement_agent", starts)
    assert_same_rewards(clean, killed)
    assert [r.verifier["attempts"] for r in killed] == [r.verifier["attempts"] for r in clean]
    assert {len(r.verifier["attempts"]) for r in clean} == {2, 3}  # right on the 2nd try, or never
    assert kill.turns >= 1
