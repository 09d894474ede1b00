"""Admission: what an agent worker decides about a Start before any model call.

Whatever makes a rollout what it is is decided here, on the worker side, so every producer (the
CLI, a trainer, a Node.js script, ``nats pub``) gets the same rollout for the same row:

    routing        the Start names the agent whose subject it came on, and an environment that exists
                   (registered in KV ``functions``, or served by a consumer); else ``invalid_input``
    run defaults   the run's manifest (KV ``runs``, ``defaults``): sampling parameters and options the
                   Start leaves out, and whether the environment's tools are offered (``env_tools``)
    environment    its registered tools when the Start lists none, its task fields (``meta``) checked
                   against its schema, its ``seed`` step when the Start's options do not say

An environment that is served but not registered yet (a fresh deployment whose environment workers
are scaled to zero) is admitted through its ``seed`` step: the environment worker then applies its
own tools and checks the task fields itself, still before the first model call.

Registrations and manifests are cached (a few seconds; a run's defaults never change), so a Start
costs a dictionary lookup, not a KV read.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import msgspec
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from broker import functions, topology
from broker.denials import PermissionDenied
from broker.functions import Registration
from broker.manifests import Manifest, RunDefaults, manifest_decoder
from broker.schemas import Start
from runtime.errors import InvalidInput

REGISTERED_S = 10.0
"""How long a registration is trusted before it is read again."""
UNREGISTERED_S = 1.0
"""How long "served but not registered" is trusted (its workers register as they start)."""
UNKNOWN_S = 2.0
"""How long an unknown environment stays unknown before it is looked up again."""
MANIFEST_S = 30.0
NO_MANIFEST_S = 1.0
WAIT_ENV = "GYMBUS_REGISTRATION_WAIT_S"
VALID_METAS = 65536
"""Task fields remembered as valid (a run's tasks, each checked once however many repeats it has)."""
_encode_meta = msgspec.msgpack.Encoder(order="deterministic").encode


class _Given(msgspec.Struct):
    options: dict[str, msgspec.Raw] = {}


_given = msgspec.json.Decoder(_Given)


@dataclass
class Admission:
    """One per worker: resolves Starts (agent workers) and run defaults (environment workers)."""

    js: JetStreamContext
    agent: str = ""
    """The agent this worker serves (Starts naming another are refused)."""
    wait_s: float = field(default_factory=lambda: float(os.environ.get(WAIT_ENV) or 5.0))
    """How long an environment neither registered nor served may take to appear before it is unknown."""
    _envs: dict[str, tuple[Registration | InvalidInput | None, float]] = field(default_factory=dict)
    _runs: dict[str, tuple[RunDefaults, float]] = field(default_factory=dict)
    _validators: dict[tuple[str, float], jsonschema.protocols.Validator] = field(default_factory=dict)
    _valid: dict[tuple[tuple[str, float], bytes], None] = field(default_factory=dict)
    _waits: dict[str, asyncio.Task[Registration | None]] = field(default_factory=dict)
    _kv: dict[str, KeyValue] = field(default_factory=dict)

    async def admit(self, msg: Start, raw: bytes) -> Start:
        """The Start as the rollout runs it: checked, with the run's and the environment's defaults
        applied; InvalidInput (naming the field) if it cannot run."""
        if msg.agent != self.agent:
            raise InvalidInput(
                f"the Start names agent {msg.agent!r} but was published to {topology.agent_subject(self.agent)}, "
                f"which agent {self.agent!r} serves: publish it to {topology.agent_subject(msg.agent)} - at `$.agent`"
            )
        defaults = await self.defaults(msg.run_id)
        reg = await self.environment(msg.env)
        given = set(_given.decode(raw).options)
        params = {k: v for k, v in msg.responses_create_params.items() if v is not None}
        for key, value in defaults.sampling.given().items():
            params.setdefault(key, value)
        if "tools" not in params and defaults.env_tools and reg is not None and reg.tools:
            params["tools"] = reg.tools
        options = msgspec.structs.replace(defaults.options, **{f: getattr(msg.options, f) for f in given})
        if "seed" not in given and not options.seed and (reg is None or reg.seed):
            options = msgspec.structs.replace(options, seed=True)  # the environment's seed step (or its admission)
        if reg is not None:
            self.check_meta(reg, msg.meta)
        return msgspec.structs.replace(msg, responses_create_params=params, options=options)

    def check_meta(self, reg: Registration, meta: dict[str, Any]) -> None:
        """InvalidInput naming the field if ``meta`` breaks the environment's schema of its task fields.

        jsonschema takes ~60 µs for a small object, so a task's fields found valid are remembered: the
        other repeats of the task cost one msgpack encoding (~1 µs)."""
        if reg.meta_schema is None:
            return
        key = (reg.name, reg.written_at)
        validator = self._validators.get(key)
        if validator is None:
            validator = self._validators[key] = jsonschema.Draft202012Validator(_inline_root(reg.meta_schema))
        seen = (key, _encode_meta(meta))
        if seen in self._valid:
            return
        if validator.is_valid(meta):
            self._valid.setdefault(seen, None)
            if len(self._valid) > VALID_METAS:
                self._valid.clear()
            return
        error = jsonschema.exceptions.best_match(validator.iter_errors(meta))
        assert error is not None
        raise InvalidInput(
            f"{error.message} - at `$.meta{error.json_path[1:]}` (environment {reg.name!r} reads these task "
            f"fields: `gymbus schema start --env {reg.name}`)"
        )

    async def defaults(self, run_id: str) -> RunDefaults:
        """The run's defaults from its manifest (none written: the built-in ones)."""
        now = time.monotonic()
        cached = self._runs.get(run_id)
        if cached is not None and cached[1] > now:
            return cached[0]
        key = topology.manifest_key(run_id)
        try:
            entry = await (await self._bucket(topology.RUNS)).get(key)
        except KeyNotFoundError:
            self._remember(self._runs, run_id, RunDefaults(), NO_MANIFEST_S)
            return RunDefaults()
        try:
            manifest: Manifest = manifest_decoder.decode(entry.value or b"{}")
        except msgspec.DecodeError as exc:
            raise InvalidInput(f"the run's manifest (KV {topology.RUNS}, key {key}) is invalid: {exc}") from None
        self._remember(self._runs, run_id, manifest.defaults, MANIFEST_S)
        return manifest.defaults

    async def environment(self, name: str) -> Registration | None:
        """The environment's registration; None if it is served but not registered yet; InvalidInput
        if it is neither after ``wait_s`` (shared by every Start waiting on the same name)."""
        cached = self._envs.get(name)
        if cached is not None and cached[1] > time.monotonic():
            if isinstance(cached[0], InvalidInput):
                raise cached[0]
            return cached[0]
        waiting = self._waits.get(name)
        if waiting is None:
            waiting = self._waits[name] = asyncio.ensure_future(self._look_up(name))
            waiting.add_done_callback(lambda _: self._waits.pop(name, None))
        return await asyncio.shield(waiting)

    async def _look_up(self, name: str) -> Registration | None:
        deadline = time.monotonic() + self.wait_s
        while True:
            reg = await functions.read(self.js, "env", name)
            if reg is not None:
                return self._remember(self._envs, name, reg, REGISTERED_S)
            if await _served(self.js, name):
                return self._remember(self._envs, name, None, UNREGISTERED_S)
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.25)
        try:
            known = ", ".join(sorted(n for role, n in await functions.registered(self.js) if role == "env")) or "none"
        except PermissionDenied:
            known = "not listed to this identity"
        unknown = InvalidInput(
            f"unknown environment {name!r}: no worker of it has registered (KV {topology.FUNCTIONS}) and none serves "
            f"{topology.tool_subject(name)} (registered environments: {known}) - at `$.env`"
        )
        self._remember(self._envs, name, unknown, UNKNOWN_S)
        raise unknown

    def _remember(self, cache: dict[str, Any], key: str, value: Any, ttl: float) -> Any:
        if len(cache) > 4096:
            cache.clear()
        cache[key] = (value, time.monotonic() + ttl)
        return value

    async def _bucket(self, name: str) -> KeyValue:
        kv = self._kv.get(name)
        if kv is None:
            kv = self._kv[name] = await self.js.key_value(name)
        return kv


