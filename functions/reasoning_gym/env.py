"""reasoning_gym: reasoning-gym's procedural tasks, scored by the package's own scorer for each generator.

Rows come from ``gymbus tasks reasoning-gym SPEC`` (generate.py) or from NeMo Gym's reasoning_gym
resources server's data, unchanged: ``question``, ``answer``, ``metadata`` (with ``source_dataset``,
the generator's name). The reward is the generator's ``score_answer`` of the reply (0..1; some
generators give partial credit), run off the worker's loop. The answer is read as NeMo Gym's server
reads it: the last ``<answer>`` tag, else ``\\boxed{}``, else the whole reply. The verifier reports
the generator as the rollout's ``group``, so the profile has a table per generator.
"""

from __future__ import annotations

from typing import Any

import msgspec

from runtime.sdk import Environment, InvalidInput, Reference, Rollout, Task, Verdict, offload


class Generator(msgspec.Struct, frozen=True, kw_only=True):
    """Where a row written by gymbus came from (see generate.py)."""

    name: str
    seed: int
    size: int
    index: int
    config: dict[str, Any] = {}
    level: int | None = None
    rebuild: bool = False


class Meta(msgspec.Struct, frozen=True, kw_only=True):
    question: str
    answer: str | None
    metadata: dict[str, Any]
    """The entry's metadata; ``source_dataset`` names the generator (reasoning-gym writes it in every entry)."""
    generator: Generator | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.metadata.get("source_dataset"), str):
            raise ValueError("`metadata.source_dataset` is missing: it names the generator whose scorer scores the row")

    @property
    def entry(self) -> dict[str, Any]:
        return {"question": self.question, "answer": self.answer, "metadata": self.metadata}


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """The generator's own score of the reply."""
    from functions.reasoning_gym import scoring

    generator = msgspec.to_builtins(task.meta.generator) if task.meta.generator else None
    name = task.meta.metadata["source_dataset"]
    try:
        out = await offload(scoring.score, rollout.text, task.meta.entry, generator, timeout_s=120.0)
    except KeyError as exc:
        raise InvalidInput(f"environment 'reasoning_gym': reasoning-gym has no generator {name!r} ({exc})") from None
    return Verdict(out.pop("score"), {**out, "group": name})


def reference(task: Task[Meta]) -> Reference:
    """The entry's own answer in ``<answer>`` tags; wrong: a reply with no answer in it."""
    return Reference(right=f"<answer>{task.meta.answer}</answer>", wrong="I cannot tell.")


ENVIRONMENT = Environment(
    name="reasoning_gym",
    meta=Meta,
    verify=verify,
    reference=reference,
    accepts=["reasoning_gym"],
)
