"""NeMo Gym's shapes: the row a resources server is sent, the response it verifies, what it answers."""

from __future__ import annotations

import json
from typing import Any

from runtime import pins
from runtime.items import message_text, reasoning_text
from runtime.sdk import EnvLost, Task, Verdict, VerifierError

SESSION_LOST = {"session_lost", "session_expired"}
"""NeMo Gym failure kinds that say the server lost the rollout's state."""


def row_of(task: Task[Any]) -> dict[str, Any]:
    """The task row as NeMo Gym's agent sends it to ``seed_session`` and ``verify``."""
    return {"responses_create_params": {**task.params, "input": task.input}, **dict(task.meta)}


def response_of(task: Task[Any], output: list[dict[str, Any]]) -> dict[str, Any]:
    """The rollout's output items as the NeMo Gym response object ``verify`` reads."""
    return {
        "id": f"resp_{task.index}_{task.rollout_index}",
        "created_at": 0,
        "model": str(task.params.get("model") or "policy"),
        "object": "response",
        "output": [item for n, i in enumerate(output) if (item := _item(n, i)) is not None],
        "parallel_tool_calls": bool(task.params.get("parallel_tool_calls", True)),
        "tool_choice": task.params.get("tool_choice", "auto"),
        "tools": task.params.get("tools", []),
    }


def _item(n: int, item: dict[str, Any]) -> dict[str, Any] | None:
    kind, ident = item.get("type"), str(item.get("id") or f"item_{n}")
    if kind == "message":
        text = {"type": "output_text", "text": message_text(item), "annotations": []}
        return {"type": "message", "id": ident, "role": "assistant", "status": "completed", "content": [text]}
    if kind == "function_call":
        return {k: item[k] for k in ("type", "call_id", "name", "arguments") if k in item} | {"id": ident}
    if kind == "function_call_output":
        return {"type": kind, "call_id": item.get("call_id", ""), "output": item.get("output", "")}
    if kind == "reasoning":
        return {"type": kind, "id": ident, "summary": [{"type": "summary_text", "text": reasoning_text(item)}]}
    return None


def keep_cookies(pin: dict[str, Any], cookies: dict[str, str]) -> None:
    """Keep the session cookies an instance set, after checking it is still the instance the rollout
    was pinned to: NeMo Gym names its session cookie after the server's config name, which carries a
    nonce when the bridge started it, so an instance started again answers under another name."""
    for name, value in cookies.items():
        if "___" not in name:
            pin["cookies"][name] = value
            continue
        expected = pin.get("name")
        seen = pin.setdefault("answers_as", name)
        if (expected is not None and not name.endswith(f"___{expected}")) or name != seen:
            raise EnvLost(
                f"NeMo Gym server {pin['server']!r} at {pin['url']} now answers as {name.split('___', 1)[1]!r}, "
                f"not as the instance the rollout was pinned to ({expected or seen.split('___', 1)[1]!r}): it was "
                "restarted and the rollout's state is gone"
            )
        pin["cookies"][name] = value


def verdict(key: str, answer: Any, sent: set[str]) -> Verdict:
    """The reward of a verify answer, and what it reported besides the request it echoes.

    A sample the server masks (its reward is no measurement: ``mask_sample``) is a failure: ``env_lost``
    when the server says it lost the session, else ``verifier_error`` with its kind and reason."""
    if not isinstance(answer, dict) or not isinstance(answer.get("reward"), (int, float)):
        raise VerifierError(f"NeMo Gym server {key!r} verify answered no reward: {str(answer)[:200]}")
    kind, reason = answer.get("failure_kind"), answer.get("failure_reason")
    if answer.get("mask_sample"):
        message = f"NeMo Gym server {key!r} masked the sample ({kind}: {reason})"
        raise EnvLost(message) if kind in SESSION_LOST else VerifierError(message)
    info = {k: v for k, v in answer.items() if k not in sent and k not in ("reward", "mask_sample")}
    info = {k: v for k, v in info.items() if v is not None}
    return Verdict(float(answer["reward"]), {**info, "resources_server": key})


def detail(answer: pins.Answer) -> str:
    """What a refusal says, in one line: the fields a 422 names, else the body's start."""
    try:
        body = answer.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return answer.text[:300]
    errors = body.get("detail") if isinstance(body, dict) else None
    if isinstance(errors, list):
        return "; ".join(
            f"field `{'.'.join(str(p) for p in e.get('loc', [])[1:])}`: {e.get('msg')}"
            for e in errors
            if isinstance(e, dict)
        )
    return json.dumps(body)[:300]
