"""Where a model is served, and which replica takes the next call.

A model's deployment is one value in the ``models`` KV bucket (key: `model_key`), written by
``gymbus model serve`` (the launcher) or by ``gymbus collect`` for a configured URL; a worker
watches it live, so replicas can come and go during a run. A static URL list (``--model-url``)
works the same, with its settings from ``GYMBUS_MODEL_*`` variables.

Choosing a replica for a call (`Pool.lease`):

- **sticky**: the session's preferred replica is the top of a rendezvous hash of (session, url), so
  every worker process sends a rollout's turns to the same replica (prefix-cache hits) with no
  shared state, and only the sessions of a replica that leaves move;
- **least in flight**: the preferred replica is taken unless it has ``slack`` more calls in flight
  than the least loaded one, which then takes the call;
- **healthy first**: a replica that failed (connection error, 5xx, 429, timeout) is taken out and
  probed back (``GET <url>/models`` answers below 500) with a doubling cool-down; if every replica is out, the least
  recently failed is tried anyway, so health steers and never blocks;
- **bounded**: at most ``max_in_flight`` calls per replica; more wait for a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import aiohttp
import msgspec
from msgspec import Meta
from nats.js import JetStreamContext

from broker import topology
from runtime.errors import ModelError

log = logging.getLogger("gymbus.endpoints")

Api = Literal["auto", "responses", "chat"]
Reasoning = Literal["server", "think_tags"]


class ModelEntry(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A model's deployment: the ``models`` KV value. Every field but ``endpoints`` has a default,
    so an entry written as ``{"endpoints": [...]}`` (or by an older gymbus) stays valid."""

    endpoints: list[str] = []
    """OpenAI-compatible base URLs of the live replicas (``http://host:port/v1``)."""
    api: Api = "auto"
    """Wire format: ``auto`` probes ``/responses`` once per replica and falls back to Chat Completions."""
    reasoning: Reasoning = "server"
    """The one layer that parses reasoning: the server's ``reasoning`` field, or ``<think>`` tags here."""
    timeout_s: Annotated[float, Meta(gt=0)] = 300.0
    """Budget of one HTTP attempt."""
    attempts: Annotated[int, Meta(ge=1)] = 4
    """Attempts per model call (connection errors, 5xx, 429 and timeouts are retried, on another replica
    when there is one); past them the rollout fails with ``model_error``."""
    max_in_flight: Annotated[int, Meta(ge=1)] = 256
    """Calls in flight per replica, per worker process; more wait for a slot."""
    sampling: dict[str, Any] = {}
    """Deployment defaults for sampling parameters the task does not set (e.g. vLLM's neutral ``top_k``)."""
    logprobs_mode: str = ""
    """Which logprobs the servers return (vLLM ``--logprobs-mode``, set by ``gymbus model serve``);
    "" makes the client probe each replica once (see `runtime.model.sampling`)."""
    end_of_turn: str = "<|im_end|>"
    """The token that ends a model turn in the chat template (token_exact splices after it)."""
    policy_version: int = 0
    """The policy version these endpoints serve (set by a trainer); recorded for every model call."""
    written_by: str = ""
    """Who registered this deployment (``gymbus collect``, ``gymbus model serve``, ...), for `gymbus status`."""
    written_at: float = 0.0
    """Unix time it was registered."""


_ENV_FIELDS = ("api", "reasoning", "timeout_s", "attempts", "max_in_flight")
entry_decoder = msgspec.json.Decoder(ModelEntry)


def entry_from_env(urls: list[str], environ: dict[str, str] | None = None) -> ModelEntry:
    """A static deployment: ``urls`` with ``GYMBUS_MODEL_<FIELD>`` overrides (e.g. ``GYMBUS_MODEL_TIMEOUT_S``)."""
    env = os.environ if environ is None else environ
    raw: dict[str, Any] = {"endpoints": urls}
    for name in _ENV_FIELDS:
        value = env.get(f"GYMBUS_MODEL_{name.upper()}")
        if value is not None:
            raw[name] = value
    try:
        return msgspec.convert(raw, ModelEntry, strict=False)
    except msgspec.ValidationError as exc:
        raise ModelError(f"GYMBUS_MODEL_* settings: {exc}") from exc


def model_key(model: str) -> str:
    """KV key of a model name (KV keys allow ``[-/_=.a-zA-Z0-9]``)."""
    return "".join(c if c.isalnum() or c in "-/_=." else "_" for c in model)


