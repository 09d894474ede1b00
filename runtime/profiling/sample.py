"""What profiling keeps of one Result (`Sample`), and the rule that keeps one per rollout (`keep`)."""

from __future__ import annotations

import sys
from typing import Any

import msgspec

from broker.schemas import Result, Timings, Usage
from runtime.profiling.components import components_of

NO_COMPONENTS: dict[str, float] = {}
"""The components of every Sample whose verifier reports none (one shared dict; never written to)."""


class Sample(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What profiling keeps of one Result: small enough to hold a large run in memory (untracked by the
    garbage collector: it holds no cycles, and a million of them made every full collection scan them)."""

    session_id: str
    task_index: int
    rollout_index: int
    attempt: int = 0
    reward: float | None = None
    failure_kind: str | None = None
    answer: str | None = None
    """The verifier's ``extracted_answer``, as text."""
    reports_answer: bool = False
    """Whether the verifier reports ``extracted_answer`` at all (majority@k needs it)."""
    timings: Timings = msgspec.field(default_factory=Timings)
    usage: Usage = msgspec.field(default_factory=Usage)
    env: str = ""
    """The environment that scored it (a run may mix them)."""
    components: dict[str, float] = {}
    """The reward's components, when the verifier reports them (``components`` in its info)."""
    group: str = ""
    """What the verifier groups the task under (``group`` in its info: reasoning_gym's generator)."""

    @classmethod
    def of(cls, r: Result) -> Sample:
        # the same few strings recur over a run's rollouts (its environment, a task's answers, failure
        # kinds): each Sample shares one copy, and one empty components dict, instead of its own
        answer = _answer(r.verifier)
        return cls(
            env=sys.intern(r.env),
            group=sys.intern(str(r.verifier.get("group") or "")),
            components=components_of(r.verifier) or NO_COMPONENTS,
            session_id=r.session_id,
            task_index=r.task_index,
            rollout_index=r.rollout_index,
            attempt=r.attempt,
            reward=r.reward,
            failure_kind=r.failure_kind and sys.intern(r.failure_kind),
            answer=answer and sys.intern(answer),
            reports_answer="extracted_answer" in r.verifier,
            timings=r.timings,
            usage=r.usage,
        )


def _answer(verifier: dict[str, Any]) -> str | None:
    a = verifier.get("extracted_answer")
    return None if a is None else str(a)


def keep(samples: dict[str, Sample], s: Sample) -> bool:
    """Fold a Sample into one-per-rollout: a later attempt replaces, a repeat of the same attempt is ignored.

    This is the rule ``gymbus collect`` applies to the results stream, so its ``rollouts.jsonl``
    and the live profiler hold the same Samples. True if ``samples`` changed.
    """
    old = samples.get(s.session_id)
    if old is not None and s.attempt <= old.attempt:
        return False
    samples[s.session_id] = s
    return True
