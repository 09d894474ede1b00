"""A function's registration (KV ``functions``): what its workers tell the rest of the deployment.

An environment registers its tools, the JSON Schema of its task fields (from ``Environment.meta``,
each field's docstring as its description) and whether it seeds new sessions; an agent registers
its name. Each worker writes it when it starts, before it serves, so an agent worker finds the
environments it runs rollouts on (see admission.py) and the janitor tells an unknown function from
one whose workers are away.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
from nats.js import JetStreamContext

from broker import functions, wireschema
from broker.functions import Registration
from runtime.errors import InputError
from runtime.sdk import Agent, Environment, Function, load

log = logging.getLogger("gymbus.worker")


def meta_schema(env: Environment) -> dict[str, Any] | None:
    """The JSON Schema of the environment's task fields, or None when it declares none."""
    if env.meta is None:
        return None
    out = msgspec.json.schema(env.meta)
    for name, definition in out.get("$defs", {}).items():
        cls = env.meta if env.meta.__name__ == name else None
        if cls is not None:
            wireschema.describe(definition, cls)
    return {"$schema": wireschema.DIALECT, **out}


def registration_of(fn: Function, written_by: str = "") -> Registration:
    if isinstance(fn, Agent):
        return Registration(role="agent", name=fn.name, written_by=written_by, written_at=time.time())
    return Registration(
        role="env",
        name=fn.name,
        tools=fn.tool_specs(),
        meta_schema=meta_schema(fn),
        seed=fn.seed is not None,
        written_by=written_by,
        written_at=time.time(),
        **inline_verifier(fn),
    )


def inline_verifier(env: Environment) -> dict[str, str]:
    """``verify_ref`` and ``verify_digest`` of an environment that declares ``verify_inline``: the module
    attribute holding it (its verifier's module first) and that module's source digest; empty when no
    importable module holds it."""
    if not env.verify_inline:
        return {}
    first = sys.modules.get(env.verify.__module__)
    for module in [first, *list(sys.modules.values())]:
        names = [a for a, v in vars(module).items() if v is env] if module is not None else []
        path = getattr(module, "__file__", None)
        if names and path and module is not None:
            return {"verify_ref": f"{module.__name__}:{names[0]}", "verify_digest": source_digest(path)}
    log.info("environment %r declares verify_inline but no module holds it: verification stays a hop", env.name)
    return {}


def source_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


async def register(js: JetStreamContext, fn: Function, command: str = "worker") -> Registration:
    """Write the function's registration; warn when it replaces one that says otherwise (two versions
    of the function running at once: the last started wins)."""
    who = f"gymbus {command} {fn.name} (pid {os.getpid()} on {socket.gethostname()})"
    mine = registration_of(fn, who)
    old = await functions.read(js, mine.role, mine.name)
    if old is not None and (old.tools, old.meta_schema, old.seed) != (mine.tools, mine.meta_schema, mine.seed):
        log.warning(
            "%s %r: replacing the registration written by %s, which differs", mine.role, fn.name, old.written_by
        )
    await functions.write(js, mine)
    return mine


async def environment_registration(name: str, nats_url: str | None) -> Registration:
    """An environment's registration: read from the broker at ``nats_url``, or made by importing it here
    (``gymbus schema start --env``); InputError naming it if it is neither."""
    if nats_url:
        from broker.connect import connection

        async with connection(nats_url, name="gymbus-schema") as nc:
            reg = await functions.read(nc.jetstream(), "env", name)
        if reg is None:
            raise InputError(
                f"--env {name!r}: no worker of it has registered on {nats_url} (start one, or leave out --nats "
                "to import it here)"
            )
        return reg
    try:
        fn = load(name)
    except (LookupError, ImportError) as exc:
        raise InputError(f"--env {name!r}: {exc} (or give --nats URL to read its registration)") from None
    if not isinstance(fn, Environment):
        raise InputError(f"--env {name!r} is an agent, not an environment")
    return registration_of(fn, "gymbus schema (imported)")
