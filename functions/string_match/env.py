"""string_match: free-form answers; the reward is 1.0 iff the extracted answer matches ``expected_answer``.

Extraction (the row's ``extraction_mode``): ``boxed`` (the last ``\\boxed{}``, ``\\text{}`` unwrapped),
``final_answer`` (default: the last ``Final answer:`` / ``Answer:``, else the last box), ``last_line``
(the last non-empty line) or ``full_response``. Comparison (``case_sensitive``): exact after trimming
whitespace when true; otherwise (default) equal after normalizing (NFKC, case, quotes, trailing
punctuation, whitespace, ``$`` and ``\\text{}``), or equal as numbers (``1,000`` = ``1000.0``), or
equal as unordered comma-separated lists. Rows of NeMo Gym's ``string_match`` resources server run
unchanged (its partial 0.98 credit for near numbers, unit and US-state rules are not reproduced).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from runtime.answers import after_answer_colon, last_boxed, last_line, normalize, strip_latex
from runtime.sdk import Environment, Reference, Rollout, Task, Verdict

Mode = Literal["boxed", "final_answer", "last_line", "full_response"]


class Meta(msgspec.Struct, frozen=True):
    expected_answer: str
    extraction_mode: Mode = "final_answer"
    case_sensitive: bool = False


def extract(text: str, mode: Mode) -> str | None:
    if mode == "boxed":
        found = last_boxed(text)
    elif mode == "final_answer":
        found = after_answer_colon(text)
        found = found if found is not None else last_boxed(text)
    elif mode == "last_line":
        found = last_line(text)
    else:
        found = text.strip() or None
    return strip_latex(found) if found is not None else None


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").replace(" ", ""))
    except ValueError:
        return None


def matches(gold: str, answer: str, case_sensitive: bool) -> bool:
    if case_sensitive:
        return gold.strip() == answer.strip()
    g, a = normalize(strip_latex(gold)), normalize(answer)
    if g == a:
        return True
    gn, an = _number(g), _number(a)
    if gn is not None and an is not None:
        return abs(gn - an) <= 1e-9 * max(1.0, abs(gn))
    if "," in g:
        return sorted(normalize(x) for x in g.split(",")) == sorted(normalize(x) for x in a.split(","))
    return False


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """1.0 iff the answer the row's extraction mode finds matches the expected answer."""
    m = task.meta
    answer = extract(rollout.text, m.extraction_mode)
    info = {"extracted_answer": answer, "expected_answer": m.expected_answer}
    if answer is None:
        return Verdict(False, {**info, "reason": f"no answer found by extraction mode {m.extraction_mode!r}"})
    return Verdict(matches(m.expected_answer, answer, m.case_sensitive), info)


def _say(answer: str, mode: Mode) -> str:
    if mode == "boxed":
        return f"Let me think it over.\nThe answer is \\boxed{{{answer}}}."
    if mode == "final_answer":
        return f"Let me think it over.\nFinal answer: {answer}"
    return f"Let me think it over.\n{answer}" if mode == "last_line" else answer


def reference(task: Task[Meta]) -> Reference:
    m = task.meta
    return Reference(right=_say(m.expected_answer, m.extraction_mode), wrong=_say("not sure", m.extraction_mode))


ENVIRONMENT = Environment(
    name="string_match", meta=Meta, verify=verify, reference=reference, accepts=["string_match"]
)
