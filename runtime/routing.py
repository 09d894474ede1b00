"""Which agent and environment a task row runs on: a run may mix environments.

Below the model tier (the simulated policy routes rows too); runtime/runs/routing.py routes a run's
task rows with it.

A row names its environment with ``env`` (a gymbus name, e.g. ``"mcqa"``) and optionally its agent
with ``agent``; or it carries NeMo Gym's ``agent_ref`` (``{"type": "responses_api_agents", "name":
"wordle_gymnasium_agent"}``), whose name is routed to the environment that accepts that resources
server: an environment's own name or one of its ``accepts`` equal to the name, or the longest of them
that the name starts with followed by ``_``. A row that names nothing runs on the run's ``agent`` and
``env``. A row routed to another environment than the run's takes that environment's default agent
unless it names one. A run whose environment accepts ``"*"`` (a bridge to another ecosystem's
servers) keeps its rows whatever their ``agent_ref`` names; the bridge reads it itself.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from broker import names
from runtime.errors import InvalidInput
from runtime.sdk import Environment, load

log = logging.getLogger("gymbus.routing")


@dataclass(frozen=True)
class Route:
    agent: str
    env: str


def route(row: Mapping[str, Any], agent: str, env: str) -> Route:
    """The row's agent and environment (the run's ``agent`` and ``env`` when it names neither);
    InvalidInput names the field when it names what gymbus does not have."""
    named_env = row.get("env")
    if named_env is not None:
        if not isinstance(named_env, str) or not names.valid(named_env):
            raise InvalidInput(f"task field `env` {named_env!r} is not an environment name ({names.RULE})")
        target = named_env
    elif row.get("agent_ref") is not None and not _takes_every_row(env):
        target = _from_agent_ref(row["agent_ref"])
    else:
        target = env
    named_agent = row.get("agent")
    if named_agent is not None:
        if not isinstance(named_agent, str) or not names.valid(named_agent):
            raise InvalidInput(f"task field `agent` {named_agent!r} is not an agent name ({names.RULE})")
        return Route(named_agent, target)
    if target == env:
        return Route(agent, env)
    found = catalog().get(target)
    return Route(found.agent if found is not None else agent, target)


def _takes_every_row(env: str) -> bool:
    """Whether the run's environment takes every row of the run whatever its ``agent_ref`` names (a
    bridge to another ecosystem's servers, declared with ``accepts=["*"]``)."""
    found = catalog().get(env)
    return found is not None and "*" in found.accepts


def _from_agent_ref(ref: Any) -> str:
    name = ref.get("name") if isinstance(ref, Mapping) else ref
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"task field `agent_ref` {ref!r} has no `name`")
    envs = catalog()
    if name in envs:
        return name
    aliases = {alias: env.name for env in envs.values() for alias in (env.name, *env.accepts) if alias != "*"}
    if name in aliases:
        return aliases[name]
    matches = [a for a in aliases if name.startswith(f"{a}_")]
    if not matches:
        raise InvalidInput(
            f"task field `agent_ref.name` {name!r} names no environment gymbus has "
            f"(known: {', '.join(sorted(aliases))}); name one with the row's `env` field"
        )
    return aliases[max(matches, key=len)]


@cache
def catalog() -> dict[str, Environment]:
    """Every environment under ``functions/`` that imports here, by name."""
    import functions

    found: dict[str, Environment] = {}
    for info in pkgutil.iter_modules(functions.__path__):
        if not info.ispkg:
            continue
        try:
            module = importlib.import_module(f"functions.{info.name}")
        except Exception as exc:  # an environment whose requirements are not installed here
            log.debug("functions.%s does not import here: %s", info.name, exc)
            continue
        env = getattr(module, "ENVIRONMENT", None)
        if isinstance(env, Environment):
            found[env.name] = env
    return found


def environment(name: str) -> Environment | None:
    """The environment ``name`` (under functions/), or None if it does not import here."""
    try:
        fn = load(name)
    except (LookupError, ImportError):
        return None
    return fn if isinstance(fn, Environment) else None
