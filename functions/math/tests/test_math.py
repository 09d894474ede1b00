"""The math environment: its verifier on its own answer key, its calculator, and its examples end to end."""

from __future__ import annotations

import pytest

from conftest import MATH_TASKS
from functions.math.env import ENVIRONMENT, Meta, _check, _quick, calculator
from runtime.sdk import Rollout, Task, Verdict
from runtime.testing import Harness


def reply(text: str) -> Rollout:
    return Rollout(
        output=[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}], state={}
    )


def task(answer: str) -> Task[Meta]:
    return Task(index=0, rollout_index=0, meta=Meta(expected_answer=answer), params={}, input=[])


async def verdict_of(gold: str, text: str) -> Verdict:
    verdict = await ENVIRONMENT.verify(task(gold), reply(text))
    assert isinstance(verdict, Verdict)
    return verdict


async def test_verifier_accepts_every_gold_answer(math_rows: list[dict]) -> None:
    """Self-test: each example's own answer, boxed, scores 1.0; off by one scores 0.0."""
    for row in math_rows:
        gold = row["expected_answer"]
        right = await verdict_of(gold, f"So the answer is \\boxed{{{gold}}}.")
        wrong = await verdict_of(gold, f"So the answer is \\boxed{{{int(gold) + 1}}}.")
        assert (right.reward, wrong.reward) == (1.0, 0.0), gold
        assert right.info["extracted_answer"] == gold


@pytest.mark.parametrize(
    "text,expected,reward",
    [
        ("\\boxed{0.75}", "3/4", 1.0),
        ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),
        ("first 12, then 138", "138", 1.0),  # no box: the last number
        ("no number here", "1", 0.0),
        ("", "1", 0.0),
    ],
)
async def test_answer_forms(text: str, expected: str, reward: float) -> None:
    assert (await verdict_of(expected, text)).reward == reward


GOLDS = ("138", "0", "-5", "2.5", "0.75", "1000000", "123456789012", "3/4", "1.0000001")
ANSWERS: tuple[str, ...] = ("138", "139", "138.0", "0", "-0", "-5", "5", "2.50", "2.5", "0.75", "3/4", "\\frac{3}{4}")
ANSWERS += ("1000001", "1000000", "123456789013", "1.0000002", "50\\%", "1,000", "3.", "+7", " 7 ")
REPLIES = ("Working it through, the answer is \\boxed{{{}}}.", "\\boxed{{{}}}", "\\boxed{{12}} then \\boxed{{{}}}")
QUICK_CASES = [(gold, reply.format(answer)) for gold in GOLDS for answer in ANSWERS for reply in REPLIES]


@pytest.mark.parametrize("gold,text", QUICK_CASES)
async def test_every_answer_form_gets_math_verifys_verdict(gold: str, text: str) -> None:
    """The verifier's reward is math-verify's verdict, whichever path gave it; the plain-number fast path
    gives that verdict and extracted answer, or steps aside."""
    right, extracted = _check(gold, text)
    assert _quick(gold, text) in (None, (right, extracted))
    verdict = await verdict_of(gold, text)
    assert (verdict.reward, verdict.info.get("extracted_answer")) == (float(right), extracted)


def test_quick_path_takes_plain_numbers() -> None:
    """The replies the simulated policy gives (a boxed integer) never reach math-verify."""
    assert _quick("138", "the answer is \\boxed{138}.") == (True, "138")
    assert _quick("138", "the answer is \\boxed{139}.") == (False, "139")
    assert _quick("138", "the answer is \\boxed{138.0}.") == (True, "138.0")
    assert _quick("3/4", "\\boxed{0.75}") is None
    assert _quick("1.0000001", "\\boxed{1.0000002}") is None  # math-verify's rounding decides


async def test_calculator_is_safe() -> None:
    assert await calculator("(3 + 4) * 12 / 7") == "12.0"
    assert (await calculator("__import__('os').system('true')")).startswith("error:")
    assert (await calculator("open('/etc/passwd').read()")).startswith("error:")


async def test_examples_end_to_end(harness: Harness, math_rows: list[dict]) -> None:
    """Every example task, with the calculator offered, through a real broker and workers: all right."""
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent")
    await harness.worker("math")
    tools = ENVIRONMENT.tool_specs()
    for i, row in enumerate(math_rows):
        row = {**row, "responses_create_params": {**row["responses_create_params"], "tools": tools}}
        await harness.submit(harness.start(row, run_id="examples", task_index=i))
    results = await harness.results("examples", len(math_rows), timeout=60)
    assert len(results) == len(math_rows) >= 20
    assert all(r.reward == 1.0 for r in results), [(r.task_index, r.failure_reason, r.verifier) for r in results]
    assert all(r.timings.tool_calls == 1 for r in results)
