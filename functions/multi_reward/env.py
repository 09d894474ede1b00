"""multi_reward: a reward with several components, each reported, summed with weights.

Two kinds of rows. A tool-call row (``expected_call``, NeMo Gym's ``example_tool_call_multireward``)
scores ``correctness`` (a call with the expected name and arguments), ``schema_valid`` (the call's
arguments are a JSON object with every required parameter of the tool) and ``format`` (exactly one
call and no text). A text row (``expected_answer``) scores ``correctness`` (the last ``\\boxed{}``
holds it), ``format`` (there is a box) and ``length`` (at most ``max_words`` words, default 50).
Each component is 0 or 1; the reward is their sum weighted by the row's ``weights`` (default 1
each, so 0 to 3). The components are in the verifier info under ``components`` (the profile
reports each) and at its top level, as NeMo Gym reports them.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from runtime.answers import last_boxed, normalize
from runtime.sdk import Environment, Reference, Rollout, Task, Verdict, call


class Meta(msgspec.Struct, frozen=True):
    expected_call: dict[str, Any] | None = None
    expected_answer: str | None = None
    max_words: int = 50
    weights: dict[str, float] = {}

    def __post_init__(self) -> None:
        if (self.expected_call is None) == (self.expected_answer is None):
            raise ValueError("give exactly one of `expected_call` and `expected_answer`")


async def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return json.dumps({"city": city, "forecast": "sunny", "temperature_c": 10 + len(city)})


def _args(raw: Any) -> dict[str, Any] | None:
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def call_components(task: Task[Meta], rollout: Rollout) -> dict[str, float]:
    want = task.meta.expected_call or {}
    calls = [i for i in rollout.output if i.get("type") == "function_call"]
    parsed = [(c.get("name"), _args(c.get("arguments"))) for c in calls]
    tools = {t.get("name"): t for t in task.params.get("tools") or []}
    required = (tools.get(want.get("name")) or {}).get("parameters", {}).get("required", [])
    right = any(n == want.get("name") and a is not None and a == _args(want.get("arguments")) for n, a in parsed)
    valid = any(a is not None and all(k in a for k in required) for _, a in parsed)
    return {
        "correctness": float(right),
        "schema_valid": float(valid),
        "format": float(len(calls) == 1 and not rollout.text),
    }


def text_components(task: Task[Meta], rollout: Rollout) -> dict[str, float]:
    answer = last_boxed(rollout.text)
    right = answer is not None and normalize(answer) == normalize(task.meta.expected_answer or "")
    words = len(rollout.text.split())
    return {
        "correctness": float(right),
        "format": float(answer is not None),
        "length": float(0 < words <= task.meta.max_words),
    }


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """The weighted sum of the components; each reported."""
    parts = call_components(task, rollout) if task.meta.expected_call else text_components(task, rollout)
    reward = sum(v * task.meta.weights.get(k, 1.0) for k, v in parts.items())
    return Verdict(reward, {"components": parts, **parts})


def reference(task: Task[Meta]) -> Reference:
    if task.meta.expected_call is not None:
        want = task.meta.expected_call
        return Reference(right=call(str(want["name"]), **(_args(want.get("arguments")) or {})), wrong="It is sunny.")
    ramble = "I would rather not commit to a single answer here, " * 12
    return Reference(right=f"\\boxed{{{task.meta.expected_answer}}}", wrong=ramble)


ENVIRONMENT = Environment(
    name="multi_reward",
    meta=Meta,
    tools=[get_weather],
    verify=verify,
    reference=reference,
    reward_range=(0.0, 3.0),
    agent="one_shot",
    accepts=["example_tool_call_multireward"],
)
