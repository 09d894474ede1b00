"""instruction_following: IFEval-style verifiable instructions; the reward is the share followed, or all-or-nothing.

Each of the row's ``instruction_id_list`` (any of the 25 IFEval types: runtime checks in
``ifeval.py``) is checked on the reply with its ``kwargs``; every verdict is in the verifier info
(``followed``). ``grading_mode`` ``binary`` (default) scores 1.0 iff all are followed, ``fraction``
the share followed. The checks run in the verifier's off-loop process (language detection is CPU
work). Rows of NeMo Gym's ``instruction_following`` resources server run unchanged, with the fields
at the top level or under ``verifier_metadata``; an instruction outside the IFEval set (NeMo Gym
also has others) fails the row as ``invalid_input`` naming it.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from functions.instruction_following import ifeval
from runtime.sdk import Environment, Reference, Rollout, Task, Verdict, offload

Grading = Literal["binary", "fraction"]


class Meta(msgspec.Struct, frozen=True):
    instruction_id_list: list[str] | None = None
    kwargs: list[dict[str, Any] | None] | None = None
    prompt: str | None = None
    grading_mode: Grading | None = None
    verifier_metadata: dict[str, Any] | None = None
    reference_response: str | None = None
    """A response that follows every instruction (what the simulated policy plays at accuracy 1)."""

    def _field(self, name: str) -> Any:
        nested = (self.verifier_metadata or {}).get(name)
        return getattr(self, name) if getattr(self, name) is not None else nested

    @property
    def instructions(self) -> list[str]:
        return list(self._field("instruction_id_list") or [])

    @property
    def arguments(self) -> list[dict[str, Any]]:
        raw = self._field("kwargs") or [None] * len(self.instructions)
        return [ifeval.arguments(i, k) for i, k in zip(self.instructions, raw, strict=True)]

    @property
    def grading(self) -> Grading:
        return self._field("grading_mode") or "binary"

    def __post_init__(self) -> None:
        if not self.instructions:
            raise ValueError("the task row has no `instruction_id_list` (at the top level or in `verifier_metadata`)")
        raw = self._field("kwargs")
        if raw is not None and len(raw) != len(self.instructions):
            raise ValueError(f"`kwargs` has {len(raw)} entries for {len(self.instructions)} instructions")
        if self.grading not in ("binary", "fraction"):
            raise ValueError(f"`grading_mode` {self.grading!r} is not 'binary' or 'fraction'")
        self.arguments  # noqa: B018  # validates every instruction and its kwargs


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """All followed (binary) or the share followed (fraction); each instruction's verdict in the info."""
    m = task.meta
    followed = await offload(ifeval.check_all, rollout.text, m.instructions, m.arguments, timeout_s=20.0)
    share = sum(followed) / len(followed)
    reward = share if m.grading == "fraction" else float(all(followed))
    return Verdict(reward, {"followed": dict(zip(m.instructions, followed, strict=True)), "share_followed": share})


def reference(task: Task[Meta]) -> Reference:
    if task.meta.reference_response is None:
        raise ValueError("the row gives no reference_response")
    return Reference(right=task.meta.reference_response, wrong="no")


ENVIRONMENT = Environment(
    name="instruction_following", meta=Meta, verify=verify, reference=reference, accepts=["instruction_following"]
)
