"""What a run is, known before anything starts: everything that can be refused is refused here."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, TypeVar

from nats.js import JetStreamContext

from broker import names, topology
from broker.manifests import RunIdentity
from broker.topology import Role
from runtime.errors import InputError
from runtime.judges import Model
from runtime.runs import identity as identities
from runtime.runs.config import RunConfig
from runtime.runs.fit import check_fit
from runtime.runs.keys import Grid
from runtime.runs.models import check_endpoints, urls_of
from runtime.runs.routing import route_tasks
from runtime.runs.tasks import TaskRow, read_tasks
from runtime.sdk import Agent, Environment, load

log = logging.getLogger("gymbus.collect")

def new_run_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


@dataclass
class Plan:
    """What a run is, known before anything starts."""

    cfg: RunConfig
    run_id: str
    tasks: list[TaskRow]
    identity: RunIdentity
    env: Environment | None
    """The environment, checked to be what the run says (None with --nats when it is not importable here)."""
    model: dict[str, Any] = field(default_factory=dict)
    """What the pre-flight check learnt of the model endpoints (for metadata.json)."""
    envs: dict[str, Environment] = field(default_factory=dict)
    """Every environment the rows run on that imports here (a run may mix them: runtime/routing.py)."""
    agent_models: list[Model] = field(default_factory=list)
    """The named models the run's agent calls besides the policy (user or tool simulators, ...)."""

    @cached_property
    def functions(self) -> list[tuple[str, str]]:
        """(agent, env) pairs the rows run on: the run's own first."""
        pairs = [(self.cfg.agent, self.cfg.env)]
        for t in self.tasks:
            pair = (t.agent or self.cfg.agent, t.env or self.cfg.env)
            if t.row is not None and not t.error and pair not in pairs:
                pairs.append(pair)
        return pairs

    def worker_refs(self) -> list[str]:
        """The functions a local run starts workers for: the run's agent and environment, and those
        other rows name."""
        cfg = self.cfg
        refs = [cfg.agent_ref or cfg.agent, cfg.env_ref or cfg.env]
        for agent, env in self.functions[1:]:
            refs += [r for r in (agent, env) if r not in refs and r not in (cfg.agent, cfg.env)]
        return refs

    @cached_property
    def expected(self) -> Grid:
        return Grid((t.index for t in self.tasks), self.cfg.repeats)

    @cached_property
    def rows(self) -> dict[int, dict[str, Any] | None]:
        return {t.index: t.row for t in self.tasks}


async def prepare(cfg: RunConfig, run_id: str | None, *, check_model: bool = True) -> Plan:
    """Everything that can be refused before a run touches the disk or a broker; InputError names it."""
    try:
        run_id = names.check("run id", run_id) if run_id else new_run_id()
    except names.InvalidName as exc:
        raise InputError(f"--run-id: {exc}") from None
    tasks = read_tasks(cfg.input, cfg.limit)
    env, agent = _load_functions(cfg)
    plan = Plan(cfg, run_id, tasks, identities.identity_of(cfg), env)
    plan.envs = route_tasks(tasks, cfg.agent, cfg.env, env)
    if agent is not None:
        plan.agent_models = check_fit(cfg, agent, plan.envs, tasks)
    urls = urls_of(cfg.model.base_url)
    if urls and check_model:
        plan.model = await check_endpoints(urls, cfg.model.name)
        for m in plan.agent_models:  # an agent's other models, where the config says they are served
            if (named := cfg.models.get(m.name)) is not None and named.base_url:
                await check_endpoints(urls_of(named.base_url), m.name)
    return plan


def _load_functions(cfg: RunConfig) -> tuple[Environment | None, Agent | None]:
    """The environment and the agent the run names, checked to be what they say (with a shared broker,
    a function that does not import here is left to its workers)."""
    env = _load_or_leave(cfg, lambda: _load(cfg.env_ref or cfg.env, "env", cfg.env, Environment), "tools")
    agent = _load_or_leave(cfg, lambda: _load(cfg.agent_ref or cfg.agent, "agent", cfg.agent, Agent), "fit")
    return env, agent


def _load_or_leave(cfg: RunConfig, load_it: Callable[[], F], what: str) -> F | None:
    try:
        return load_it()
    except InputError as exc:
        if not cfg.nats:
            raise
        why = "its workers, which decide its tools, run elsewhere" if what == "tools" else "its fit is not checked"
        log.warning("%s; %s", exc, why)
        return None


F = TypeVar("F", Agent, Environment)


def _load(ref: str, key: str, name: str, kind: type[F]) -> F:
    try:
        fn = load(ref)
    except (LookupError, ImportError) as exc:
        raise InputError(f"{key} {name!r}: {exc} (functions/<name>/, or {key}_ref: module:OBJECT)") from None
    if not isinstance(fn, kind):
        raise InputError(f"{key} {name!r} is an {type(fn).__name__.lower()}, not an {kind.__name__.lower()}")
    if fn.name != name:
        raise InputError(f"{key} {name!r} loads a function named {fn.name!r}: set {key}: {fn.name}")
    return fn


async def check_served(js: JetStreamContext, cfg: RunConfig, functions: list[tuple[str, str]] | None = None) -> None:
    """With a remote broker, refuse to submit to functions no worker has ever served."""
    pairs = functions or [(cfg.agent, cfg.env)]
    served: list[tuple[Role, str]] = list(
        dict.fromkeys(pair for a, e in pairs for pair in (("agent", a), ("tool", e), ("verify", e)))
    )
    for role, name in served:
        if not await topology.has_consumer(js, role, name):
            subject = topology.subject(role, name)
            raise InputError(
                f"no worker serves {subject} (it has no consumer yet): start one with `gymbus worker {name} --nats URL`"
            )
