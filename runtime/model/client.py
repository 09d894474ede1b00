"""The policy-model client: OpenAI-compatible HTTP over aiohttp.

One call is one agent turn. It picks a replica (`runtime.model.endpoints.Pool`: sticky per session,
least in flight, healthy first), sends the conversation as a Responses request, or as Chat
Completions where the replica has no ``/responses`` (probed once per replica) or where token ids
are wanted (vLLM returns them on Chat Completions), and translates the answer back to Responses
items (`runtime.model.translate`). Every sampling parameter is sent explicitly and recorded.

Failures: connection errors, 5xx, 429, invalid answers and timeouts are retried with jittered
backoff (stamina), on another replica when there is one, up to the deployment's ``attempts``;
then the rollout fails with ``model_error`` naming each attempt. A rejected prompt that is too
long fails with ``context_length``. This is the only retry layer: the worker does not redeliver
a message for a model error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
import stamina
from opentelemetry import propagate, trace
from yarl import URL

from broker.schemas import Session, Trajectory, Turn, Usage
from runtime.errors import ContextLength, ModelError
from runtime.model import sampling, tokens, translate
from runtime.model.endpoints import Api, Endpoint, Endpoints, ModelEntry, Pool, deregister, model_key, register
from runtime.telemetry import tracing

__all__ = ["Endpoints", "ModelClient", "ModelEntry", "ModelOutput", "deregister", "model_key", "register"]

log = logging.getLogger("gymbus.model")

DEFAULT_SAMPLING: dict[str, Any] = sampling.NEUTRAL
"""Sent when neither the task nor the deployment says, so the server's generation config never applies."""

SAMPLING_KEYS = sampling.KEYS
_SAMPLING_KEYS = frozenset(SAMPLING_KEYS)
SESSION_HEADER = "X-Gymbus-Session"
_CONTEXT_MARKERS = ("context length", "context_length", "maximum context", "too many tokens", "max_model_len")
NO_ENDPOINT_WAIT_S = 30.0
"""How long a call waits for a model with no live endpoints (replicas restarting) before failing."""


@dataclass
class ModelOutput:
    """One model call's result, as Responses output items."""

    items: list[dict[str, Any]]
    usage: Usage
    sampling: dict[str, Any]
    turn: Turn | None = None
    finish_reason: str | None = None
    trajectory: Trajectory | None = None
    """The rollout's token sequence so far (token_exact)."""
    policy_version: int = 0
    """The policy version of the deployment that served the call."""


class _Retryable(Exception):
    """An answer worth another try (5xx, 429, a body that is not JSON)."""


class _Unsupported(Exception):
    """The replica does not serve /responses (404/405): fall back to Chat Completions."""


_RETRIED = (_Retryable, aiohttp.ClientError, TimeoutError)
_WAIT_INITIAL_S, _WAIT_MAX_S, _WAIT_JITTER_S = 0.1, 2.0, 0.5
"""Backoff between attempts: 0.1 s doubling per attempt up to 2 s, plus up to 0.5 s of jitter."""
_JSON = {"Content-Type": "application/json"}
_URLS_KEPT = 1024
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


