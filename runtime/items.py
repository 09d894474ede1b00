"""Responses items, read the same way everywhere: the text of a content, of a message, of a reasoning
item, and the function calls of a model's output."""

from __future__ import annotations

from typing import Any

from broker.schemas import FunctionCall


def text_of(content: Any) -> str:
    """The text of a Responses or Chat ``content``: a string, or a list of parts whose ``text`` is joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("text") is not None)
    return "" if content is None else str(content)


def message_text(item: dict[str, Any]) -> str:
    """The text of a message item."""
    return text_of(item.get("content"))


def reasoning_text(item: dict[str, Any]) -> str:
    """The text of a reasoning item, whether the server put it in ``content`` or ``summary``."""
    return text_of(item.get("content") or item.get("summary") or [])


def function_calls(items: list[dict[str, Any]]) -> list[FunctionCall]:
    """The ``function_call`` items among ``items``, as wire FunctionCalls."""
    return [
        FunctionCall(
            call_id=str(i.get("call_id") or i.get("id") or ""),
            name=str(i.get("name", "")),
            arguments=str(i.get("arguments", "")),
        )
        for i in items
        if i.get("type") == "function_call"
    ]


def last_user_text(items: str | list[dict[str, Any]]) -> str:
    """The text of the last user message (the whole input when it is a string), stripped."""
    if isinstance(items, str):
        return items.strip()
    for item in reversed(items):
        if item.get("role") == "user" and item.get("type", "message") == "message":
            return message_text(item).strip()
    return ""


MARK = "gymbus"
"""The key under which gymbus marks an item it made or attributes to a model other than the policy (a
user simulator's turn, a simulated tool output, a verifier's feedback, a compaction): ``{"source":
NAME, ...}``. Kept in the transcript, never sent to a model server."""


def mark(item: dict[str, Any], source: str, **details: Any) -> dict[str, Any]:
    """``item`` marked as made by ``source`` (a model's name, ``recorded``, ``verifier``, ...); returned."""
    item[MARK] = {"source": source, **details}
    return item


def source_of(item: dict[str, Any]) -> str | None:
    """Who made the item, when gymbus marked it (None: the task's input, the policy or a tool)."""
    marked = item.get(MARK)
    return marked.get("source") if isinstance(marked, dict) else None
