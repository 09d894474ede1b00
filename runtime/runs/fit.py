"""Whether the run's agent fits the run: refused before anything starts, naming both sides.

The agent's ``agent_options`` must be its ``config`` (the field named when not); every named model
it calls with them (a user or tool simulator, a summarizer) must be a model of the run; and the
agent's own ``check`` may refuse the environments its rows run on, a run option (``token_exact``
for an agent that rewrites history), or a model name.

A model of the run: the policy, a name under the run config's ``models:``, and, when the simulated
policy serves the run, the models the environments and the agent declare by default (the simulator
plays them). An agent option naming another model, or a real policy with an agent model that has no
``base_url``, is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from runtime.errors import InputError, InvalidInput
from runtime.judges import Model
from runtime.runs.config import RunConfig
from runtime.runs.tasks import TaskRow
from runtime.sdk import Agent, Environment, Fit, Unfit


def check_fit(
    cfg: RunConfig, agent: Agent, envs: Mapping[str, Environment], tasks: list[TaskRow]
) -> list[Model]:
    """InputError if ``agent`` does not fit the run; else the named models it calls (its config's)."""
    options = cfg.options()
    try:
        config = agent.config_of(options.agent_options)
    except InvalidInput as exc:
        raise InputError(f"{exc.reason} (agent_options in the run config)") from None
    runnable = [t for t in tasks if t.row is not None and not t.error]
    mine = {t.env or cfg.env for t in runnable if (t.agent or cfg.agent) == agent.name}
    fit = Fit(
        agent=agent.name,
        config=config,
        envs={name: env for name, env in envs.items() if name in mine or name == cfg.env},
        options=options,
        models=frozenset(run_models(cfg, agent, envs.values(), config)),
    )
    models = agent.models_for(config)
    try:
        for m in models:
            if m.name not in fit.models:
                _unserved(cfg, m, fit.models)
        if agent.check is not None:
            agent.check(fit)
    except Unfit as exc:
        raise InputError(f"agent {agent.name!r} does not fit {exc.subject}: {exc.why}") from None
    return models


def simulated(cfg: RunConfig) -> bool:
    """The run's policy is the simulated one gymbus starts (no model URL, no shared broker)."""
    return not cfg.model.base_url and not cfg.nats


def run_models(cfg: RunConfig, agent: Agent | None, envs: Iterable[Environment], config: Any = None) -> set[str]:
    """The model names a run has (see the module docstring). With a shared broker (``nats``) what is
    registered there is not known here: the models the agent calls with ``config`` are taken as given
    (a missing one fails its rollouts, naming it)."""
    names = {cfg.model.name} | {n for n, m in cfg.models.items() if m.base_url or not cfg.model.base_url}
    if simulated(cfg) or cfg.nats:
        names |= {m.name for env in envs for m in env.models}
        if agent is not None:
            names |= {m.name for m in default_models(agent)}
    if cfg.nats and agent is not None:
        names |= {m.name for m in agent.models_for(config)}
    return names


def default_models(agent: Agent) -> list[Model]:
    """The models an agent calls with its default settings (none if its config has required fields)."""
    try:
        return agent.models_for(agent.config_of({}))
    except InvalidInput:
        return []


def _unserved(cfg: RunConfig, m: Model, known: frozenset[str]) -> None:
    what = f"model {m.name!r} ({m.role.replace('_', ' ')})"
    if not simulated(cfg):
        raise Unfit(
            what,
            f"nothing serves it in this run (its policy is {cfg.model.base_url or 'on ' + str(cfg.nats)}): "
            f"add `models: {{{m.name}: {{base_url: ...}}}}` to the run config",
        )
    raise Unfit(
        what,
        f"no model of that name in this run (it has: {', '.join(sorted(known))}); "
        "add it under `models:` in the run config, or name one of those",
    )