async def register(js: JetStreamContext, model: str, endpoints: list[str], api: str = "auto", **settings: Any) -> None:
    """Publish a model's deployment to the ``models`` bucket, replacing what was there: every setting not
    given takes its default, so a caller registers the whole deployment (``runs.models.register_model``)."""
    settings.setdefault("written_at", time.time())
    entry = msgspec.convert({"endpoints": endpoints, "api": api, **settings}, ModelEntry)
    kv = await js.key_value(topology.MODELS)
    await kv.put(model_key(model), msgspec.json.encode(entry))


async def deregister(js: JetStreamContext, model: str) -> None:
    """Remove a model from the ``models`` bucket (workers see no endpoints for it)."""
    kv = await js.key_value(topology.MODELS)
    await kv.delete(model_key(model))


@dataclass(eq=False)
class Endpoint:
    """One replica as this process sees it."""

    url: str
    slots: asyncio.Semaphore
    in_flight: int = 0
    served: int = 0
    """Calls it answered."""
    failed: int = 0
    """Failed attempts, in total."""
    down_since: float | None = None
    """Monotonic time it was taken out; None while healthy."""
    cooldown_s: float = 0.5
    api: Api | None = None
    """The wire format probed for it (``auto`` deployments)."""
    facts: dict[str, asyncio.Task[Any]] = field(default_factory=dict)
    """What was asked of this replica once per process (logprobs mode, end-of-turn token id)."""
    last_error: str = ""

    @property
    def healthy(self) -> bool:
        return self.down_since is None


def rendezvous(session: str, url: str) -> int:
    """Rendezvous-hash weight of a replica for a session: the highest weight is its preferred replica."""
    return int.from_bytes(hashlib.blake2b(f"{session}|{url}".encode(), digest_size=8).digest(), "big")


