"""genrm_compare: a generative reward model compares the rollout's reply with the row's reference reply.

The GenRM is the model named ``genrm``, reached through the model tier (usage in the verifier info,
at most ``GYMBUS_FLEET_LIMIT_GENRM`` (8) calls in flight across replicas). It gets the task's
conversation, then the two replies under the custom roles ``response_1`` and ``response_2`` (and the
row's ``principle`` under ``principle``), and answers JSON ``{"score_1", "score_2", "ranking"}``,
ranking 1 (response 1 much better) to 6 (response 2 much better). The swap check asks twice, the
rollout's reply first then second, so position bias cancels: the reward is the mean of the two
preferences for the rollout's reply, each (6 - ranking) / 5 when it is first and (ranking - 1) / 5
when second; a tie across orders scores 0.5. A reply with no such JSON is a ``judge_error``. Rows of
NeMo Gym's ``genrm_compare`` compare the rollouts of one task with each other, which independent
rollouts cannot: a row needs ``reference_response`` here (without one it is ``invalid_input``).
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from runtime.errors import JudgeError
from runtime.sdk import Environment, Model, Reference, Rollout, Task, Verdict

GENRM = Model("genrm", fleet_limit=8, params={"temperature": 0.0})
_JSON = re.compile(r"\{[^{}]*\}")


class Meta(msgspec.Struct, frozen=True):
    reference_response: str
    principle: str | None = None
    swap_check: bool = True


def parse(text: str) -> dict[str, float]:
    """The GenRM's scores; JudgeError when its reply holds no JSON object with a ranking 1-6."""
    for raw in reversed(_JSON.findall(text)):
        try:
            scores = json.loads(raw)
            ranking = float(scores["ranking"])
        except (ValueError, KeyError, TypeError):
            continue
        if 1 <= ranking <= 6:
            return {k: float(v) for k, v in scores.items() if isinstance(v, (int, float))}
    raise JudgeError(f"GenRM {GENRM.name!r} gave no JSON with a ranking from 1 to 6: {text[-200:]!r}")


def _request(task: Task[Meta], first: str, second: str) -> list[dict[str, Any]]:
    items = [*task.input, {"role": "response_1", "content": first}, {"role": "response_2", "content": second}]
    return items + ([{"role": "principle", "content": task.meta.principle}] if task.meta.principle else [])


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """The mean preference for the rollout's reply over the reference, over both orders."""
    reply, ref = rollout.text.strip(), task.meta.reference_response
    if not reply:
        return Verdict(0.0, {"reason": "the model gave no reply"})
    first = parse(await GENRM.ask(_request(task, reply, ref)))
    prefs = [(6 - first["ranking"]) / 5]
    info: dict[str, Any] = {"comparisons": [first]}
    if task.meta.swap_check:
        second = parse(await GENRM.ask(_request(task, ref, reply)))
        prefs.append((second["ranking"] - 1) / 5)
        info.update(comparisons=[first, second], position_bias=round(prefs[0] - prefs[1], 6))
    return Verdict(sum(prefs) / len(prefs), info)


def reference(task: Task[Meta]) -> Reference:
    good = "A careful, complete and correct reply to the request."
    bad = "Not sure."

    def genrm(correct: bool, items: list[dict[str, Any]]) -> str:
        mine_first = any(
            i.get("role") == "response_1" and i.get("content") == (good if correct else bad) for i in items
        )
        better = correct == mine_first  # response 1 is better when it is the good reply
        return json.dumps({"score_1": 5 if better else 1, "score_2": 1 if better else 5, "ranking": 1 if better else 6})

    return Reference(right=good, wrong=bad, judge=genrm)


ENVIRONMENT = Environment(
    name="genrm_compare",
    meta=Meta,
    verify=verify,
    reference=reference,
    models=[GENRM],
    accepts=["genrm_compare", "genrm"],
)
