"""Named models an environment calls itself (judges, reward models), through the model tier.

    JUDGE = Model("judge", fleet_limit=8)          # module level, next to the Environment
    verdict = await JUDGE.ask(prompt)              # inside verify (or a tool): the reply's text

A call goes where the ``models`` KV bucket says the model named ``judge`` is served, with the policy
client's routing (sticky per session, least in flight), retries and ``model_error`` past them, and a
GenAI span: the worker binds its traced model client and the rollout while the verifier and tools run
(`bound`; runtime/engine/clients.py), so every call is counted per model (calls, tokens) into the
Result's verifier info under ``models``.

``fleet_limit`` bounds the calls in flight to that model across every replica of every worker: a
semaphore in the KV store (bucket ``semaphores``), one key per slot, taken by compare-and-set create
and given back by delete; a slot whose holder died expires after ``lease_s``. A call waits for a slot
(within its step's deadline). ``GYMBUS_FLEET_LIMIT_<NAME>`` overrides the limit per deployment.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BadRequestError, KeyWrongLastSequenceError, NotFoundError

from broker.schemas import Options, Session
from runtime.items import message_text

SEMAPHORES = "semaphores"


@dataclass
class Binding:
    """What a model call made by an environment needs: the worker's client, and the rollout."""

    js: JetStreamContext
    session: Session
    respond: Any
    usage: dict[str, dict[str, int]] = field(default_factory=dict)


_BOUND: contextvars.ContextVar[Binding | None] = contextvars.ContextVar("gymbus_env_models", default=None)
@contextlib.contextmanager
def bound(js: JetStreamContext, session: Session, respond: Any = None) -> Iterator[Binding]:
    """Bind ``session`` for the environment code run inside: its model calls go through ``respond``
    (the worker's traced model client) and are made for this rollout."""
    binding = Binding(js, session, respond)
    token = _BOUND.set(binding)
    try:
        yield binding
    finally:
        _BOUND.reset(token)


@dataclass(frozen=True)
class Model:
    """A named model an environment calls (see the module docstring)."""

    name: str
    fleet_limit: int | None = None
    """At most this many calls in flight across all replicas (None: no fleet-wide bound)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Default create parameters of every call (e.g. ``{"temperature": 0}``); a call's own win."""
    lease_s: float = 300.0
    """A fleet slot's lease: a holder that died frees it after this long."""

    async def respond(self, input: str | list[dict[str, Any]], **params: Any) -> list[dict[str, Any]]:
        """Call the model once; its output items. Raises ModelError past the retry budget."""
        binding = _BOUND.get()
        if binding is None:
            raise RuntimeError(f"model {self.name!r} can only be called from a verifier or tool the runtime runs")
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        session = msgspec.structs.replace(binding.session, model=self.name, options=Options())
        body = {**self.params, **params, "model": self.name}
        if binding.respond is None:
            raise RuntimeError(f"model {self.name!r}: this worker has no model client for its environment")
        async with self._slot(binding.js):
            out = await binding.respond(items, body, session)
        used = binding.usage.setdefault(self.name, {"calls": 0, "input_tokens": 0, "output_tokens": 0})
        used["calls"] += 1
        used["input_tokens"] += out.usage.input_tokens
        used["output_tokens"] += out.usage.output_tokens
        return list(out.items)

    async def ask(self, input: str | list[dict[str, Any]], **params: Any) -> str:
        """Call the model once; the text of its last message (empty if it gave none)."""
        items = await self.respond(input, **params)
        texts = [message_text(i) for i in items if i.get("type") == "message"]
        return texts[-1] if texts else ""

    def limit(self) -> int | None:
        env = os.environ.get(f"GYMBUS_FLEET_LIMIT_{self.name.upper().replace('-', '_')}")
        return int(env) if env else self.fleet_limit

    @contextlib.asynccontextmanager
    async def _slot(self, js: JetStreamContext) -> AsyncIterator[None]:
        limit = self.limit()
        if not limit or js is None:  # no broker (the verifier benchmark): nothing to share a bound with
            yield
            return
        kv = await _semaphores(js)
        key = await _acquire(kv, self.name, limit, self.lease_s)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(kv.delete(key))


async def _semaphores(js: JetStreamContext) -> Any:
    try:
        return await js.key_value(SEMAPHORES)
    except (NotFoundError, BadRequestError):
        with contextlib.suppress(BadRequestError):  # another worker created it first
            await js.create_key_value(KeyValueConfig(bucket=SEMAPHORES, history=1, storage=StorageType.FILE))
        return await js.key_value(SEMAPHORES)


async def _acquire(kv: Any, name: str, limit: int, lease_s: float) -> str:
    """Take one of ``limit`` slots of ``name``, waiting (jittered polls) until one is free."""
    prefix = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    wait = 0.01
    while True:
        for i in random.sample(range(limit), limit):
            key = f"{prefix}.{i}"
            try:
                await kv.create(key, b"1", msg_ttl=lease_s)
                return key
            except (KeyWrongLastSequenceError, BadRequestError):
                continue
        await asyncio.sleep(wait * random.uniform(0.5, 1.5))
        wait = min(wait * 2, 0.2)


async def in_flight(js: JetStreamContext, name: str, limit: int) -> int:
    """Slots of ``name`` taken right now (for tests and `gymbus status`)."""
    kv = await _semaphores(js)
    taken = 0
    for i in range(limit):
        with contextlib.suppress(Exception):
            entry = await kv.get(f"{name}.{i}")
            taken += entry.value is not None and entry.operation is None
    return taken
