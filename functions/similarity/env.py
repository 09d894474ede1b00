"""similarity: a continuous score in [0, 1] for a free-form answer against the row's reference.

``metric`` (per row, default ``chrf``): ``chrf`` is sacrebleu's sentence chrF (character n-gram
F-score) / 100; ``edit`` is rapidfuzz's normalized Indel similarity; ``token_set`` is rapidfuzz's
token-set ratio (word order ignored). Both texts are Unicode-NFC normalized and trimmed. The
reference is ``reference``, ``expected_answer`` or, for translation rows, ``translation``; rows of
NeMo Gym's ``wmt_translation`` resources server (``text``, ``translation``, languages) run unchanged
with the sentence chrF it uses as its reward.
"""

from __future__ import annotations

import unicodedata
from typing import Literal

import msgspec
from rapidfuzz import fuzz
from sacrebleu.metrics import CHRF

from runtime.sdk import Environment, Reference, Rollout, Task, Verdict

_CHRF = CHRF()


class Meta(msgspec.Struct, frozen=True):
    reference: str | None = None
    expected_answer: str | None = None
    translation: str | None = None
    metric: Literal["chrf", "edit", "token_set"] = "chrf"

    def __post_init__(self) -> None:
        if self.gold is None:
            raise ValueError("the task row has none of `reference`, `expected_answer`, `translation`")

    @property
    def gold(self) -> str | None:
        return next((g for g in (self.reference, self.expected_answer, self.translation) if g is not None), None)


def similarity(metric: str, answer: str, gold: str) -> float:
    a, g = (unicodedata.normalize("NFC", t).strip() for t in (answer, gold))
    if not a:
        return 0.0
    if metric == "chrf":
        return _CHRF.sentence_score(a, [g]).score / 100
    scorer = fuzz.ratio if metric == "edit" else fuzz.token_set_ratio
    return scorer(a, g) / 100


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """The metric's similarity of the reply to the reference."""
    gold = task.meta.gold or ""
    score = similarity(task.meta.metric, rollout.text, gold)
    return Verdict(score, {"metric": task.meta.metric, "score": round(score, 6)})


def reference(task: Task[Meta]) -> Reference:
    gold = task.meta.gold or ""
    wrong = next(c for c in "#~^|§¤" if c not in gold) * 3  # shares no character, so no n-gram, with the reference
    return Reference(right=gold, wrong=wrong)


ENVIRONMENT = Environment(name="similarity", meta=Meta, verify=verify, reference=reference, accepts=["wmt_translation"])
