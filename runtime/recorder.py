"""The recording endpoint a harness talks to: an OpenAI-compatible server for one rollout's harness run.

It serves ``POST /v1/chat/completions`` (plain or streamed), ``POST /v1/responses`` and
``GET /v1/models`` on 127.0.0.1 under a per-run secret path. Each call is forwarded through the
model tier for the rollout (`AgentContext.call`: the policy's routing, retries, tracing, token ids,
usage), and recorded into the rollout's conversation: the items of the request the conversation
does not hold yet (only the new ones when the harness extends its history, all of them, the first
marked ``history_rewritten``, when it rewrote it), then the model's output. A model failure stops
the harness and ends the rollout with its own kind; a call past ``max_steps`` stops it too.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from runtime.agent import AgentContext
from runtime.errors import GymError
from runtime.items import mark, message_text
from runtime.model import translate
from runtime.model.client import SAMPLING_KEYS

log = logging.getLogger("gymbus.harness")

PASSED = ("temperature", "top_p", "max_output_tokens", "seed", "stop", "tool_choice", "parallel_tool_calls", "text")
"""Request fields of a harness that reach the model (its sampling, within the rollout's own)."""


@dataclass
class Recorder:
    """One harness run's endpoint and what it recorded."""

    ctx: AgentContext
    on_call: Callable[[int], Any] | None = None
    """Called after each recorded call with the number of calls so far."""
    failure: GymError | None = None
    """The first model failure (the harness is stopped, the rollout fails with it)."""
    truncated: bool = False
    """A call came past ``max_steps`` (the harness is stopped, what it did is verified)."""
    calls: int = 0
    stop: Callable[[], None] = lambda: None
    token: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    _seen: list[tuple[Any, ...]] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    base_url: str = ""

    async def start(self) -> str:
        """Serve on a free loopback port; returns the base URL (``.../v1``)."""
        app = web.Application(client_max_size=64 * 2**20)
        prefix = f"/{self.token}/v1"
        app.router.add_post(f"{prefix}/chat/completions", self._chat)
        app.router.add_post(f"{prefix}/responses", self._responses)
        app.router.add_get(f"{prefix}/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._seen = [_key(i) for i in self.ctx.items[: self.ctx.n_input]]
        self.base_url = f"http://127.0.0.1:{port}{prefix}"
        return self.base_url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.ctx.session.model, "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        items = translate.messages_to_items(body.get("messages") or [])
        params = _params(body)
        if "max_completion_tokens" in body or "max_tokens" in body:
            params["max_output_tokens"] = body.get("max_completion_tokens") or body.get("max_tokens")
        if isinstance(params.get("tool_choice"), dict):
            params["tool_choice"] = {"type": "function", "name": params["tool_choice"].get("function", {}).get("name")}
        out = await self._call(items, [_flat(t) for t in body.get("tools") or []], params)
        if isinstance(out, web.Response):
            return out
        output, usage = out
        message = _assistant(output)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        head = {"id": f"chatcmpl-{self.calls}", "created": int(time.time()), "model": self.ctx.session.model}
        if body.get("stream"):
            return await _stream(request, head, message, finish)
        choice = {"index": 0, "message": message, "finish_reason": finish}
        chat_usage = translate.usage_to_chat(usage)
        return web.json_response({**head, "object": "chat.completion", "choices": [choice], "usage": chat_usage})

    async def _responses(self, request: web.Request) -> web.Response:
        body = await request.json()
        raw = body.get("input") or []
        items = [{"type": "message", "role": "user", "content": raw}] if isinstance(raw, str) else list(raw)
        if body.get("instructions"):
            items.insert(0, {"type": "message", "role": "system", "content": body["instructions"]})
        out = await self._call(items, list(body.get("tools") or []), _params(body))
        if isinstance(out, web.Response):
            return out
        output, usage = out
        return web.json_response(
            {
                "id": f"resp_{self.calls}",
                "object": "response",
                "created_at": int(time.time()),
                "status": "completed",
                "model": self.ctx.session.model,
                "output": translate.strip_training(output),
                "usage": usage,
            }
        )

    async def _call(
        self, items: list[dict[str, Any]], tools: list[dict[str, Any]], params: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], dict[str, Any]] | web.Response:
        """Forward one call through the model tier and record it; an error answer when it cannot be made."""
        if self.failure is not None or self.truncated:
            return _error(409, "this rollout has ended")
        if self.ctx.turns_taken >= self.ctx.options.max_steps:
            self.truncated = True
            self.stop()
            return _error(429, f"max_steps ({self.ctx.options.max_steps}) model calls made for this rollout")
        try:
            sampling = {k: v for k, v in self.ctx.params.items() if k in SAMPLING_KEYS}  # the run's, then the harness's
            out = await self.ctx.call(items, {**sampling, **params, "tools": tools})
        except GymError as exc:
            self.failure = exc
            self.stop()
            return _error(502, exc.reason)
        self._record(items, out.items)
        self.calls += 1
        if self.on_call is not None:
            await self.on_call(self.calls)
        usage = {"input_tokens": out.usage.input_tokens, "output_tokens": out.usage.output_tokens}
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        return out.items, usage

    def _record(self, items: list[dict[str, Any]], output: list[dict[str, Any]]) -> None:
        keys = [_key(i) for i in items]
        if keys[: len(self._seen)] == self._seen:
            new = items[len(self._seen) :]
        else:  # the harness rewrote its history: record the whole request again
            new = [dict(i) for i in items]
            if new:
                mark(new[0], "harness", history_rewritten=True)
            self.ctx.info.setdefault("harness_history_rewrites", 0)
            self.ctx.info["harness_history_rewrites"] += 1
        self.ctx.items.extend([*new, *output])
        self._seen = keys + [_key(i) for i in output]


def _params(body: dict[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in PASSED if body.get(k) is not None}


def _flat(tool: dict[str, Any]) -> dict[str, Any]:
    """A Chat tool (nested ``function``) as a Responses tool (flat)."""
    fn = tool.get("function")
    return {"type": "function", **fn} if isinstance(fn, dict) else tool


def _key(item: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies an item across Chat and Responses shapes (for finding the new ones)."""
    kind = item.get("type", "message")
    if kind == "message":
        return (kind, item.get("role", "user"), message_text(item))
    if kind == "function_call":
        return (kind, item.get("call_id"), item.get("name"), item.get("arguments"))
    if kind == "function_call_output":
        return (kind, item.get("call_id"), str(item.get("output")))
    return (kind,)


def _assistant(output: list[dict[str, Any]]) -> dict[str, Any]:
    """The model's output as one Chat assistant message (text, reasoning, tool calls)."""
    messages = translate.items_to_messages(translate.strip_training(output))
    message: dict[str, Any] = {"role": "assistant", "content": None}
    for m in messages:
        if m.get("content"):
            message["content"] = (message["content"] or "") + m["content"]
        if m.get("reasoning"):
            message["reasoning"] = m["reasoning"]
        if m.get("tool_calls"):
            message.setdefault("tool_calls", []).extend(m["tool_calls"])
    return message


async def _stream(
    request: web.Request, head: dict[str, Any], message: dict[str, Any], finish: str
) -> web.StreamResponse:
    """The answer as a Chat Completions event stream of one chunk (for harnesses that always stream)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    delta = dict(message)
    if delta.get("tool_calls"):
        delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(delta["tool_calls"])]
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    chunk = {**head, "object": "chat.completion.chunk", "choices": [choice]}
    await resp.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
    await resp.write_eof()
    return resp


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": f"gymbus: {message}", "code": status}}, status=status)
