"""The agent half of the function SDK (re-exported by ``runtime.sdk``): an agent is one ``step``.

A step sees the rollout through an `AgentContext` (the conversation, its own state, the policy) and
says what happens next by what it returns:

    CallTools(calls)   the environment runs the calls, then the agent steps again
    Continue()         the agent steps again at once (a user simulator spoke, outputs were simulated)
    Check(until=None)  the environment's verifier scores the rollout so far: at ``until`` (default: the
                       environment's best reward) the rollout ends with that score, else the agent
                       steps again with the verdict in ``ctx.checks``
    Finish()           the verifier scores the rollout and it ends

An agent may declare a typed ``config`` (the run config's ``agent_options``, checked before the run
starts), the named models it calls besides the policy (``models``: user or tool simulators, each
`Model` with its role) and a ``check`` that refuses a run it does not fit (an environment, a run
option, a model name), by raising `Unfit`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from broker.schemas import FunctionCall, Options, Session, Usage
from runtime.errors import InvalidInput
from runtime.judges import Model
from runtime.taskrows import step_rewards, terminated

if TYPE_CHECKING:
    from runtime.model.client import ModelOutput
    from runtime.sdk import Environment


@dataclass(frozen=True)
class CallTools:
    """Agent action: send these calls to the environment, then step again."""

    calls: list[FunctionCall]


@dataclass(frozen=True)
class Finish:
    """Agent action: the rollout is done; send it to the verifier."""


@dataclass(frozen=True)
class Continue:
    """Agent action: step again at once, without the environment (counts against ``max_steps``)."""


@dataclass(frozen=True)
class Check:
    """Agent action: have the environment's verifier score the rollout so far. A reward of at least
    ``until`` (None: the environment's best) ends the rollout with it; a lower one comes back to the
    agent's next step in ``ctx.checks``, with the verifier's info (its feedback)."""

    until: float | None = None


Action = CallTools | Finish | Continue | Check


class Respond(Protocol):
    """Calls the policy model for one session; provided by the runtime (see ``runtime.model.client``)."""

    async def __call__(self, items: list[dict[str, Any]], params: dict[str, Any], session: Session) -> ModelOutput: ...


@dataclass(frozen=True)
class SessionView:
    """What an agent may know of its rollout, read-only: identity, options, meta, usage so far."""

    session_id: str
    run_id: str
    task_index: int
    rollout_index: int
    attempt: int
    agent: str
    env: str
    model: str
    options: Options
    meta: Mapping[str, Any]
    """The task's verifier fields (read-only)."""
    usage: Usage
    step_rewards: tuple[float, ...] = ()
    """The rewards the environment's tools recorded so far, in order (games)."""
    terminated: bool = False
    """The environment said its episode is over (a game won or lost)."""
    step: int = 0
    """The session's step counter: the transition this step will commit is ``step + 1``."""


class AgentContext:
    """What an agent step sees: the conversation so far, its own state, and a way to call the model.

    The session itself stays the runtime's: ``session`` is a read-only view of it, and what a step
    may change is the conversation (``items``: append to it), ``state`` and ``info``, all committed
    with the step. Everything else it says by returning an action."""

    def __init__(self, session: Session, respond: Respond, config: Any = None) -> None:
        self._session = session
        self._respond = respond
        self.config = config
        """The agent's settings (its ``config`` type, from the run's ``agent_options``); None if it has none."""
        self.last_usage: Usage | None = None
        """Token usage of the last model call made in this step (its input tokens: the prompt's size)."""
        self.session = SessionView(
            session_id=session.session_id,
            run_id=session.run_id,
            task_index=session.task_index,
            rollout_index=session.rollout_index,
            attempt=session.attempt,
            agent=session.agent,
            env=session.env,
            model=session.model,
            options=session.options,
            meta=MappingProxyType(session.meta),
            usage=session.usage,
            step_rewards=tuple(step_rewards(session.env_state)),
            terminated=terminated(session.env_state),
            step=session.step,
        )

    @property
    def items(self) -> list[dict[str, Any]]:
        """The conversation so far (input items, then everything produced); append to extend it."""
        return self._session.items

    @property
    def n_input(self) -> int:
        """How many leading items of ``items`` are the task's input."""
        return self._session.n_input

    @property
    def params(self) -> Mapping[str, Any]:
        """The task's Responses create body without ``input`` (tools, sampling parameters), read-only:
        change a call with ``respond(**overrides)``."""
        return MappingProxyType(self._session.params)

    @property
    def options(self) -> Options:
        return self._session.options

    @property
    def state(self) -> dict[str, Any]:
        """The agent's own state, committed with each step (empty at the first step)."""
        return self._session.agent_state

    @property
    def info(self) -> dict[str, Any]:
        """What the agent reports, committed with each step and carried by the Result (``agent_info``)."""
        return self._session.agent_info

    @property
    def checks(self) -> tuple[Mapping[str, Any], ...]:
        """The verdicts of this rollout's `Check` actions, in order: ``{"reward": r, "info": {...}}``."""
        return tuple(MappingProxyType(c) for c in self._session.checks)

    @property
    def turns_taken(self) -> int:
        """Model calls made so far in this rollout, this one included once ``respond`` returns."""
        return self._session.turns_taken

    async def respond(self, **overrides: Any) -> list[dict[str, Any]]:
        """Call the model with the conversation and the task's tools; append and return its output items."""
        out = await self.call(self._session.items, **overrides)
        self._session.items.extend(out.items)
        return out.items

    async def call(
        self, items: list[dict[str, Any]], params: Mapping[str, Any] | None = None, **overrides: Any
    ) -> ModelOutput:
        """Call the policy with ``items`` as its input (a harness's own conversation) and ``params`` (by
        default the task's create body) under ``overrides``; counted as a turn (usage, token ids),
        appended nowhere."""
        s = self._session
        out = await self._respond(items, {**(s.params if params is None else params), **overrides}, s)
        s.turns_taken += 1
        s.usage = Usage(
            input_tokens=s.usage.input_tokens + out.usage.input_tokens,
            output_tokens=s.usage.output_tokens + out.usage.output_tokens,
        )
        s.sampling = out.sampling
        self.last_usage = out.usage
        if out.turn is not None:
            s.turns.append(out.turn)
        s.trajectory = out.trajectory or s.trajectory
        s.policy_versions.append(out.policy_version)
        return out


StepFn = Callable[[AgentContext], Awaitable[Action]]


class Unfit(Exception):
    """An agent's ``check`` refusing a run: ``subject`` names what does not fit (an environment, a run
    option, a model), ``why`` says why and what to do instead."""

    def __init__(self, subject: str, why: str) -> None:
        super().__init__(f"{subject}: {why}")
        self.subject, self.why = subject, why


@dataclass(frozen=True)
class Fit:
    """What an agent's ``check`` is shown of a run before it starts."""

    agent: str
    config: Any
    """The agent's settings (its ``config`` type), already validated."""
    envs: Mapping[str, Environment]
    """The environments the agent's rows run on (those that import here), by name."""
    options: Options
    """The rollouts' options (the run config's ``limits``)."""
    models: frozenset[str]
    """The model names this run has: the policy, the config's ``models``, and what the environments
    and the agent declare (with a simulated policy, all of these are served)."""

    def require_model(self, option: str, name: str) -> None:
        """Unfit unless ``name`` (set by the agent option ``option``) is a model of this run."""
        if name not in self.models:
            known = ", ".join(sorted(self.models))
            raise Unfit(
                f"agent_options.{option} {name!r}",
                f"no model of that name in this run (it has: {known}); add it under `models:` in the run config",
            )


ModelsFn = Callable[[Any], Sequence[Model]]


@dataclass
class Agent:
    """An agent: one ``step`` that calls the model and says what happens next."""

    name: str
    step: StepFn
    config: type | None = None
    """A msgspec Struct of the agent's settings: the run config's ``agent_options`` (checked before the
    run starts, naming the field), handed to each step as ``ctx.config``."""
    models: ModelsFn | Sequence[Model] = ()
    """The named models it calls besides the policy (a function of its config when the config names
    them): registered by a local run, played by the simulated policy, their usage in ``agent_info``."""
    check: Callable[[Fit], None] | None = None
    """Refuse a run it does not fit before it starts (raise `Unfit`)."""
    _configs: dict[bytes, Any] = field(default_factory=dict, repr=False)

    def config_of(self, options: Mapping[str, Any]) -> Any:
        """``options`` (the run's ``agent_options``) as the agent's ``config``; InvalidInput names the field."""
        if self.config is None:
            if options:
                raise InvalidInput(f"agent {self.name!r} takes no agent_options (got {sorted(options)})")
            return None
        key = msgspec.json.encode(options)
        if key not in self._configs:
            try:
                self._configs[key] = msgspec.convert(options, self.config)
            except msgspec.ValidationError as exc:
                why = str(exc)
                why = why.replace("`$", "`$.agent_options", 1) if "`$" in why else f"{why} - at `$.agent_options`"
                raise InvalidInput(f"agent {self.name!r}: {why}") from exc
        return self._configs[key]

    def models_for(self, config: Any) -> list[Model]:
        """The named models this agent calls with ``config``."""
        return list(self.models(config) if callable(self.models) else self.models)