@dataclass
class ModelClient:
    """Calls the policy for agent steps; one per worker process, shared by all its in-flight messages."""

    endpoints: Endpoints
    api_key: str | None = field(default_factory=lambda: os.environ.get("OPENAI_API_KEY"))
    _session: aiohttp.ClientSession | None = None
    _plain: aiohttp.ClientSession | None = None
    """The session of calls made outside a recording span (tracing on, the rollout not sampled): one the
    HTTP instrumentation is taken out of, so aiohttp fires none of its hooks for them."""
    _timeouts: dict[float, aiohttp.ClientTimeout] = field(default_factory=dict)
    _urls: dict[tuple[str, str], URL] = field(default_factory=dict)
    """Each (base URL, route) parsed once: aiohttp parses a string URL on every request and computes
    the properties it reads (host, port, ...) on each new URL object."""

    async def close(self) -> None:
        await self.endpoints.close()
        for http in (self._session, self._plain):
            if http is not None:
                await http.close()

    def _http(self) -> aiohttp.ClientSession:
        """The HTTP session of a call made now: the instrumented one inside a recording span (or with
        tracing off, when nothing is instrumented), else the plain one."""
        if tracing.TRACER is None or trace.get_current_span().is_recording():
            if self._session is None:
                self._session = self._new_session()
            return self._session
        if self._plain is None:
            from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor

            self._plain = self._new_session()
            AioHttpClientInstrumentor.uninstrument_session(self._plain)
        return self._plain

    def _new_session(self) -> aiohttp.ClientSession:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300), headers=headers)

    async def __call__(self, items: list[dict[str, Any]], params: dict[str, Any], session: Session) -> ModelOutput:
        """Call the model once for ``session``'s conversation."""
        pool = self.endpoints.opened(session.model) or await self.endpoints.pool(session.model)
        if not pool.by_url:
            await pool.wait_for_endpoints(NO_ENDPOINT_WAIT_S)  # replicas may be (re)starting
        entry = pool.entry
        sent = sampling.resolve(entry.sampling, params)
        body = {k: v for k, v in params.items() if k not in _SAMPLING_KEYS}
        body.update(sent, model=params.get("model") or session.model, input=items, store=False)
        if session.options.chat_template_kwargs:
            body["chat_template_kwargs"] = session.options.chat_template_kwargs
        if session.options.token_exact:
            from runtime.model import exact  # the token-exact path: /tokenize and /completions

            reply, exact_turn, trajectory = await exact.call(self, pool, body, session)
            items_out, usage, finish, _ = _finish(reply, exact_turn)
            return ModelOutput(items_out, usage, sent, exact_turn, finish, trajectory, entry.policy_version)
        want_ids = session.options.return_token_ids
        if want_ids and entry.api == "responses":
            raise ModelError(f"model {session.model!r}: token ids need Chat Completions, but its api is 'responses'")
        items_out, usage, finish, turn = await self._with_retries(pool, body, session.session_id, want_ids)
        return ModelOutput(items_out, usage, sent, turn, finish, policy_version=entry.policy_version)

    async def _with_retries(
        self, pool: Pool, body: dict[str, Any], sid: str, want_ids: bool
    ) -> tuple[list[dict[str, Any]], Usage, str | None, Turn | None]:
        """The first attempt goes straight out: a stamina retry context costs tens of µs of CPU per
        call (runtime/bench/README.md) and almost every call succeeds at once. Only a failed first attempt
        enters the retry loop, with the same backoff the loop would have used from the start."""
        entry = pool.entry
        tried: set[str] = set()  # not set[str](): calling a generic alias costs ~0.3 µs
        errors: list[str] = []
        try:
            return await self._try(pool, entry, body, sid, want_ids, tried, errors)
        except _RETRIED:
            pass
        if entry.attempts > 1:
            if stamina.is_active() and not stamina.is_testing():
                await asyncio.sleep(_WAIT_INITIAL_S + random.uniform(0, _WAIT_JITTER_S))
            try:
                async for attempt in stamina.retry_context(
                    on=_RETRIED,
                    attempts=entry.attempts - 1,
                    timeout=None,
                    wait_initial=2 * _WAIT_INITIAL_S,  # the loop's first wait is the call's second
                    wait_max=_WAIT_MAX_S,
                    wait_jitter=_WAIT_JITTER_S,
                ):
                    with attempt:
                        return await self._try(pool, entry, body, sid, want_ids, tried, errors)
            except _RETRIED:
                pass
        raise ModelError(f"model {pool.model!r}: {len(errors)} attempts failed: " + "; ".join(errors))

    async def _try(
        self,
        pool: Pool,
        entry: ModelEntry,
        body: dict[str, Any],
        sid: str,
        want_ids: bool,
        tried: set[str],
        errors: list[str],
    ) -> tuple[list[dict[str, Any]], Usage, str | None, Turn | None]:
        """One attempt on a replica it has not tried yet (if there is one); a failure is recorded."""
        if not pool.by_url:
            await pool.wait_for_endpoints(NO_ENDPOINT_WAIT_S)  # all may have left since the last try
        async with pool.lease(sid, tried) as ep:
            try:
                out = await self._attempt(ep, entry, body, sid, want_ids)
            except _RETRIED as exc:
                reason = _describe(exc, entry.timeout_s)
                errors.append(f"{ep.url}: {reason}")
                tried.add(ep.url)
                pool.failed(ep, reason)
                raise
        pool.succeeded(ep)
        return out

    async def _attempt(
        self, ep: Endpoint, entry: ModelEntry, body: dict[str, Any], sid: str, want_ids: bool
    ) -> tuple[list[dict[str, Any]], Usage, str | None, Turn | None]:
        try:
            responses = not want_ids and _responses_known(ep, entry)
            if responses is None:  # not known yet: asked of the replica once
                responses = await self._responses_first(ep, entry)
            if responses:
                reply = await self._responses(ep, entry, body, sid)
                if reply is not None:
                    return _finish(reply, None)
            chat_body = translate.request_to_chat(body, entry.reasoning)
            if want_ids:
                chat_body.update(tokens.REQUEST_FIELDS)
            resp = await self._post(ep.url, "/chat/completions", chat_body, sid, entry.timeout_s)
            reply = translate.chat_to_output(resp, entry.reasoning)
            turn = None
            if want_ids:
                turn = tokens.turn_from_chat(resp)
                turn.logprobs_mode = await self.logprobs_mode(ep, entry, body["model"])
                turn.constrained = tokens.constrained(body)
            return _finish(reply, turn)
        except translate.ReasoningConflict as exc:
            raise ModelError(f"{ep.url}: {exc}") from exc

    async def _responses_first(self, ep: Endpoint, entry: ModelEntry) -> bool:
        """Whether to call ``/responses``: the api says so, or (``auto``) the replica serves it, which is
        asked once per replica and process however many calls are in flight (`_probe_api`)."""
        if entry.api != "auto":
            return entry.api == "responses"
        if ep.api is None:
            task = ep.facts.get("api")
            if task is None or (task.done() and task.exception() is not None):  # a failed probe is asked again
                task = ep.facts["api"] = asyncio.create_task(self._probe_api(ep.url, entry.timeout_s))
            ep.api = await asyncio.shield(task)
        return ep.api == "responses"

    async def _probe_api(self, url: str, timeout_s: float) -> Api:
        """``POST /responses`` with an empty body: a server with the route rejects the body (4xx) or
        answers; one without says 404/405/501. Nothing is generated."""
        timeout = aiohttp.ClientTimeout(total=min(timeout_s, 30.0))
        headers = _with_trace_context(dict(_JSON))
        async with self._http().post(f"{url}/responses", data=b"{}", headers=headers, timeout=timeout) as resp:
            await resp.read()
            if resp.status in (404, 405, 501):
                log.info("model endpoint %s has no /responses; using /chat/completions", url)
                return "chat"
            if resp.status >= 500:
                raise _Retryable(f"HTTP {resp.status} probing {url}/responses")
            return "responses"

    async def _responses(
        self, ep: Endpoint, entry: ModelEntry, body: dict[str, Any], sid: str
    ) -> translate.Reply | None:
        """One call on ``/responses``; None when the replica has none (then it is Chat from now on)."""
        try:
            resp = await self._post(ep.url, "/responses", _responses_body(body, entry), sid, entry.timeout_s)
        except _Unsupported:
            if entry.api == "responses":
                raise ModelError(f"{ep.url} does not serve /responses (api: responses)") from None
            log.info("model endpoint %s has no /responses; using /chat/completions", ep.url)
            ep.api = "chat"
            return None
        ep.api = "responses"
        return translate.responses_output(resp, entry.reasoning)

    async def logprobs_mode(self, ep: Endpoint, entry: ModelEntry, model: str) -> str:
        """Which logprobs this replica returns: as its deployment says, else probed once per process."""
        if entry.logprobs_mode:
            return entry.logprobs_mode
        task = ep.facts.get("logprobs_mode")
        if task is None:
            probe = sampling.logprobs_mode(self._http(), ep.url, model, headers=_with_trace_context({}))
            task = ep.facts["logprobs_mode"] = asyncio.create_task(probe)
        return str(await asyncio.shield(task))

    async def _post(self, url: str, route: str, body: dict[str, Any], sid: str, timeout_s: float) -> dict[str, Any]:
        timeout = self._timeouts.get(timeout_s)
        if timeout is None:
            timeout = self._timeouts[timeout_s] = aiohttp.ClientTimeout(total=timeout_s)
        # the session id lets routers keep a rollout on one replica
        headers = _with_trace_context({**_JSON, SESSION_HEADER: sid})
        target = self._urls.get((url, route))
        if target is None:
            if len(self._urls) >= _URLS_KEPT:  # replicas come and go (a restarted one on a new port)
                self._urls.clear()
            target = self._urls[(url, route)] = URL(f"{url}{route}")
        async with self._http().post(target, data=_encode(body), timeout=timeout, headers=headers) as resp:
            raw = await resp.read()
            if resp.status == 200:
                try:
                    return _decode(raw)
                except msgspec.DecodeError:
                    if _is_html(resp.content_type, raw):
                        raise _misconfigured(url, route, "200 with an HTML page") from None
                    raise _Retryable(f"HTTP 200 with a body that is not JSON: {_brief(raw)}") from None
            if resp.status in (404, 405) and route == "/responses":
                raise _Unsupported(url)
            return _refused(url, route, resp.status, resp.content_type, raw)


