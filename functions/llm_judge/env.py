"""llm_judge: a judge model decides whether the answer is equivalent to the reference.

The judge is the model named ``judge``, reached through the model tier (its own endpoints in the
``models`` bucket, routing, retries, a GenAI span; its token usage is in the verifier info under
``models``), at most ``GYMBUS_FLEET_LIMIT_JUDGE`` (8) calls in flight across every replica. It is
asked whether answer A and answer B agree and must end with ``[[A=B]]`` or ``[[A!=B]]``. With the
swap check (default), it is asked twice, the reference as A then the candidate as A: both equal
scores 1.0, both different 0.0, a disagreement is recorded (``swap_agree: false``) and scores the
row's ``reward_if_swap_fails`` (0.0). A judge reply without a verdict is a ``judge_error`` failure,
never a reward of 0. Rows of NeMo Gym's ``equivalence_llm_judge`` (``question``,
``expected_answer``) and ``math_with_judge`` resources servers run unchanged.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from runtime.errors import JudgeError
from runtime.items import last_user_text
from runtime.sdk import Environment, Model, Reference, Rollout, Task, Verdict

JUDGE = Model("judge", fleet_limit=8, params={"temperature": 0.0})
EQUAL, NOT_EQUAL = "[[A=B]]", "[[A!=B]]"
_VERDICT = re.compile(r"\[\[A(!?)=B\]\]")

PROMPT = """You compare two answers to the same question and say whether they mean the same thing.

Question:
{question}

Answer A:
{a}

Answer B:
{b}

Ignore wording, formatting and explanations; compare only the final answers. End your reply with
[[A=B]] if they are equivalent, or [[A!=B]] if they are not."""


class Meta(msgspec.Struct, frozen=True):
    expected_answer: str
    question: str | None = None
    swap_check: bool = True
    reward_if_swap_fails: float = 0.0


def verdict(text: str) -> bool:
    """True for [[A=B]], False for [[A!=B]] (the last one given); JudgeError when there is none."""
    found = _VERDICT.findall(text)
    if not found:
        raise JudgeError(f"judge {JUDGE.name!r} gave no verdict ({EQUAL} or {NOT_EQUAL}): {text[-200:]!r}")
    return found[-1] == ""


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """1.0 if the judge finds the answer equivalent (both ways with the swap check), else 0.0."""
    m = task.meta
    question = m.question or last_user_text(task.input)
    answer = rollout.text.strip()
    if not answer:
        return Verdict(0.0, {"reason": "the model gave no answer"})
    first = verdict(await JUDGE.ask(PROMPT.format(question=question, a=m.expected_answer, b=answer)))
    info: dict[str, Any] = {"verdicts": [first]}
    if not m.swap_check:
        return Verdict(first, info)
    second = verdict(await JUDGE.ask(PROMPT.format(question=question, a=answer, b=m.expected_answer)))
    info.update(verdicts=[first, second], swap_agree=first == second)
    return Verdict(float(first) if first == second else m.reward_if_swap_fails, info)


def reference(task: Task[Meta]) -> Reference:
    return Reference(
        right=f"The answer is {task.meta.expected_answer}.",
        wrong="I am not sure; perhaps something else entirely.",
        judge={True: f"Both give the same final answer. {EQUAL}", False: f"They differ. {NOT_EQUAL}"},
    )


ENVIRONMENT = Environment(
    name="llm_judge",
    meta=Meta,
    verify=verify,
    reference=reference,
    models=[JUDGE],
    accepts=["equivalence_llm_judge", "math_with_judge"],
)
