"""The SIMULATED policy: an OpenAI-compatible server that stands in for a model. It is not a model.

For a task whose environment gives a reference (what a perfect model answers, and a plausible wrong
answer: runtime/reference.py), it plays that script turn by turn, the right one with a configured
probability (runtime/model/policy.py); a call for another model (a judge) gets the reference's judge
answer. For other tasks it answers from an answer key (the task files it is given, matched by the
task's prompt), right with that probability; when the request offers tools and no tool output is in
the conversation yet, it calls the first tool first. Every answer comes after a configured latency.
It never sees the verifier's fields through the request: only the task files it was started with.
Its draws depend on the seed, the prompt (or task) and the rollout index (header
``X-Gymbus-Session``), so two runs with the same seed agree.
Used for the quickstart, demos, capacity planning, benchmarks, and as the tests' model double.

What it imitates of vLLM, so the client's paths are exercised over real HTTP:

- token ids: a Chat Completions request with ``return_token_ids`` gets ``prompt_token_ids`` and the
  choice's ``token_ids``; with ``logprobs`` each generated token comes back with a log-probability,
  as ``"token_id:<id>"`` under ``return_tokens_as_token_ids``. Its "tokenizer" is one token per byte
  of a plain rendering of the conversation, and its logprobs are seeded draws: not a model's;
- reasoning (``reasoning``): ``tags`` writes ``<think>…</think>`` into the text (a server without a
  reasoning parser), ``field`` returns it parsed, as vLLM's ``reasoning`` field / a reasoning item;
- faults: ``fail_status`` answers every generation request with that HTTP status, ``hang`` never
  answers one (for retry-budget and timeout tests).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runtime.items import last_user_text
from runtime.model import simulated_tokens
from runtime.model.policy import AnswerBook
from runtime.model.serving import Answer, BarePost, bind, server
from runtime.telemetry import tracing

log = logging.getLogger("gymbus.simulator")

SESSION_HEADER = b"x-gymbus-session"
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
"""Request bodies, and /responses answers: msgspec takes a few µs where json takes 10-20."""


@dataclass
class SimConfig:
    accuracy: float = 0.8
    """Probability that a final answer is the key's answer."""
    latency_ms: float = 0.0
    """Delay before every answer."""
    seed: int = 0
    tool_first: bool = True
    """Call a tool first when the request offers tools."""
    model: str = "policy"
    reasoning: Literal["none", "tags", "field"] = "none"
    """Think before answering: in ``<think>`` tags in the text, or as a parsed ``reasoning`` field."""
    fail_status: int = 0
    """Answer every generation request with this HTTP status (0: never)."""
    hang: bool = False
    """Never answer a generation request (a stuck replica)."""
    max_prompt_tokens: int = 0
    """Reject a longer prompt (in its toy tokens) with vLLM's 400 context-length error (0: no limit)."""
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    """Which logprobs ``/v1/completions`` returns (as vLLM's ``--logprobs-mode``; see simulated_tokens)."""
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    """Sampling values applied when a completions request leaves them out (a model's generation config)."""


THOUGHT = "Let me work through this step by step."
TOKEN_OFFSET = 100
"""Token id of byte b is b + TOKEN_OFFSET (ids below are 'special')."""


def toy_tokens(text: str) -> list[int]:
    """The simulator's tokenizer: one id per UTF-8 byte. Not a real tokenizer."""
    return [b + TOKEN_OFFSET for b in text.encode()]


def render(messages: list[dict[str, Any]]) -> str:
    """A plain chat 'template' for the simulator's prompt token ids."""
    return "".join(f"<|{m.get('role', 'user')}|>{turn_text(m)}\n" for m in messages) + "<|assistant|>"


def turn_text(message: dict[str, Any]) -> str:
    """What one message 'says' in the simulator's rendering: its text, then its tool calls as JSON."""
    calls = "".join(json.dumps(c.get("function", c), sort_keys=True) for c in message.get("tool_calls") or [])
    return f"{message.get('content') or ''}{calls}"


def prompt_text(items: str | list[dict[str, Any]]) -> str:
    """The last user message's text: what the answer key is matched on."""
    return last_user_text(items)


def load_answer_key(paths: Iterable[str | Path]) -> dict[str, str]:
    """prompt -> expected answer, from NeMo Gym-shaped task JSONL files."""
    key: dict[str, str] = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                answer = row.get("expected_answer", row.get("answer"))
                params = row.get("responses_create_params") or {}
                if answer is not None and isinstance(params.get("input"), (str, list)):
                    key[prompt_text(params["input"])] = str(answer)
            except (ValueError, AttributeError, TypeError):
                continue  # a malformed row has no answer; gymbus reports it as invalid input
    return key


def _wrong(answer: str) -> str:
    try:
        return str(int(answer) + 1)
    except ValueError:
        try:
            return str(float(answer) + 1.5)
        except ValueError:
            return "unknown"


