"""math: arithmetic word problems; the reward is 1.0 iff the final answer equals ``expected_answer``.

The final answer is the last ``\\boxed{...}`` in the reply, else its last number, compared with
the gold answer by ``math-verify`` (so 0.75, 3/4 and \\frac{3}{4} agree), after a fast path for a
boxed plain number. One tool, a safe calculator, makes the tool path real.
"""

from __future__ import annotations

import asyncio
import logging
import re
from decimal import Decimal, InvalidOperation

import msgspec
import simpleeval

from runtime.sdk import Environment, Rollout, Task, Verdict

logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every call with timeouts off


class Meta(msgspec.Struct, frozen=True):
    expected_answer: str | int | float
    """The gold final answer."""


_ARITHMETIC = simpleeval.SimpleEval(names={}, functions={})
"""One evaluator for every call (``simple_eval`` builds one per call: a third of the tool's time); an
evaluation runs start to end on the event loop, so calls never share it at once."""


async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as (3 + 4) * 12 / 7 and return the result."""
    try:
        value = _ARITHMETIC.eval(expression)
    except Exception as exc:  # the model's expression is data: report it, don't crash
        return f"error: cannot evaluate {expression!r}: {type(exc).__name__}: {exc}"
    return str(value)


def _check(gold: str, reply: str) -> tuple[bool, str | None]:
    # math-verify's own timeouts use SIGALRM, which only works on the main thread; this runs in a
    # worker thread with them off, and the runtime's step deadline bounds it instead. Imported here:
    # it brings sympy (~40 MB), which a worker whose replies all take the fast path never needs.
    from math_verify import parse
    from math_verify import verify as equivalent

    target = parse(reply, parsing_timeout=None)
    if not target:
        return False, None
    return equivalent(parse(f"${gold}$", parsing_timeout=None), target, timeout_seconds=None), str(target[-1])


_BOXED = "\\boxed{"
_DECIMAL = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_INTEGER = re.compile(r"-?[0-9]{1,15}")


def _quick(gold: str, reply: str) -> tuple[bool, str | None] | None:
    """The verdict without math-verify when the reply's only box holds a plain number, else None.

    math-verify costs ~1 ms of CPU per check (sympy); most replies box a plain number. Equal numbers
    are equal answers, and two different integers are never equal. Anything else (fractions, LaTeX,
    percentages, decimals that differ, where math-verify's rounding decides) goes to math-verify.
    Its extracted answer for a lone box is the box's text, which is what this returns too."""
    start = reply.find(_BOXED)
    if start < 0 or reply.find(_BOXED, start + 1) >= 0:
        return None
    end = reply.find("}", start)
    answer = reply[start + len(_BOXED) : end]
    if end < 0 or not _DECIMAL.fullmatch(answer) or not _DECIMAL.fullmatch(gold):
        return None
    if answer == gold or _number(answer) == _number(gold):
        return True, answer
    if _INTEGER.fullmatch(answer) and _INTEGER.fullmatch(gold):
        return False, answer
    return None


def _number(text: str) -> Decimal | None:
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """1.0 iff the reply's final answer is mathematically equal to the expected answer."""
    gold, reply = str(task.meta.expected_answer), rollout.text
    quick = _quick(gold, reply)
    correct, extracted = quick if quick is not None else await asyncio.to_thread(_check, gold, reply)
    return Verdict(float(correct), {"extracted_answer": extracted})


ENVIRONMENT = Environment(name="math", meta=Meta, tools=[calculator], verify=verify, verify_inline=True)
