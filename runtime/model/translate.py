"""Responses items <-> Chat Completions messages, at the HTTP edge only.

The session keeps OpenAI Responses-style items; a server that speaks only Chat Completions gets
the conversation translated here, and its answer translated back. Both directions:

    Responses                                  Chat Completions
    input: str | items, instructions       <-> messages (system first)
    {"type":"message", role, content}      <-> {role, content}
    {"type":"function_call", call_id, ...} <-> assistant message tool_calls[] (consecutive calls join one)
    {"type":"function_call_output", ...}   <-> {"role":"tool", tool_call_id, content}
    {"type":"reasoning", summary[]}        <-> assistant message `reasoning` (or <think>…</think> in content)
    flat function tool, tool_choice        <-> nested {"type":"function","function":{...}}
    max_output_tokens, text.format         <-> max_completion_tokens, response_format
    usage input/output_tokens (+details)   <-> prompt/completion_tokens (+details)

Reasoning is handled in exactly one layer, chosen per deployment (`ReasoningMode`): ``server``
takes the server's parsed ``reasoning`` field (vLLM ``--reasoning-parser``) and never looks into
the text; ``think_tags`` parses ``<think>…</think>`` out of the text here, and a server that sent a
parsed ``reasoning`` field too is an error (parsing twice corrupts the output).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from runtime.items import MARK, reasoning_text, text_of

ReasoningMode = Literal["server", "think_tags"]

TRAINING_KEYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
"""Token-level keys gymbus attaches to output items; never sent back to a server."""
_GYMBUS_KEYS = (*TRAINING_KEYS, MARK)
"""Every key gymbus adds to an item (token ids, its mark: runtime.items.MARK); stripped before sending."""

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# Request fields that mean the same in both APIs and pass through unchanged.
_SHARED_PARAMS = (
    "model",
    "temperature",
    "top_p",
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
    "metadata",
)
# Responses-only request fields: translated (or dropped) rather than passed through.
_RESPONSES_ONLY = frozenset(
    {
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "max_output_tokens",
        "store",
        "previous_response_id",
        "reasoning",
        "text",
        "include",
        "truncation",
        "background",
        "stream",
    }
)


class ReasoningConflict(ValueError):
    """The server parsed reasoning although the client was configured to parse it (or the reverse)."""


# ---- pieces ------------------------------------------------------------------------------------


def tool_to_chat(tool: dict[str, Any]) -> dict[str, Any]:
    """Flat Responses function tool -> nested Chat tool; anything else passes through."""
    if tool.get("type") != "function" or "function" in tool:
        return tool
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": fn}


def tool_choice_to_chat(choice: Any) -> Any:
    """``{"type":"function","name":N}`` -> ``{"type":"function","function":{"name":N}}``; strings pass."""
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def format_to_chat(fmt: dict[str, Any]) -> dict[str, Any]:
    """Responses ``text.format`` -> Chat ``response_format``."""
    if fmt.get("type") != "json_schema":
        return {"type": fmt.get("type", "text")}
    schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}


def reasoning_item(text: str) -> dict[str, Any]:
    """A Responses reasoning item (NeMo Gym's shape: the text in ``summary[].summary_text``)."""
    return {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}


def message_item(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def split_think(text: str) -> tuple[str | None, str]:
    """``<think>R</think>T`` -> (R, T). A closing tag without an opening one (the template opened it)
    also counts; an unclosed block (cut by the length limit) is all reasoning."""
    head, sep, tail = text.partition(THINK_CLOSE)
    if sep:
        start = head.find(THINK_OPEN)
        return (head[start + len(THINK_OPEN) :] if start >= 0 else head), tail
    start = text.find(THINK_OPEN)
    if start >= 0:
        return text[start + len(THINK_OPEN) :], text[:start]
    return None, text


def strip_training(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items without gymbus's token-level keys and marks (servers may reject unknown fields)."""
    return [{k: v for k, v in i.items() if k not in _GYMBUS_KEYS} if _has_training(i) else i for i in items]


def responses_input(items: list[dict[str, Any]], reasoning: ReasoningMode = "server") -> list[dict[str, Any]]:
    """The conversation as a ``/v1/responses`` input: without token-level keys, and in ``think_tags``
    mode with each thought back inside the assistant text as ``<think>…</think>``, as the model wrote
    it (a reasoning item reaches the model only if its chat template renders a reasoning field; the
    Chat path does the same in `items_to_messages`)."""
    items = strip_training(items)
    if reasoning != "think_tags" or not any(i.get("type") == "reasoning" for i in items):
        return items
    out: list[dict[str, Any]] = []
    thought: str | None = None
    for item in items:
        if item.get("type") == "reasoning":
            thought = (thought or "") + reasoning_text(item)
            continue
        if thought is not None:
            said = f"{THINK_OPEN}{thought}{THINK_CLOSE}"
            if item.get("type", "message") == "message" and item.get("role") == "assistant":
                item = message_item(said + text_of(item.get("content")))
            else:
                out.append(message_item(said))
            thought = None
        out.append(item)
    if thought is not None:
        out.append(message_item(f"{THINK_OPEN}{thought}{THINK_CLOSE}"))
    return out


def _has_training(item: dict[str, Any]) -> bool:
    return not item.keys().isdisjoint(_GYMBUS_KEYS)


# ---- Responses -> Chat (requests) ----------------------------------------------------------------


def items_to_messages(
    items: list[dict[str, Any]], instructions: str | None = None, reasoning: ReasoningMode = "server"
) -> list[dict[str, Any]]:
    """Responses input items -> Chat messages (consecutive function calls join one assistant message).

    A reasoning item goes with the assistant message that follows it: as its ``reasoning`` field in
    ``server`` mode, or back inside the text as ``<think>…</think>`` in ``think_tags`` mode, so the
    model sees its earlier turn exactly as it wrote it.
    """
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    thought: str | None = None
    for item in items:
        kind = item.get("type", "message")
        if kind == "reasoning":
            thought = (thought or "") + reasoning_text(item)
        elif kind == "message":
            msg = {"role": item.get("role", "user"), "content": text_of(item.get("content"))}
            if msg["role"] == "assistant":
                _attach_thought(msg, thought, reasoning)
                thought = None
            messages.append(msg)
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or item.get("id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant" and thought is None:
                last.setdefault("tool_calls", []).append(call)
            else:
                msg = {"role": "assistant", "content": None, "tool_calls": [call]}
                _attach_thought(msg, thought, reasoning)
                thought = None
                messages.append(msg)
        elif kind == "function_call_output":
            output = item.get("output", "")
            content = output if isinstance(output, str) else json.dumps(output)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": content})
    return messages


def _attach_thought(msg: dict[str, Any], thought: str | None, mode: ReasoningMode) -> None:
    if thought is None:
        return
    if mode == "think_tags":
        msg["content"] = f"{THINK_OPEN}{thought}{THINK_CLOSE}{msg.get('content') or ''}"
    else:
        msg["reasoning"] = thought


def request_to_chat(body: dict[str, Any], reasoning: ReasoningMode = "server") -> dict[str, Any]:
    """A Responses create body -> a Chat Completions body. vLLM extensions (``return_token_ids``,
    ``chat_template_kwargs``, ``top_k`` …) pass through; Responses-only state fields are dropped."""
    raw = body.get("input", [])
    items = [{"type": "message", "role": "user", "content": raw}] if isinstance(raw, str) else strip_training(raw)
    chat: dict[str, Any] = {"messages": items_to_messages(items, body.get("instructions"), reasoning)}
    if body.get("tools"):
        chat["tools"] = [tool_to_chat(t) for t in body["tools"]]
    if "tool_choice" in body:
        chat["tool_choice"] = tool_choice_to_chat(body["tool_choice"])
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    fmt = (body.get("text") or {}).get("format")
    if fmt:
        chat["response_format"] = format_to_chat(fmt)
    effort = (body.get("reasoning") or {}).get("effort")
    if effort:
        chat["reasoning_effort"] = effort
    for key, value in body.items():
        if key not in chat and key not in _RESPONSES_ONLY:
            chat[key] = value
    return chat


# ---- Chat -> Responses (requests, for completeness and round trips) ------------------------------


def messages_to_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages -> Responses input items (the inverse of `items_to_messages` in ``server`` mode)."""
    items: list[dict[str, Any]] = []
    for msg in messages:
        role = msg.get("role", "user")
        if role == "tool":
            items.append(
                {"type": "function_call_output", "call_id": msg.get("tool_call_id"), "output": text_of(msg["content"])}
            )
            continue
        thought = msg.get("reasoning") or msg.get("reasoning_content")
        if role == "assistant" and thought:
            items.append(reasoning_item(thought))
        if msg.get("content") is not None or not msg.get("tool_calls"):
            items.append({"type": "message", "role": role, "content": text_of(msg.get("content"))})
        for call in msg.get("tool_calls") or []:
            items.append(_call_item(call))
    return items


def _call_item(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function") or {}
    return {
        "type": "function_call",
        "call_id": call.get("id"),
        "name": fn.get("name"),
        "arguments": fn.get("arguments", ""),
        "status": "completed",
    }


# ---- answers -------------------------------------------------------------------------------------


@dataclass
class Reply:
    """One model answer in Responses terms."""

    items: list[dict[str, Any]]
    usage: dict[str, Any]
    finish_reason: str | None


def chat_to_output(resp: dict[str, Any], reasoning: ReasoningMode = "server") -> Reply:
    """A Chat Completions response -> Responses output items, usage and finish reason."""
    choice = (resp.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    thought = message.get("reasoning") or message.get("reasoning_content")
    text = message.get("content")
    if reasoning == "think_tags":
        if thought:
            raise ReasoningConflict(
                "the server sent a parsed `reasoning` field but this deployment parses <think> tags in the "
                "client (reasoning: think_tags); run the server without --reasoning-parser or set reasoning: server"
            )
        thought, text = split_think(text) if text else (None, text)
    items = [reasoning_item(thought)] if thought else []
    if text:
        items.append(message_item(text))
    items.extend(_call_item(call) for call in message.get("tool_calls") or [])
    return Reply(items, usage_from_chat(resp.get("usage") or {}), choice.get("finish_reason"))


def responses_output(resp: dict[str, Any], reasoning: ReasoningMode = "server") -> Reply:
    """A Responses API response -> its output items (reasoning handled by the one configured layer)."""
    items = [dict(i) for i in resp.get("output") or []]
    if reasoning == "think_tags":
        if any(i.get("type") == "reasoning" for i in items):
            raise ReasoningConflict(
                "the server returned reasoning items but this deployment parses <think> tags in the client "
                "(reasoning: think_tags); run the server without --reasoning-parser or set reasoning: server"
            )
        items = [part for i in items for part in _split_message(i)]
    status = resp.get("status")
    incomplete = (resp.get("incomplete_details") or {}).get("reason")
    return Reply(items, dict(resp.get("usage") or {}), incomplete or status)


def _split_message(item: dict[str, Any]) -> list[dict[str, Any]]:
    if item.get("type") != "message":
        return [item]
    thought, text = split_think(text_of(item.get("content")))
    if thought is None:
        return [item]
    return [reasoning_item(thought), *([message_item(text)] if text else [])]


def usage_from_chat(usage: dict[str, Any]) -> dict[str, Any]:
    """Chat usage -> Responses usage, details included when the server gave them."""
    out: dict[str, Any] = {
        "input_tokens": int(usage.get("prompt_tokens") or 0),
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "total_tokens": int(usage.get("total_tokens") or 0),
    }
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is not None:
        out["input_tokens_details"] = {"cached_tokens": int(cached)}
    thought = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    if thought is not None:
        out["output_tokens_details"] = {"reasoning_tokens": int(thought)}
    return out


def usage_to_chat(usage: dict[str, Any]) -> dict[str, Any]:
    """Responses usage -> Chat usage (the inverse of `usage_from_chat`)."""
    out: dict[str, Any] = {
        "prompt_tokens": int(usage.get("input_tokens") or 0),
        "completion_tokens": int(usage.get("output_tokens") or 0),
        "total_tokens": int(usage.get("total_tokens") or 0),
    }
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": int(cached)}
    thought = (usage.get("output_tokens_details") or {}).get("reasoning_tokens")
    if thought is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": int(thought)}
    return out