def _tool_args(tool: dict[str, Any], answer: str) -> dict[str, Any]:
    params = (tool.get("function") or tool).get("parameters") or {}
    args: dict[str, Any] = {}
    for name, prop in (params.get("properties") or {}).items():
        if name not in params.get("required", []):
            continue
        kind = prop.get("type")
        if kind in ("number", "integer"):
            try:
                args[name] = float(answer) if kind == "number" else int(float(answer))
            except ValueError:
                args[name] = 0
        else:
            args[name] = answer
    return args


@dataclass
class Simulator:
    key: dict[str, str]
    config: SimConfig = field(default_factory=SimConfig)
    calls: int = 0
    in_flight: int = 0
    """Calls waiting out their latency right now."""
    record: bool = False
    """Keep every answer body sent (``sent``), for tests that compare bytes."""
    sent: list[bytes] = field(default_factory=list)
    received: list[bytes] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    """The ``X-Gymbus-Session`` of every call answered (when recording)."""
    book: AnswerBook | None = None
    """The tasks with their environments' references (played before the answer key is looked at)."""

    async def _fault(self, raw: bytes) -> Response | None:
        if self.record:
            self.received.append(raw)
        if self.config.hang:
            await asyncio.Event().wait()
        if self.config.fail_status:
            self.calls += 1
            return JSONResponse(
                {"error": {"message": "simulated failure", "code": self.config.fail_status}},
                status_code=self.config.fail_status,
            )
        return None

    def _reply(self, raw: bytes) -> bytes:
        if self.record:
            self.sent.append(raw)
        return raw

    def _logprob(self, session: str, prompt: str, i: int) -> float:
        digest = hashlib.sha256(f"{self.config.seed}|{session}|{prompt}|{i}".encode()).digest()
        return -3.0 * int.from_bytes(digest[:8], "big") / 2**64

    def _draw(self, prompt: str, session: str) -> float:
        rollout = session.rsplit(".", 1)[-1] if session else ""
        digest = hashlib.sha256(f"{self.config.seed}|{prompt}|{rollout}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    async def decide(
        self, items: str | list[dict[str, Any]], tools: list[dict[str, Any]], session: str, model: str = ""
    ) -> dict[str, Any]:
        """What the 'model' says: {'tools': [(name, args), ...]} or {'text': ...}."""
        self.calls += 1
        if self.record:
            self.sessions.append(session)
        if self.config.latency_ms:
            self.in_flight += 1
            try:
                await asyncio.sleep(self.config.latency_ms / 1000)
            finally:
                self.in_flight -= 1
        played = self.book.answer(items, session, model, self.config.model, self.config.accuracy) if self.book else None
        if played is not None and played.calls:
            return {"tools": [(c.name, c.arguments) for c in played.calls]}
        if played is not None:
            return {"text": played.text or ""}
        prompt = (self.book.task_prompt(items, session) if self.book else None) or prompt_text(items)
        answer = self.key.get(prompt)
        called = not isinstance(items, str) and any(
            i.get("type") == "function_call_output" or i.get("role") == "tool" for i in items
        )
        if tools and self.config.tool_first and not called and answer is not None:
            tool = tools[0]
            name = (tool.get("function") or tool).get("name", "tool")
            return {"tools": [(name, _tool_args(tool, answer))]}
        if answer is None:
            return {"text": "I do not know this one."}
        if self._draw(prompt, session) >= self.config.accuracy:
            answer = _wrong(answer)
        return {"text": f"Working it through, the answer is \\boxed{{{answer}}}."}

    def _call_id(self, k: int = 0) -> str:
        return f"call_{self.calls:08d}_{k}" if k else f"call_{self.calls:08d}"

    async def responses(self, raw: bytes, sid: str) -> Answer:
        """POST /v1/responses (``sid``: the X-Gymbus-Session header)."""
        body = _decode(raw)
        if "input" not in body:  # as vLLM: a body without input is rejected before anything runs
            return JSONResponse({"error": {"message": "Field required: input", "code": 400}}, 400)
        fault = await self._fault(raw)
        if fault is not None:
            return fault
        items = body.get("input", [])
        said = await self.decide(items, body.get("tools") or [], sid, body.get("model", ""))
        n_in = len(json.dumps(items)) // 4
        answer = {
            "id": f"resp_{self.calls}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": body.get("model", self.config.model),
            "output": self._output_items(said),
            "usage": {"input_tokens": n_in, "output_tokens": 12, "total_tokens": n_in + 12},
        }
        return self._reply(_encode(answer))

    def _output_items(self, said: dict[str, Any]) -> list[dict[str, Any]]:
        """What the 'model' said, as Responses output items (reasoning first, when it thinks)."""
        think, n = self.config.reasoning, self.calls
        output: list[dict[str, Any]] = []
        if think == "field":
            thought = [{"type": "reasoning_text", "text": THOUGHT}]
            output.append({"type": "reasoning", "id": f"rs_{n}", "summary": [], "content": thought})
        if "tools" in said:
            if think == "tags":  # the thought before a call is text, as the chat path writes it
                said_text = [{"type": "output_text", "text": f"<think>{THOUGHT}</think>", "annotations": []}]
                output.append({"type": "message", "role": "assistant", "status": "completed", "content": said_text})
            return output + [
                {"type": "function_call", "id": f"fc_{n}_{k}" if k else f"fc_{n}", "call_id": self._call_id(k)}
                | {"name": name, "arguments": json.dumps(args), "status": "completed"}
                for k, (name, args) in enumerate(said["tools"])
            ]
        text = f"<think>{THOUGHT}</think>{said['text']}" if think == "tags" else said["text"]
        content: list[dict[str, Any]] = [{"type": "output_text", "text": text, "annotations": []}]
        message = {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed"}
        return [*output, {**message, "content": content}]

    async def chat(self, raw: bytes, session: str) -> Answer:
        """POST /v1/chat/completions (``session``: the X-Gymbus-Session header)."""
        fault = await self._fault(raw)
        if fault is not None:
            return fault
        body = _decode(raw)
        messages = body.get("messages", [])
        prompt = render(messages)
        too_long = self._too_long(prompt)
        if too_long is not None:
            return too_long
        said = await self.decide(messages, body.get("tools") or [], session, body.get("model", ""))
        message, finish = self._chat_message(said)
        generated = toy_tokens((message.get("reasoning") or "") + turn_text(message))
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
        prompt_ids = toy_tokens(prompt)
        answer: dict[str, Any] = {
            "id": f"chatcmpl-{self.calls}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.config.model),
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(generated),
                "total_tokens": len(prompt_ids) + len(generated),
            },
        }
        if body.get("return_token_ids"):  # vLLM >= 0.10.2
            answer["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = generated
        if body.get("logprobs"):
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            choice["logprobs"] = self._logprobs(generated, session, prompt, as_ids)
        return self._reply(json.dumps(answer).encode())  # json's float text (the token-ids tests compare it)

    def _too_long(self, prompt: str) -> Response | None:
        """vLLM's 400 for a prompt over the context length, when one is configured."""
        limit, n = self.config.max_prompt_tokens, len(toy_tokens(prompt))
        if not limit or n <= limit:
            return None
        message = (
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{n} tokens in the messages. Please reduce the length of the messages."
        )
        return JSONResponse({"error": {"message": message, "type": "BadRequestError", "code": 400}}, 400)

    def _chat_message(self, said: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """What the 'model' said, as a Chat Completions assistant message and its finish reason."""
        if "tools" in said:
            calls = [
                {"id": self._call_id(k), "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for k, (name, args) in enumerate(said["tools"])
            ]
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": calls}
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": said["text"]}, "stop"
        if self.config.reasoning == "tags":
            message["content"] = f"<think>{THOUGHT}</think>{message['content'] or ''}"
        elif self.config.reasoning == "field":
            message["reasoning"] = THOUGHT
        return message, finish

    def _logprobs(self, generated: list[int], session: str, prompt: str, as_ids: bool) -> dict[str, Any]:
        return {
            "content": [
                {
                    "token": f"token_id:{t}" if as_ids else chr(t - TOKEN_OFFSET),
                    "logprob": self._logprob(session, prompt, i),
                    "bytes": [t - TOKEN_OFFSET],
                    "top_logprobs": [],
                }
                for i, t in enumerate(generated)
            ]
        }

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": self.config.model, "object": "model", "owned_by": "gymbus-simulated-policy"}],
            }
        )

    async def health(self, request: Request) -> JSONResponse:
        stats = {"calls": self.calls, "in_flight": self.in_flight, "pid": os.getpid()}
        return JSONResponse({"status": "ok", "simulated": True, **stats})

    def app(self) -> Starlette:
        app = Starlette(
            routes=[
                Route("/v1/responses", BarePost(self.responses, SESSION_HEADER), methods=["POST"]),
                Route("/v1/chat/completions", BarePost(self.chat, SESSION_HEADER), methods=["POST"]),
                Route("/v1/models", self.models),
                Route("/health", self.health),
                *simulated_tokens.routes(self),
            ]
        )
        tracing.instrument_app(app)  # server spans continue the model call's trace, as vLLM's would
        return app


def banner(sim: Simulator, url: str) -> str:
    c = sim.config
    faults = f", FAULT: answers HTTP {c.fail_status}" if c.fail_status else ", FAULT: never answers" if c.hang else ""
    refs = f" and the references of {len(sim.book.rows)} tasks" if sim.book is not None else ""
    if sim.book is not None and sim.book.plays:
        refs += ", playing " + ", ".join(f"{n} as a SIMULATED {r.replace('_', ' ')}" for n, r in sim.book.plays.items())
    return (
        f"SIMULATED policy (not a model) at {url}: answers from an answer key of {len(sim.key)} prompts{refs}, "
        f"accuracy={c.accuracy:g}, latency={c.latency_ms:g} ms, seed={c.seed}, reasoning={c.reasoning}{faults}"
    )


def run(sim: Simulator, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serve in the foreground; prints one JSON line with the base URL once listening."""
    sock = bind(host, port)
    url = f"http://{host}:{sock.getsockname()[1]}/v1"
    log.warning(banner(sim, url))
    print(json.dumps({"url": url, "simulated": True}), flush=True)
    asyncio.run(server(sim.app()).serve(sockets=[sock]))
