"""function_calling: the model's tool calls (names and arguments) compared with the row's expected calls.

The calls scored are those of the model's first turn that made any. A call matches an expected one
when the names are equal and every expected argument is present with an equal value (extra arguments
are allowed). Calls are matched as an unordered multiset (a maximum matching), or in order when the
row says ``ordered: true``. The reward is matched / max(expected, made): partial credit per call, or
all-or-nothing with ``partial_credit: false``. Row shapes accepted unchanged:

- ``expected_calls`` / ``expected_answers`` (NeMo Gym ``xlam_fc``): ``[{"name", "arguments"}]``,
  arguments an object or a JSON string; ``expected_answers`` rows are all-or-nothing by default, as there;
- ``expected_action`` (NeMo Gym ``single_step_tool_use_with_argument_comparison``): a
  ``function_call``, a ``function_call_batch`` of ``calls``, or a ``message`` (the model should answer
  in text, not call a tool); all-or-nothing by default.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from runtime.sdk import Call, Environment, Reference, Rollout, Task, Verdict, call


class Meta(msgspec.Struct, frozen=True):
    expected_calls: list[dict[str, Any]] | None = None
    expected_answers: list[dict[str, Any]] | None = None
    expected_action: dict[str, Any] | None = None
    ordered: bool = False
    partial_credit: bool | None = None

    def __post_init__(self) -> None:
        if (self.expected_calls, self.expected_answers, self.expected_action) == (None, None, None):
            raise ValueError("the task row has none of `expected_calls`, `expected_answers`, `expected_action`")

    @property
    def expected(self) -> list[tuple[str, dict[str, Any]]] | None:
        """The expected calls as (name, arguments); None when a text message is expected instead."""
        if self.expected_action is not None:
            kind = self.expected_action.get("type", "function_call")
            if kind == "message":
                return None
            calls = self.expected_action.get("calls", []) if kind == "function_call_batch" else [self.expected_action]
        else:
            calls = self.expected_calls if self.expected_calls is not None else self.expected_answers or []
        return [(str(c.get("name")), _arguments(c.get("arguments"))) for c in calls]

    @property
    def partial(self) -> bool:
        return self.partial_credit if self.partial_credit is not None else self.expected_calls is not None


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw or "{}")
        except json.JSONDecodeError:
            return {"__invalid_json__": raw}
    return raw if isinstance(raw, dict) else {}


def made_calls(output: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The function calls of the model's first turn that made any."""
    calls: list[tuple[str, dict[str, Any]]] = []
    for item in output:
        if item.get("type") == "function_call":
            calls.append((str(item.get("name")), _arguments(item.get("arguments"))))
        elif calls and item.get("type") != "reasoning":
            break
    return calls


def _fits(made: tuple[str, dict[str, Any]], want: tuple[str, dict[str, Any]]) -> bool:
    return made[0] == want[0] and all(k in made[1] and made[1][k] == v for k, v in want[1].items())


def matched(made: list[tuple[str, dict[str, Any]]], want: list[tuple[str, dict[str, Any]]], ordered: bool) -> int:
    if ordered:
        return sum(1 for m, w in zip(made, want, strict=False) if _fits(m, w))
    owner: dict[int, int] = {}  # made index -> expected index (augmenting paths: a maximum matching)

    def take(w: int, seen: set[int]) -> bool:
        for m in range(len(made)):
            if m not in seen and _fits(made[m], want[w]):
                seen.add(m)
                if m not in owner or take(owner[m], seen):
                    owner[m] = w
                    return True
        return False

    return sum(take(w, set()) for w in range(len(want)))


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """matched / max(expected, made) (or all-or-nothing); the counts in the info."""
    want, made = task.meta.expected, made_calls(rollout.output)
    if want is None:  # a text answer is expected, no tool call
        return Verdict(not made and bool(rollout.text), {"made": len(made), "expected": "message"})
    n = matched(made, want, task.meta.ordered)
    total = max(len(want), len(made))
    reward = (n / total if total else 1.0) if task.meta.partial else float(n == len(want) == len(made))
    return Verdict(reward, {"matched": n, "expected": len(want), "made": len(made)})


def _off(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    return f"{value}_x" if isinstance(value, str) else None


def reference(task: Task[Meta]) -> Reference:
    want = task.meta.expected
    if want is None:
        tools = task.params.get("tools") or [{"name": "lookup"}]
        return Reference(right="Here is my answer, no tool needed.", wrong=call(str(tools[0].get("name")), query="?"))
    right = [Call(name, args) for name, args in want]
    wrong = [Call(name, {k: _off(v) for k, v in args.items()} or {"unexpected": 1}) for name, args in want]
    wrong = wrong if any(a for _, a in want) else [Call(f"{name}_wrong", {}) for name, _ in want]
    return Reference(right=[right, "Done."], wrong=[wrong, "Done."])


ENVIRONMENT = Environment(
    name="function_calling",
    meta=Meta,
    verify=verify,
    reference=reference,
    agent="one_shot",
    accepts=["xlam_fc", "single_step_tool_use_with_argument_comparison"],
)