async def _served(js: JetStreamContext, env: str) -> bool:
    """Whether the environment's tool consumer exists (one this worker's identity may not see, outside
    its deployment, is not served to it)."""
    try:
        return await topology.has_consumer(js, "tool", env)
    except PermissionDenied:
        return False


def _inline_root(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with its top-level ``$ref`` to one of its ``$defs`` replaced by that definition
    (msgspec writes a struct's schema that way): the same validation, half the work per check."""
    ref, defs = schema.get("$ref"), schema.get("$defs", {})
    if not isinstance(ref, str) or not ref.startswith("#/$defs/") or ref.removeprefix("#/$defs/") not in defs:
        return schema
    rest = {k: v for k, v in schema.items() if k != "$ref"}
    return {**rest, **defs[ref.removeprefix("#/$defs/")]}


def rejection(role: str, data: bytes, exc: msgspec.DecodeError) -> str:
    """Why a message that does not decode is rejected, with the fix for a producer's usual mistakes."""
    reason = f"invalid {role} message: {exc}" + ("" if " - at `" in str(exc) else " - at `$`")
    if role != "agent":
        return reason
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return f"{reason} (a task is one JSON object: `gymbus schema start`)"
    if not isinstance(raw, dict):
        return reason
    if "responses_create_params" in raw and not {"kind", "run_id"} <= set(raw):
        return (
            f"{reason}. This is a task row, not a Start: publish it as one (kind: start, run_id, task_index, "
            "agent, env, the row's responses_create_params, and its other fields under meta: `gymbus schema start`)"
        )
    if "unknown field" in str(exc) and " - at `" not in str(exc):
        return f"{reason} (a task row's own fields, such as expected_answer, go under `meta`)"
    return reason
