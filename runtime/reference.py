"""What a perfect model would answer for a task, and a plausible wrong answer: an environment's reference.

An environment may give a ``reference(task) -> Reference``. The simulated policy plays it (at accuracy
1 the right script, at 0 the wrong one, in between a seeded mix per rollout), and ``gymbus check``
uses it to prove the verifier both ways: the right script must earn the environment's maximum
reward, the wrong one its minimum. A script is a list of turns; a turn is what the model says once:
a text, or one or more tool calls. A single-turn environment writes ``Reference(right="...",
wrong="...")``. A judged environment also says what its judge answers (``judge``), since a
simulated judge cannot judge.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Call:
    """One tool call the model makes: the tool's name and its arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> str:
        return json.dumps(self.arguments)


def call(name: str, **arguments: Any) -> Call:
    """A tool call of a reference script: ``call("submit_guess", word="crane")``."""
    return Call(name, arguments)


Turn = str | Call | Sequence[Call]
"""What the model says in one turn: a text, a tool call, or several tool calls at once."""


def _turns(script: Turn | Sequence[Turn]) -> tuple[str | tuple[Call, ...], ...]:
    if isinstance(script, (str, Call)):
        script = [script]
    out: list[str | tuple[Call, ...]] = []
    for turn in script:
        if isinstance(turn, str):
            out.append(turn)
        elif isinstance(turn, Call):
            out.append((turn,))
        elif isinstance(turn, Sequence) and turn and all(isinstance(c, Call) for c in turn):
            out.append(tuple(c for c in turn if isinstance(c, Call)))
        else:
            raise TypeError(f"a reference turn is a text, a Call or a list of Calls, not {turn!r}")
    if not out:
        raise ValueError("a reference script needs at least one turn")
    return tuple(out)


@dataclass(frozen=True)
class Reference:
    """The right and a plausible wrong way to play one task (see the module docstring)."""

    right: Turn | Sequence[Turn]
    wrong: Turn | Sequence[Turn]
    judge: dict[bool, str] | Callable[[bool, list[dict[str, Any]]], str] | None = None
    """What a judge model answers when the policy played right (True) or wrong (False); or a function of
    that and the judge's request (its input messages), for a judge whose answer depends on the order
    it was shown things in (a swap check); None: no judge."""

    def script(self, correct: bool) -> tuple[str | tuple[Call, ...], ...]:
        """The turns to play, in order."""
        return _turns(self.right if correct else self.wrong)
