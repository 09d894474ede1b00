"""The SIMULATED policy: an OpenAI-compatible server that stands in for a model. It is not a model.

It answers from an answer key (the task files it is given, matched by the prompt), right with a
configured probability, after a configured latency. When the request offers tools and no tool
output is in the conversation yet, it calls the first tool first. It never sees the verifier's
fields through the request: only the answer key it was started with. Its draws depend on the seed,
the prompt and the rollout index (header ``X-Gymbus-Session``), so two runs with the same seed agree.
Used for the quickstart, demos, capacity planning, benchmarks, and as the tests' model double.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

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


def prompt_text(items: str | list[dict[str, Any]]) -> str:
    """The last user message's text: what the answer key is matched on."""
    if isinstance(items, str):
        return items.strip()
    for item in reversed(items):
        if item.get("role") == "user" and item.get("type", "message") == "message":
            content = item.get("content")
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return str(content or "").strip()
    return ""


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

    def _draw(self, prompt: str, session: str) -> float:
        rollout = session.rsplit(".", 1)[-1] if session else ""
        digest = hashlib.sha256(f"{self.config.seed}|{prompt}|{rollout}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    async def decide(
        self, items: str | list[dict[str, Any]], tools: list[dict[str, Any]], session: str
    ) -> dict[str, Any]:
        """What the 'model' says: {'tool': (name, args)} or {'text': ...}."""
        self.calls += 1
        if self.config.latency_ms:
            await asyncio.sleep(self.config.latency_ms / 1000)
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

    async def responses(self, request: Request) -> JSONResponse:
        body = await request.json()
        items = body.get("input", [])
        said = await self.decide(items, body.get("tools") or [], request.headers.get(SESSION_HEADER, ""))
        if "tool" in said:
            name, args = said["tool"]
            output = [
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
            output = [
                {
                    "type": "message",
                    "id": f"msg_{self.calls}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": said["text"], "annotations": []}],
                }
            ]
        n_in = len(json.dumps(items)) // 4
        return JSONResponse(
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

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        messages = body.get("messages", [])
        said = await self.decide(messages, body.get("tools") or [], request.headers.get(SESSION_HEADER, ""))
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
        n_in = len(json.dumps(messages)) // 4
        return JSONResponse(
            {
                "id": f"chatcmpl-{self.calls}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", self.config.model),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": n_in, "completion_tokens": 12, "total_tokens": n_in + 12},
            }
        )

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": self.config.model, "object": "model", "owned_by": "gymbus-simulated-policy"}],
            }
        )

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "simulated": True})

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/responses", self.responses, methods=["POST"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/models", self.models),
                Route("/health", self.health),
            ]
        )


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # so asyncio sets TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def _server(app: Starlette) -> uvicorn.Server:
    return uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))


def banner(sim: Simulator, url: str) -> str:
    c = sim.config
    return (
        f"SIMULATED policy (not a model) at {url}: answers from an answer key of {len(sim.key)} prompts, "
        f"accuracy={c.accuracy:g}, latency={c.latency_ms:g} ms, seed={c.seed}"
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

    def __init__(self, app: Starlette, host: str = "127.0.0.1") -> None:
        self.sock = bind(host, 0)
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
