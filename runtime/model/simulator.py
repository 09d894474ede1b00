"""The SIMULATED policy: an OpenAI-compatible server that stands in for a model. It is not a model.

It answers from an answer key (the task files it is given, matched by the prompt), right with a
configured probability, after a configured latency. When the request offers tools and no tool
output is in the conversation yet, it calls the first tool first. It never sees the verifier's
fields through the request: only the answer key it was started with. Its draws depend on the seed,
the prompt and the rollout index (header ``X-Gymbus-Session``), so two runs with the same seed agree.
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
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runtime.items import last_user_text
from runtime.model import simulated_tokens, translate
from runtime.telemetry import tracing

log = logging.getLogger("gymbus.simulator")

SESSION_HEADER = "x-gymbus-session"


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

    async def _fault(self, request: Request) -> Response | None:
        if self.record:
            self.received.append(await request.body())
        if self.config.hang:
            await asyncio.Event().wait()
        if self.config.fail_status:
            self.calls += 1
            return JSONResponse(
                {"error": {"message": "simulated failure", "code": self.config.fail_status}},
                status_code=self.config.fail_status,
            )
        return None

    def _reply(self, body: dict[str, Any]) -> Response:
        raw = json.dumps(body).encode()
        if self.record:
            self.sent.append(raw)
        return Response(raw, media_type="application/json")

    def _logprob(self, session: str, prompt: str, i: int) -> float:
        digest = hashlib.sha256(f"{self.config.seed}|{session}|{prompt}|{i}".encode()).digest()
        return -3.0 * int.from_bytes(digest[:8], "big") / 2**64

    def _draw(self, prompt: str, session: str) -> float:
        rollout = session.rsplit(".", 1)[-1] if session else ""
        digest = hashlib.sha256(f"{self.config.seed}|{prompt}|{rollout}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    async def decide(
        self, items: str | list[dict[str, Any]], tools: list[dict[str, Any]], session: str
    ) -> dict[str, Any]:
        """What the 'model' says: {'tool': (name, args)} or {'text': ...}."""
        self.calls += 1
        if self.record:
            self.sessions.append(session)
        if self.config.latency_ms:
            self.in_flight += 1
            try:
                await asyncio.sleep(self.config.latency_ms / 1000)
            finally:
                self.in_flight -= 1
        prompt = prompt_text(items)
        answer = self.key.get(prompt)
        called = not isinstance(items, str) and any(
            i.get("type") == "function_call_output" or i.get("role") == "tool" for i in items
        )
        if tools and self.config.tool_first and not called and answer is not None:
            tool = tools[0]
            name = (tool.get("function") or tool).get("name", "tool")
            return {"tool": (name, _tool_args(tool, answer))}
        if answer is None:
            return {"text": "I do not know this one."}
        if self._draw(prompt, session) >= self.config.accuracy:
            answer = _wrong(answer)
        return {"text": f"Working it through, the answer is \\boxed{{{answer}}}."}

    def _call_id(self) -> str:
        return f"call_{self.calls:08d}"

    async def responses(self, request: Request) -> Response:
        body = await request.json()
        if "input" not in body:  # as vLLM: a body without input is rejected before anything runs
            return JSONResponse({"error": {"message": "Field required: input", "code": 400}}, 400)
        fault = await self._fault(request)
        if fault is not None:
            return fault
        items = body.get("input", [])
        said = await self.decide(items, body.get("tools") or [], request.headers.get(SESSION_HEADER, ""))
        think = self.config.reasoning
        output: list[dict[str, Any]] = []
        if think == "field":
            output.append(
                {
                    "type": "reasoning",
                    "id": f"rs_{self.calls}",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": THOUGHT}],
                }
            )
        if "tool" in said:
            name, args = said["tool"]
            if think == "tags":  # the thought before a call is text, as the chat path writes it
                output.append(translate.message_item(f"<think>{THOUGHT}</think>"))
            output += [
                {
                    "type": "function_call",
                    "id": f"fc_{self.calls}",
                    "call_id": self._call_id(),
                    "name": name,
                    "arguments": json.dumps(args),
                    "status": "completed",
                }
            ]
        else:
            text = f"<think>{THOUGHT}</think>{said['text']}" if think == "tags" else said["text"]
            output += [
                {
                    "type": "message",
                    "id": f"msg_{self.calls}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ]
        n_in = len(json.dumps(items)) // 4
        return self._reply(
            {
                "id": f"resp_{self.calls}",
                "object": "response",
                "created_at": int(time.time()),
                "status": "completed",
                "model": body.get("model", self.config.model),
                "output": output,
                "usage": {"input_tokens": n_in, "output_tokens": 12, "total_tokens": n_in + 12},
            }
        )

    async def chat(self, request: Request) -> Response:
        fault = await self._fault(request)
        if fault is not None:
            return fault
        body = await request.json()
        messages = body.get("messages", [])
        session = request.headers.get(SESSION_HEADER, "")
        prompt = render(messages)
        limit = self.config.max_prompt_tokens
        if limit and len(toy_tokens(prompt)) > limit:
            message = (
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(toy_tokens(prompt))} tokens in the messages. Please reduce the length of the messages."
            )
            return JSONResponse({"error": {"message": message, "type": "BadRequestError", "code": 400}}, 400)
        said = await self.decide(messages, body.get("tools") or [], session)
        if "tool" in said:
            name, args = said["tool"]
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": self._call_id(),
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": said["text"]}, "stop"
        if self.config.reasoning == "tags":
            message["content"] = f"<think>{THOUGHT}</think>{message['content'] or ''}"
        elif self.config.reasoning == "field":
            message["reasoning"] = THOUGHT
        generated = toy_tokens((message.get("reasoning") or "") + turn_text(message))
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
        answer: dict[str, Any] = {
            "id": f"chatcmpl-{self.calls}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.config.model),
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(toy_tokens(prompt)),
                "completion_tokens": len(generated),
                "total_tokens": len(toy_tokens(prompt)) + len(generated),
            },
        }
        if body.get("return_token_ids"):  # vLLM >= 0.10.2
            answer["prompt_token_ids"] = toy_tokens(prompt)
            choice["token_ids"] = generated
        if body.get("logprobs"):
            as_ids = body.get("return_tokens_as_token_ids")
            choice["logprobs"] = {
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
        return self._reply(answer)

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
                Route("/v1/responses", self.responses, methods=["POST"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/models", self.models),
                Route("/health", self.health),
                *simulated_tokens.routes(self),
            ]
        )
        tracing.instrument_app(app)  # server spans continue the model call's trace, as vLLM's would
        return app


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # so asyncio sets TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def _server(app: Starlette) -> uvicorn.Server:
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2)
    return uvicorn.Server(config)


def banner(sim: Simulator, url: str) -> str:
    c = sim.config
    faults = f", FAULT: answers HTTP {c.fail_status}" if c.fail_status else ", FAULT: never answers" if c.hang else ""
    return (
        f"SIMULATED policy (not a model) at {url}: answers from an answer key of {len(sim.key)} prompts, "
        f"accuracy={c.accuracy:g}, latency={c.latency_ms:g} ms, seed={c.seed}, reasoning={c.reasoning}{faults}"
    )


def run(sim: Simulator, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serve in the foreground; prints one JSON line with the base URL once listening."""
    sock = bind(host, port)
    url = f"http://{host}:{sock.getsockname()[1]}/v1"
    log.warning(banner(sim, url))
    print(json.dumps({"url": url, "simulated": True}), flush=True)
    asyncio.run(_server(sim.app()).serve(sockets=[sock]))


class InThread:
    """Serve an ASGI app from a thread on a free port (tests, and the in-process CLI)."""

    def __init__(self, app: Starlette, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sock = bind(host, port)
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = _server(app)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True)

    def __enter__(self) -> InThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
