"""Responses items <-> Chat Completions messages, at the HTTP edge only.

The session keeps OpenAI Responses-style items; a server that speaks only Chat Completions gets
the conversation translated here, and its answer translated back. Nothing else lives here.
"""

from __future__ import annotations

import json
from typing import Any

# Request fields that mean the same in both APIs and pass through unchanged.
_SHARED_PARAMS = (
    "temperature",
    "top_p",
    "tool_choice",
    "parallel_tool_calls",
    "seed",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "top_k",
    "min_p",
    "repetition_penalty",
    "logprobs",
    "top_logprobs",
    "user",
)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def tool_to_chat(tool: dict[str, Any]) -> dict[str, Any]:
    """Flat Responses function tool -> nested Chat tool; anything else passes through."""
    if tool.get("type") != "function" or "function" in tool:
        return tool
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": fn}


def tool_to_responses(tool: dict[str, Any]) -> dict[str, Any]:
    """Nested Chat tool -> flat Responses function tool."""
    if tool.get("type") != "function" or "function" not in tool:
        return tool
    return {"type": "function", **tool["function"]}


def items_to_messages(items: list[dict[str, Any]], instructions: str | None = None) -> list[dict[str, Any]]:
    """Responses input items -> Chat messages (consecutive function calls join one assistant message)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    pending_reasoning: str | None = None
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            msg: dict[str, Any] = {"role": item.get("role", "user"), "content": _text(item.get("content"))}
            if msg["role"] == "assistant" and pending_reasoning:
                msg["reasoning"] = pending_reasoning
                pending_reasoning = None
            messages.append(msg)
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or item.get("id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant" and (last.get("tool_calls") or not last.get("content")):
                last.setdefault("tool_calls", []).append(call)
            else:
                msg = {"role": "assistant", "content": None, "tool_calls": [call]}
                if pending_reasoning:
                    msg["reasoning"] = pending_reasoning
                    pending_reasoning = None
                messages.append(msg)
        elif kind == "function_call_output":
            output = item.get("output", "")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": output if isinstance(output, str) else json.dumps(output),
                }
            )
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            pending_reasoning = "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
    return messages


def request_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses create body -> a Chat Completions body."""
    raw_input = body.get("input", [])
    items = [{"type": "message", "role": "user", "content": raw_input}] if isinstance(raw_input, str) else raw_input
    chat: dict[str, Any] = {
        "model": body.get("model"),
        "messages": items_to_messages(items, body.get("instructions")),
    }
    if body.get("tools"):
        chat["tools"] = [tool_to_chat(t) for t in body["tools"]]
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    for key in _SHARED_PARAMS:
        if key in body:
            chat[key] = body[key]
    for key, value in body.items():  # vLLM extensions (return_token_ids, chat_template_kwargs, ...)
        if key not in chat and key not in _RESPONSES_ONLY:
            chat[key] = value
    return chat


_RESPONSES_ONLY = {
    "input",
    "instructions",
    "tools",
    "max_output_tokens",
    "store",
    "previous_response_id",
    "reasoning",
    "text",
    "include",
    "truncation",
    "metadata",
    "background",
}


def chat_to_output(resp: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, int], str | None]:
    """A Chat Completions response -> (Responses output items, usage, finish reason)."""
    choice = (resp.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if reasoning:
        items.append({"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": reasoning}]})
    if message.get("content"):
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": message["content"], "annotations": []}],
            }
        )
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "call_id": call.get("id"),
                "name": fn.get("name"),
                "arguments": fn.get("arguments", ""),
                "status": "completed",
            }
        )
    usage = resp.get("usage") or {}
    return (
        items,
        {
            "input_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens") or 0),
        },
        choice.get("finish_reason"),
    )