def _with_trace_context(headers: dict[str, str]) -> dict[str, str]:
    """Every request carries the caller's trace context (``traceparent``), also when the HTTP
    instrumentation is off or skipped (a rollout not sampled: see `genai.TracedModel`); when it runs,
    its ``on_request_start`` hook injects its own span's context over this one, so that is the one sent.
    Injected here rather than from an aiohttp ``TraceConfig`` of our own: with one, aiohttp builds
    trace objects and fires its signals on every request (~15 µs of CPU per model call)."""
    propagate.inject(headers)
    return headers


def _responses_known(ep: Endpoint, entry: ModelEntry) -> bool | None:
    """`ModelClient._responses_first` without a coroutine once it is known (every call but the first)."""
    if entry.api != "auto":
        return entry.api == "responses"
    return None if ep.api is None else ep.api == "responses"


def _refused(url: str, route: str, status: int, content_type: str, raw: bytes) -> dict[str, Any]:
    """Raise what a non-200 answer means: retry (429, 5xx from a model server), a misconfigured endpoint
    (no such route, not implemented, an HTML page: never retried), a prompt too long, or a model error."""
    if status in (404, 405, 501) or (status >= 400 and _is_html(content_type, raw)):
        raise _misconfigured(url, route, f"{status}" + (" with an HTML page" if _is_html(content_type, raw) else ""))
    if status in (401, 403):
        raise ModelError(f"{url}{route} answered HTTP {status}: check OPENAI_API_KEY (sent as the bearer token)")
    text = _brief(raw)
    if status == 429 or status >= 500:
        raise _Retryable(f"HTTP {status}: {text}")
    if any(m in text.lower() for m in _CONTEXT_MARKERS):
        raise ContextLength(f"HTTP {status} from {url}{route}: {text}")
    raise ModelError(f"HTTP {status} from {url}{route}: {text}")