@dataclass(eq=False)
class Pool:
    """The live replicas of one model and their load; shared by every call of a worker process."""

    model: str
    entry: ModelEntry = field(default_factory=ModelEntry)
    slack: int = 2
    by_url: dict[str, Endpoint] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    _probes: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _http: aiohttp.ClientSession | None = None

    def update(self, entry: ModelEntry) -> None:
        """Take a new deployment: keep the state of replicas that stay, add new ones, drop the rest."""
        urls = list(dict.fromkeys(u.rstrip("/") for u in entry.endpoints))
        self.entry = entry
        self.by_url = {u: self.by_url.get(u) or Endpoint(u, asyncio.Semaphore(entry.max_in_flight)) for u in urls}
        for url in list(self._probes):
            if url not in self.by_url:
                self._probes.pop(url).cancel()
        self.changed.set()
        log.info("model %s endpoints: %s", self.model, urls or "none")

    def pick(self, session: str, avoid: Collection[str] = ()) -> Endpoint:
        """The replica for this call (see the module docstring)."""
        if len(self.by_url) == 1:  # the one replica whatever its health: skip the hashing per call
            return next(iter(self.by_url.values()))
        eps = list(self.by_url.values())
        if not eps:
            raise ModelError(f"model {self.model!r} has no live endpoints")
        fresh = [e for e in eps if e.url not in avoid] or eps
        pool = [e for e in fresh if e.healthy] or sorted(fresh, key=lambda e: e.down_since or 0.0)[:1]
        if len(pool) == 1:
            return pool[0]
        weighed = [(rendezvous(session, e.url), e) for e in pool]  # each weight hashed once
        preferred = max(weighed, key=lambda w: w[0])[1]
        least = min(weighed, key=lambda w: (w[1].in_flight, -w[0]))[1]
        return preferred if preferred.in_flight <= least.in_flight + self.slack else least

    def lease(self, session: str, avoid: Collection[str] = ()) -> Lease:
        """Hold a slot on the chosen replica for one HTTP attempt (``async with pool.lease(...) as ep``)."""
        return Lease(self, session, avoid)

    async def wait_for_endpoints(self, timeout_s: float) -> None:
        """Return once the model has endpoints, or raise ModelError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.by_url:
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise ModelError(
                    f"model {self.model!r} has no live endpoints in the models bucket (waited {timeout_s:g} s): "
                    "start it with `gymbus model serve`, or give --model-url"
                )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self.changed.wait()

    def succeeded(self, ep: Endpoint) -> None:
        ep.served += 1
        if not ep.healthy:
            self._up(ep, "answered")

    def failed(self, ep: Endpoint, reason: str) -> None:
        """An attempt on ``ep`` failed transiently: take it out and probe it back."""
        ep.failed += 1
        ep.last_error = reason
        if ep.healthy and ep.url in self.by_url:
            ep.down_since = time.monotonic()
            log.warning("model %s: endpoint %s taken out (%s)", self.model, ep.url, reason)
            self._probes[ep.url] = asyncio.create_task(self._probe(ep))

    def _up(self, ep: Endpoint, how: str) -> None:
        ep.down_since, ep.cooldown_s = None, 0.5
        log.warning("model %s: endpoint %s back in (%s)", self.model, ep.url, how)

    async def _probe(self, ep: Endpoint) -> None:
        while not ep.healthy and self.by_url.get(ep.url) is ep:
            await asyncio.sleep(ep.cooldown_s)
            if await self._alive(ep.url):
                self._up(ep, "probe answered")
                return
            ep.cooldown_s = min(ep.cooldown_s * 2, 30.0)

    async def _alive(self, url: str) -> bool:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession()
        try:
            async with self._http.get(f"{url}/models", timeout=aiohttp.ClientTimeout(total=2.0)) as resp:
                return resp.status < 500  # any answer but a server error: it is up (401 without a key too)
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def close(self) -> None:
        for task in self._probes.values():
            task.cancel()
        self._probes.clear()
        if self._http is not None:
            await self._http.close()


class Lease:
    """`Pool.lease`: the replica is chosen on entry, counted in flight until exit, and holds one of its
    slots meanwhile. A class rather than an ``asynccontextmanager``, which costs ~2 µs more per call."""

    __slots__ = ("_avoid", "_pool", "_session", "ep")

    def __init__(self, pool: Pool, session: str, avoid: Collection[str]) -> None:
        self._pool, self._session, self._avoid = pool, session, avoid

    async def __aenter__(self) -> Endpoint:
        ep = self.ep = self._pool.pick(self._session, self._avoid)
        ep.in_flight += 1
        try:
            await ep.slots.acquire()
        except BaseException:
            ep.in_flight -= 1
            raise
        return ep

    async def __aexit__(self, *exc: object) -> None:
        self.ep.slots.release()
        self.ep.in_flight -= 1


class Endpoints:
    """The pools of every model a worker calls: from a static URL list, else the ``models`` bucket, watched."""

    def __init__(self, js: JetStreamContext | None = None, static: str | None = None) -> None:
        self._js = js
        self._static = [u.strip() for u in static.split(",") if u.strip()] if static else None
        self._pools: dict[str, Pool] = {}
        self._watchers: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._lock = asyncio.Lock()

    def opened(self, model: str) -> Pool | None:
        """The model's pool if it is open already (`pool` without a coroutine, for every call but the first)."""
        return self._pools.get(model)

    async def pool(self, model: str) -> Pool:
        """The model's pool; the first call for a model starts watching its KV key."""
        if model in self._pools:
            return self._pools[model]
        async with self._lock:
            if model not in self._pools:
                self._pools[model] = await self._open(model)
        return self._pools[model]

    async def _open(self, model: str) -> Pool:
        pool = Pool(model)
        if self._static:
            pool.update(entry_from_env(self._static))
            return pool
        if self._js is None:
            raise ModelError(f"no endpoint for model {model!r}: give --model-url or register it in the models bucket")
        kv = await self._js.key_value(topology.MODELS)
        watcher = await kv.watch(model_key(model))
        self._watchers.append(watcher)
        first = await watcher.updates(timeout=10.0)  # the current value, or None when there is none
        if first is not None:
            pool.update(_decode(model, first))
            await watcher.updates(timeout=10.0)  # the end-of-initial-values marker
        self._tasks.append(asyncio.create_task(self._follow(model, watcher, pool)))
        return pool

    async def _follow(self, model: str, watcher: Any, pool: Pool) -> None:
        async for entry in watcher:
            if entry is not None:
                pool.update(_decode(model, entry))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for watcher in self._watchers:
            with contextlib.suppress(Exception):
                await watcher.stop()
        for pool in self._pools.values():
            await pool.close()


def _decode(model: str, entry: Any) -> ModelEntry:
    if entry.operation in ("DEL", "PURGE") or not entry.value:
        return ModelEntry()
    try:
        return entry_decoder.decode(entry.value)
    except msgspec.DecodeError as exc:
        log.error("models bucket: entry of %r is invalid (%s); treating it as no endpoints", model, exc)
        return ModelEntry()
