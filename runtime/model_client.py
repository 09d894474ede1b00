"""The policy-model client: OpenAI-compatible HTTP over aiohttp.

It speaks the Responses API (``/v1/responses``) and falls back to Chat Completions when an
endpoint has only that (probed once per endpoint). Every sampling parameter is sent explicitly and
recorded. Connection errors, 5xx and 429 are retried with jittered backoff inside a per-call
budget; when the budget is spent the rollout fails with ``model_error`` (one retry layer only:
the message is not redelivered for it). Endpoints of a model come from the ``models`` KV bucket
(written by ``gymbus collect`` or the model tier) or from a static URL.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import stamina
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NotFoundError

from broker import topology
from broker.schemas import Session, Turn, Usage
from runtime import translate
from runtime.errors import ContextLength, ModelError

log = logging.getLogger("gymbus.model")

DEFAULT_SAMPLING: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0}
"""Sent when the task does not say, so the server's generation config never silently applies."""

_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_output_tokens",
    "seed",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)
SESSION_HEADER = "X-Gymbus-Session"
_CONTEXT_MARKERS = ("context length", "context_length", "maximum context", "too many tokens", "max_model_len")


@dataclass
class ModelOutput:
    """One model call's result, as Responses output items."""

    items: list[dict[str, Any]]
    usage: Usage
    sampling: dict[str, Any]
    turn: Turn | None = None
    finish_reason: str | None = None


class _Retryable(Exception):
    """An HTTP answer worth another try (5xx, 429)."""


class _Unsupported(Exception):
    """The endpoint does not serve this API (404/405): fall back to Chat Completions."""


@dataclass
class ModelEntry:
    """The ``models`` KV value of one model."""

    endpoints: list[str]
    api: str = "auto"


class Endpoints:
    """Where a model is served: a static URL, else the ``models`` bucket (re-read every few seconds)."""

    def __init__(self, js: JetStreamContext | None = None, static: str | None = None, refresh_s: float = 2.0) -> None:
        self._js = js
        self._static = [u.strip() for u in static.split(",")] if static else None
        self._cache: dict[str, tuple[float, ModelEntry]] = {}
        self._refresh_s = refresh_s

    async def get(self, model: str) -> ModelEntry:
        if self._static:
            return ModelEntry(self._static)
        cached = self._cache.get(model)
        if cached and time.monotonic() - cached[0] < self._refresh_s:
            return cached[1]
        entry = await self._read(model)
        self._cache[model] = (time.monotonic(), entry)
        return entry

    async def _read(self, model: str) -> ModelEntry:
        if self._js is None:
            raise ModelError(f"no endpoint for model {model!r}: give --model-url or register it in the models bucket")
        try:
            kv = await self._js.key_value(topology.MODELS)
            raw = json.loads((await kv.get(model_key(model))).value or b"{}")
        except (KeyNotFoundError, NotFoundError) as exc:
            raise ModelError(f"model {model!r} has no endpoints in the models bucket") from exc
        endpoints = [str(u) for u in raw.get("endpoints", [])]
        if not endpoints:
            raise ModelError(f"model {model!r} has no live endpoints in the models bucket")
        return ModelEntry(endpoints, str(raw.get("api", "auto")))


def model_key(model: str) -> str:
    """KV key of a model name (KV keys allow ``[-/_=.a-zA-Z0-9]``)."""
    return "".join(c if c.isalnum() or c in "-/_=." else "_" for c in model)


async def register(js: JetStreamContext, model: str, endpoints: list[str], api: str = "auto") -> None:
    """Publish a model's endpoints to the ``models`` bucket."""
    kv = await js.key_value(topology.MODELS)
    await kv.put(model_key(model), json.dumps({"endpoints": endpoints, "api": api}).encode())


@dataclass
class ModelClient:
    """Calls the policy for agent steps; one per worker process, shared by all its in-flight messages."""

    endpoints: Endpoints
    timeout_s: float = 120.0
    attempts: int = 4
    api_key: str | None = field(default_factory=lambda: os.environ.get("OPENAI_API_KEY"))
    _session: aiohttp.ClientSession | None = None
    _api: dict[str, str] = field(default_factory=dict)
    _rr: itertools.count = field(default_factory=itertools.count)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300), headers=headers
            )
        return self._session

    async def __call__(self, items: list[dict[str, Any]], params: dict[str, Any], session: Session) -> ModelOutput:
        """Call the model once for ``session``'s conversation."""
        entry = await self.endpoints.get(session.model)
        sampling = {**DEFAULT_SAMPLING, **{k: params[k] for k in _SAMPLING_KEYS if k in params}}
        body = {**params, **sampling, "model": params.get("model") or session.model, "input": items, "store": False}
        if session.options.chat_template_kwargs:
            body["chat_template_kwargs"] = session.options.chat_template_kwargs
        try:
            async for attempt in stamina.retry_context(
                on=(_Retryable, aiohttp.ClientConnectionError, asyncio.TimeoutError),
                attempts=self.attempts,
                timeout=None,
                wait_initial=0.2,
                wait_max=5.0,
            ):
                with attempt:
                    url = entry.endpoints[next(self._rr) % len(entry.endpoints)]
                    items_out, usage, finish = await self._call(url, entry.api, body, session.session_id)
        except (TimeoutError, _Retryable, aiohttp.ClientError) as exc:
            raise ModelError(f"{self.attempts} attempts failed, last: {_describe(exc)}") from exc
        return ModelOutput(items_out, Usage(**usage), sampling, finish_reason=finish)

    async def _call(
        self, url: str, api: str, body: dict[str, Any], sid: str
    ) -> tuple[list[dict[str, Any]], dict[str, int], Any]:
        api = self._api.get(url, api)
        if api in ("auto", "responses"):
            try:
                resp = await self._post(f"{url.rstrip('/')}/responses", body, sid)
                self._api[url] = "responses"
                usage = resp.get("usage") or {}
                return (
                    list(resp.get("output") or []),
                    {
                        "input_tokens": int(usage.get("input_tokens") or 0),
                        "output_tokens": int(usage.get("output_tokens") or 0),
                    },
                    resp.get("status"),
                )
            except _Unsupported:
                if api == "responses":
                    raise ModelError(f"{url} does not serve /responses") from None
                log.info("model endpoint %s has no /responses; using /chat/completions", url)
                self._api[url] = "chat"
        resp = await self._post(f"{url.rstrip('/')}/chat/completions", translate.request_to_chat(body), sid)
        return translate.chat_to_output(resp)

    async def _post(self, url: str, body: dict[str, Any], sid: str) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        headers = {SESSION_HEADER: sid}  # lets servers and routers keep a rollout on one replica
        async with self._http().post(url, json=body, timeout=timeout, headers=headers) as resp:
            text = await resp.text()
            if resp.status == 200:
                return json.loads(text)
            if resp.status in (404, 405):
                raise _Unsupported(url)
            if resp.status == 429 or resp.status >= 500:
                raise _Retryable(f"HTTP {resp.status} from {url}: {text[:200]}")
            if any(m in text.lower() for m in _CONTEXT_MARKERS):
                raise ContextLength(f"HTTP {resp.status} from {url}: {text[:300]}")
            raise ModelError(f"HTTP {resp.status} from {url}: {text[:300]}")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"