def _misconfigured(url: str, route: str, answer: str) -> ModelError:
    return ModelError(
        f"{url}{route} answered HTTP {answer}: not an OpenAI-compatible model server (expected POST {route} "
        "to answer JSON; check the model's base URL, which usually ends in /v1)"
    )


def _is_html(content_type: str, raw: bytes) -> bool:
    return "html" in content_type or raw.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html"))


def _brief(raw: bytes, limit: int = 300) -> str:
    """An error body for a one-line reason: the JSON error message when there is one, else the text,
    whitespace folded and cut at ``limit`` characters."""
    text = _text(raw)
    try:
        err = json.loads(text).get("error")
        text = str(err.get("message") if isinstance(err, dict) else err or text)
    except (ValueError, AttributeError):
        pass
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _responses_body(body: dict[str, Any], entry: ModelEntry) -> dict[str, Any]:
    return {**body, "input": translate.responses_input(body["input"], entry.reasoning)}


def _finish(reply: translate.Reply, turn: Turn | None) -> tuple[list[dict[str, Any]], Usage, str | None, Turn | None]:
    if turn is not None:
        tokens.attach(reply.items, turn)
    usage = Usage(
        input_tokens=int(reply.usage.get("input_tokens") or 0), output_tokens=int(reply.usage.get("output_tokens") or 0)
    )
    return reply.items, usage, reply.finish_reason, turn


def _describe(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"timed out after {timeout_s:g} s"
    if isinstance(exc, _Retryable):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
