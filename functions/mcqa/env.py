"""mcqa: multiple choice; the reward is 1.0 iff the extracted letter is the row's ``expected_answer``.

The letter is extracted as the row's ``grading_mode`` says:

- ``strict_single_letter_boxed`` (default): a letter in the last ``\\boxed{}`` (``\\boxed{B}``,
  ``\\boxed{\\text{B}}``, ``\\boxed{B: option text}``);
- ``lenient_boxed``: that, else the box's text equal to exactly one option's text;
- ``lenient_answer_colon``: after the last ``Answer:``, a letter or one option's text;
- ``lenient_answer_colon_md``: the same with markdown emphasis ignored, then the strict box;
- ``last_letter``: the last standalone option letter in the reply.

A ``template_metadata.output_regex`` (a pattern or a list; case-insensitive, the last match wins) is
tried first. Letters are those of the row's ``options`` (``[{"A": "text"}, ...]``); a letter that is
not one of them is no answer. Rows of NeMo Gym's ``mcqa`` resources server run unchanged.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from runtime.answers import after_answer_colon, last_boxed, normalize, strip_latex
from runtime.sdk import Environment, Reference, Rollout, Task, Verdict

Mode = Literal[
    "strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon", "lenient_answer_colon_md", "last_letter"
]


class Meta(msgspec.Struct, frozen=True):
    options: list[dict[str, str | None]]
    """The choices, one ``{letter: text}`` each."""
    expected_answer: str
    """The gold letter."""
    grading_mode: Mode = "strict_single_letter_boxed"
    template_metadata: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if len(self.letters) < 2:
            raise ValueError(f"`options` needs at least two lettered choices, got {self.options!r}")
        if self.expected_answer.strip().upper() not in self.letters:
            raise ValueError(f"`expected_answer` {self.expected_answer!r} is not one of the options {self.letters}")

    @property
    def letters(self) -> list[str]:
        return [k.upper() for o in self.options for k, v in o.items() if len(k) == 1 and k.isalpha() and v is not None]

    @property
    def texts(self) -> dict[str, str]:
        return {k.upper(): normalize(v) for o in self.options for k, v in o.items() if v is not None}


_LEADING = re.compile(r"^[\s\[(]*([A-Za-z])(?:\s*[\])]?\s*(?:[:.)\-]|$))")
_STANDALONE = re.compile(r"\b([A-Z])\b")


def _letter_of(candidate: str | None, meta: Meta, by_text: bool) -> str | None:
    if candidate is None:
        return None
    inner = strip_latex(candidate)
    m = _LEADING.match(inner)
    if m and m.group(1).upper() in meta.letters:
        return m.group(1).upper()
    if by_text:
        matches = [k for k, v in meta.texts.items() if v == normalize(inner)]
        return matches[0] if len(matches) == 1 else None
    return None


def _by_regex(text: str, meta: Meta) -> str | None:
    patterns = (meta.template_metadata or {}).get("output_regex") or []
    for pattern in [patterns] if isinstance(patterns, str) else patterns:
        try:
            found = re.findall(pattern, text, re.IGNORECASE)
        except re.error:
            continue
        if found:
            last = found[-1] if isinstance(found[-1], str) else found[-1][0]
            return _letter_of(last, meta, by_text=True)
    return None


def extract(text: str, meta: Meta) -> str | None:
    """The answer letter the row's grading mode reads in ``text``, or None."""
    letter = _by_regex(text, meta)
    if letter is not None:
        return letter
    match meta.grading_mode:
        case "strict_single_letter_boxed":
            return _letter_of(last_boxed(text), meta, by_text=False)
        case "lenient_boxed":
            return _letter_of(last_boxed(text), meta, by_text=True)
        case "lenient_answer_colon":
            return _letter_of(after_answer_colon(text), meta, by_text=True)
        case "lenient_answer_colon_md":
            found = _letter_of(after_answer_colon(text, markdown=True), meta, by_text=True)
            return found or _letter_of(last_boxed(text), meta, by_text=False)
        case "last_letter":
            letters = [x for x in _STANDALONE.findall(text) if x in meta.letters]
            return letters[-1] if letters else None


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """1.0 iff the extracted letter is the expected one; no letter (or an unknown one) is wrong."""
    letter = extract(rollout.text, task.meta)
    gold = task.meta.expected_answer.strip().upper()
    info: dict[str, Any] = {"extracted_answer": letter, "expected_answer": gold}
    if letter is None:
        info["reason"] = f"no option letter found by {task.meta.grading_mode}"
    return Verdict(letter == gold, info)


def _say(letter: str, mode: str) -> str:
    if mode.startswith("lenient_answer_colon"):
        return f"Comparing the options, the best one is {letter}.\nAnswer: {letter}"
    return f"Comparing the options, the best one is {letter}. Answer: \\boxed{{{letter}}}"


def reference(task: Task[Meta]) -> Reference:
    gold = task.meta.expected_answer.strip().upper()
    other = next(x for x in task.meta.letters if x != gold)
    return Reference(right=_say(gold, task.meta.grading_mode), wrong=_say(other, task.meta.grading_mode))


ENVIRONMENT = Environment(name="mcqa", meta=Meta, verify=verify, reference=reference, accepts=["mcqa"])
