"""The run's model: registered in the ``models`` bucket with its whole deployment, checked before a run.

Every worker calling a model name reads its one entry, so whoever registers it (`gymbus collect`,
`gymbus submit`, `gymbus model serve`) writes every setting, and says who it is.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterable
from typing import Any

import aiohttp
import msgspec
from nats.js import JetStreamContext

from broker import topology
from runtime.errors import InputError
from runtime.judges import Model
from runtime.model import sampling
from runtime.model.endpoints import ModelEntry, entry_decoder, model_key, register
from runtime.runs.config import ModelConfig, RunConfig

log = logging.getLogger("gymbus.models")

CHECK_TIMEOUT_S = 5.0
SIMULATOR_OWNER = "gymbus-simulated-policy"
"""``owned_by`` of the simulated policy's model list: how a run tells it from a model."""


def urls_of(base_url: str | None) -> list[str]:
    return [u.strip().rstrip("/") for u in (base_url or "").split(",") if u.strip()]


async def register_model(js: JetStreamContext, m: ModelConfig, urls: list[str], writer: str) -> None:
    """Register ``m`` served at ``urls``, with all its client settings."""
    await register(
        js, m.name, urls, m.api, reasoning=m.reasoning, timeout_s=m.timeout_s, attempts=m.attempts, written_by=writer
    )


def writer(command: str) -> str:
    return f"gymbus {command} (pid {os.getpid()}, {' '.join(sys.argv[1:3])})"


async def check_endpoints(urls: list[str], model: str) -> dict[str, Any]:
    """Ask every endpoint for its model list (``GET <url>/models``); InputError naming the URL and what
    went wrong if one does not answer as an OpenAI-compatible server serving ``model``. Returns what
    the run folder records of them."""
    owners: set[str] = set()
    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"} if os.environ.get("OPENAI_API_KEY") else {}
    timeout = aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
        for url in urls:
            owners |= await _check_one(http, url, model)
        probes = {url: await sampling.probe(http, url, model, CHECK_TIMEOUT_S) for url in urls}
    for url, found in probes.items():
        for warning in found.warnings(url):
            log.warning(warning)
    return {
        "endpoints": urls,
        "simulated_policy": owners == {SIMULATOR_OWNER} if owners else None,
        "sampling_overridden": {url: p.overridden for url, p in probes.items() if p.overridden},
        "logprobs_mode": {url: p.logprobs_mode for url, p in probes.items()},
    }


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"timed out after {CHECK_TIMEOUT_S:g} s"
    cause = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else exc
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused"
    return str(cause) or type(cause).__name__


async def describe_endpoints(urls: list[str], model: str) -> dict[str, Any]:
    """What a run records of endpoints it did not start (a shared deployment's): like `check_endpoints`,
    but an endpoint that does not answer here leaves ``simulated_policy`` unknown instead of failing."""
    try:
        return await check_endpoints(urls, model)
    except InputError:
        return {"endpoints": urls, "simulated_policy": None}


async def _check_one(http: aiohttp.ClientSession, url: str, model: str) -> set[str]:
    fix = "(model.base_url in the config, or --model-url; --no-check skips this check)"
    try:
        async with http.get(f"{url}/models") as resp:
            status, body = resp.status, await resp.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise InputError(f"model endpoint {url} does not answer: {_why(exc)} {fix}") from None
    if status != 200:
        raise InputError(
            f"model endpoint {url}: GET {url}/models answered HTTP {status}, not an OpenAI-compatible model list "
            f"(a base URL usually ends in /v1) {fix}"
        )
    try:
        served = json.loads(body)["data"]
        ids = {str(m["id"]) for m in served}
    except (ValueError, KeyError, TypeError):
        raise InputError(f"model endpoint {url}: GET {url}/models did not return an OpenAI model list {fix}") from None
    if model not in ids:
        shown = ", ".join(sorted(ids)[:5]) + (" ..." if len(ids) > 5 else "")
        raise InputError(
            f"model endpoint {url} does not serve model {model!r} (it serves: {shown}): set model.name to the "
            f"served model name {fix}"
        )
    return {str(m.get("owned_by", "")) for m in served if str(m.get("id")) == model}


async def registered_entry(js: JetStreamContext, model: str) -> dict[str, Any]:
    """What the ``models`` bucket says of ``model`` (a run with --nats records it; unknown if absent)."""
    try:
        kv = await js.key_value(topology.MODELS)
        entry: ModelEntry = entry_decoder.decode((await kv.get(model_key(model))).value or b"{}")
    except Exception:
        return {"endpoints": [], "simulated_policy": None, "registered": False}
    return {
        "endpoints": entry.endpoints,
        "api": entry.api,
        "registered_by": entry.written_by or None,
        "simulated_policy": None,
    }


async def register_named_models(
    js: JetStreamContext, cfg: RunConfig, policy_urls: list[str], simulated: bool, models: Iterable[Model]
) -> None:
    """The other models the environments (judges) and the agent (simulators) call, as the config's
    ``models`` says; with the simulated policy, one it does not configure is served by it too."""
    named = {m.name: ModelConfig(name=m.name) for m in models}
    for name, model in {**named, **cfg.models}.items():
        urls = urls_of(model.base_url) or (policy_urls if simulated else [])
        if urls:
            await register_model(js, msgspec.structs.replace(model, name=name), urls, writer("collect"))
