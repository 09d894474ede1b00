"""The ``functions`` KV bucket: every agent and environment as its workers registered it.

    functions  agent.<name>   an agent that has run on this broker
               env.<name>     an environment: its tools, the JSON Schema of its task fields, its seed

Each worker writes its function's registration when it starts (the last start wins; it says who
wrote it and when). Agent workers read environments' registrations to decide a rollout on the
worker side (the tools offered when a Start lists none, the task fields checked before any model
call), the janitor reads them to tell an unknown function from one whose workers are away, and
`gymbus schema start --env ENV --nats URL` prints the Start schema of a registered environment.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NoKeysError

from broker import topology
from broker.schemas import Name

FunctionRole = Literal["agent", "env"]


class Registration(msgspec.Struct, kw_only=True):
    """A function's registration in the KV bucket ``functions``, under ``<role>.<name>`` (``env.math``,
    ``agent.simple_agent``), written by each of its workers when it starts."""

    role: FunctionRole
    """``agent`` or ``env``."""
    name: Name
    """The function's name: its subjects are ``gym.agent.<name>`` and ``gym.agent.<name>.resume``, or
    ``gym.tool.<name>`` and ``gym.verify.<name>``."""
    tools: list[dict[str, Any]] = []
    """The environment's tools as Responses ``tools`` entries: offered to the model when a Start lists none."""
    meta_schema: dict[str, Any] | None = None
    """JSON Schema (2020-12) of the task fields (a Start's ``meta``) the environment reads; null: any object."""
    seed: bool = False
    """The environment sets up each new session (``seed``) before the first agent turn."""
    verify_ref: str = ""
    """Import string of an environment whose verifier agent workers may run in their own turn
    (``Environment.verify_inline``); empty: verification is a hop to ``gym.verify.<name>``."""
    verify_digest: str = ""
    """SHA-256 of the source file ``verify_ref`` names: an agent worker verifies inline only with the same code."""
    written_by: str = ""
    """Who wrote this registration (command, process id, host)."""
    written_at: float = 0.0
    """Unix time it was written."""


decoder = msgspec.json.Decoder(Registration)
_encode = msgspec.json.Encoder().encode


def key(role: FunctionRole, name: str) -> str:
    return f"{role}.{name}"


async def write(js: JetStreamContext, registration: Registration) -> None:
    kv = await js.key_value(topology.FUNCTIONS)
    await kv.put(key(registration.role, registration.name), _encode(registration))


async def read(js: JetStreamContext, role: FunctionRole, name: str) -> Registration | None:
    """The function's registration, or None if none of its workers ever started on this broker."""
    kv = await js.key_value(topology.FUNCTIONS)
    try:
        entry = await kv.get(key(role, name))
    except KeyNotFoundError:
        return None
    return decoder.decode(entry.value or b"{}")


async def registered(js: JetStreamContext) -> set[tuple[FunctionRole, str]]:
    """(role, name) of every registered function."""
    kv = await js.key_value(topology.FUNCTIONS)
    try:
        keys = await kv.keys()
    except NoKeysError:
        return set()
    out: set[tuple[FunctionRole, str]] = set()
    for k in keys:
        role, _, name = k.partition(".")
        if role == "agent":
            out.add(("agent", name))
        elif role == "env":
            out.add(("env", name))
    return out
