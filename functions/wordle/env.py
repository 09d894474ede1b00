"""wordle: guess a secret word through tool calls; per-guess feedback and step rewards, 1.0 for a win.

The target is the row's ``custom_target`` (NeMo Gym's field) or ``target``; ``max_turns`` guesses
(6) of ``word_length`` letters (5). Tools: ``submit_guess`` (feedback per letter: ``G`` right place,
``Y`` in the word elsewhere, ``_`` absent), ``check_word_validity`` and ``get_game_state``. Any
alphabetic word of the right length is a valid guess (no dictionary ships here); an invalid guess
costs no turn. Each guess records a step reward, the share of green letters, and the last one ends
the episode (``steps=True``: step_agent fits). The reward is 1.0 if
the word was found within the turns, else 0.0. The game lives in the session record. Rows of NeMo
Gym's ``wordle`` resources server run unchanged (its shaped win reward and penalties are not reproduced).
"""

from __future__ import annotations

from typing import Any

import msgspec

from runtime.sdk import Context, Environment, Reference, Rollout, Task, Verdict, call, tool


class Meta(msgspec.Struct, frozen=True):
    custom_target: str | None = None
    target: str | None = None
    word_length: int = 5
    max_turns: int = 6

    def __post_init__(self) -> None:
        word = self.secret
        if word is None or not word.isalpha() or len(word) != self.word_length:
            raise ValueError(f"`custom_target` {word!r} must be a {self.word_length}-letter word")

    @property
    def secret(self) -> str | None:
        word = self.custom_target if self.custom_target is not None else self.target
        return word.lower() if word else None


def feedback(guess: str, target: str) -> str:
    marks, left = ["_"] * len(guess), list(target)
    for i, (g, t) in enumerate(zip(guess, target, strict=True)):
        if g == t:
            marks[i] = "G"
            left.remove(g)
    for i, g in enumerate(guess):
        if marks[i] == "_" and g in left:
            marks[i] = "Y"
            left.remove(g)
    return "".join(marks)


async def seed(ctx: Context[Meta]) -> None:
    ctx.state.update(guesses=[], feedback=[], won=False, over=False)


@tool(context=True)
async def submit_guess(ctx: Context[Meta], guess: str) -> dict[str, Any]:
    """Submit a guess of the secret word; returns feedback per letter: G right place, Y elsewhere, _ absent."""
    m, s, word = ctx.task.meta, ctx.state, guess.strip().lower()
    if s["over"]:
        return {"error": "the game is over", "won": s["won"], "game_over": True}
    if not word.isalpha() or len(word) != m.word_length:
        return {"error": f"a guess is a {m.word_length}-letter word; this one cost no turn", "game_over": False}
    marks = feedback(word, m.secret or "")
    s["guesses"].append(word)
    s["feedback"].append(marks)
    s["won"] = marks == "G" * m.word_length
    s["over"] = s["won"] or len(s["guesses"]) >= m.max_turns
    ctx.step_reward(marks.count("G") / m.word_length, terminated=s["over"])
    left = m.max_turns - len(s["guesses"])
    return {"guess": word, "feedback": marks, "won": s["won"], "game_over": s["over"], "turns_left": left}


@tool(context=True)
async def check_word_validity(ctx: Context[Meta], word: str) -> dict[str, Any]:
    """Check whether a word is a valid guess (informational; costs no turn)."""
    return {"word": word, "valid": word.isalpha() and len(word) == ctx.task.meta.word_length}


@tool(context=True)
async def get_game_state(ctx: Context[Meta]) -> dict[str, Any]:
    """The guesses so far, their feedback, and whether the game is over."""
    s = ctx.state
    left = ctx.task.meta.max_turns - len(s["guesses"])
    return {
        "guesses": s["guesses"],
        "feedback": s["feedback"],
        "won": s["won"],
        "game_over": s["over"],
        "turns_left": left,
    }


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """1.0 for a win within the turns; the guesses and per-guess step rewards in the info."""
    s = rollout.state
    return Verdict(bool(s.get("won")), {"guesses": s.get("guesses", []), "turns": len(s.get("guesses", []))})


def reference(task: Task[Meta]) -> Reference:
    m = task.meta
    target = m.secret or ""
    absent = [c for c in "qxzjvkwyfbghmpdculsnoitrea" if c not in target]
    wrong = ["".join(absent[(i + k) % len(absent)] for k in range(m.word_length)) for i in range(m.max_turns)]
    return Reference(
        right=[call("submit_guess", guess=target), "I found the word."],
        wrong=[*(call("submit_guess", guess=w) for w in wrong), "I am out of guesses."],
    )


ENVIRONMENT = Environment(
    name="wordle",
    meta=Meta,
    seed=seed,
    tools=[submit_guess, check_word_validity, get_game_state],
    verify=verify,
    reference=reference,
    accepts=["wordle"],
    steps=True,
)
