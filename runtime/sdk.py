"""The function SDK: what an environment or an agent author imports.

An environment is tools (documented ``async def``s), an optional ``seed`` and a ``verify``;
an agent is one ``step``. Both are plain async functions declared once at the bottom of a module
and found by import string (``functions.math:ENVIRONMENT``). They never see NATS: the runtime
loads the session, calls them, commits the new state and emits the next message.
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, get_type_hints, overload

import jsonschema
import msgspec

from broker.schemas import FunctionCall, Options, Session, Usage
from runtime.errors import EnvLost, InvalidInput, Retry, ToolError, VerifierError
from runtime.items import function_calls, message_text
from runtime.judges import Model
from runtime.offload import offload
from runtime.reference import Call, Reference, call
from runtime.taskrows import STEP_REWARDS, convert_meta

if TYPE_CHECKING:
    from runtime.model.client import ModelOutput

__all__ = [
    "Agent",
    "AgentContext",
    "Call",
    "CallTools",
    "Context",
    "EnvLost",
    "Environment",
    "Finish",
    "InvalidInput",
    "Model",
    "Reference",
    "Retry",
    "Rollout",
    "SessionView",
    "Task",
    "Tool",
    "ToolError",
    "Verdict",
    "VerifierError",
    "call",
    "function_calls",
    "load",
    "offload",
    "tool",
]

M = TypeVar("M")


@dataclass(frozen=True)
class Task(Generic[M]):
    """One task as the environment sees it: its verifier fields (``meta``) and what was asked."""

    index: int
    rollout_index: int
    meta: M
    """The task row's fields besides ``responses_create_params``; typed if the environment declares ``meta``."""
    params: dict[str, Any]
    """The Responses create body without ``input``."""
    input: list[dict[str, Any]]
    """The input items the model was given."""


@dataclass
class Context(Generic[M]):
    """What a tool or ``seed`` may use: the task, and ``state``, committed with the step."""

    session_id: str
    task: Task[M]
    state: dict[str, Any]

    def step_reward(self, value: float) -> None:
        """Record this step's reward (a game's per-move feedback); the Result reports them in order."""
        self.state.setdefault(STEP_REWARDS, []).append(float(value))


@dataclass(frozen=True)
class Rollout:
    """What the verifier scores: every item the rollout produced, and the final text."""

    output: list[dict[str, Any]]
    state: dict[str, Any]

    @property
    def text(self) -> str:
        """Text of the last assistant message (empty if the model never answered in text)."""
        for item in reversed(self.output):
            if item.get("type") == "message" and item.get("role", "assistant") == "assistant":
                return message_text(item)
        return ""


@dataclass(frozen=True)
class Verdict:
    """A reward plus what the verifier wants reported (``extracted_answer`` feeds majority@k)."""

    reward: float | bool
    """The reward: a number, or a bool (True is 1.0, False 0.0)."""
    info: dict[str, Any] = field(default_factory=dict)


ToolFn = Callable[..., Awaitable[Any]]


class Tool:
    """A tool: an ``async def`` whose name, docstring and signature are its name, description and schema.

    With ``context=True`` its first parameter receives the session's `Context` (the task and the
    environment's state, committed with the step); the others are the model's arguments, validated
    against the JSON schema before the call. Declare it with ``@tool(context=True)`` or list
    ``Tool(fn, context=True)`` in the environment's tools.
    """

    def __init__(
        self,
        fn: ToolFn,
        *,
        name: str | None = None,
        parameters: dict[str, Any] | None = None,
        context: bool = False,
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"tool {fn.__qualname__} must be an async def")
        self.fn = fn
        self.name = name or fn.__name__
        self.description = inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0]
        hints = get_type_hints(fn)
        args = list(inspect.signature(fn).parameters.values())
        if context and not args:
            raise TypeError(f"tool {self.name!r} is declared with context=True but takes no parameter for it")
        if not context and args and _is_context(hints.get(args[0].name)):
            raise TypeError(
                f"tool {self.name!r} takes a Context first: declare it with @tool(context=True) "
                f"(or Tool({fn.__name__}, context=True))"
            )
        self.wants_context = context
        self.arg_params = args[1:] if context else args
        self.parameters = parameters or _schema(self.name, self.arg_params, hints)
        self._validator = jsonschema.Draft202012Validator(self.parameters)

    def spec(self) -> dict[str, Any]:
        """The tool as a Responses API ``tools`` entry (flat function spec)."""
        return {"type": "function", "name": self.name, "description": self.description, "parameters": self.parameters}

    def parse(self, arguments: str) -> dict[str, Any]:
        """The model's JSON arguments, checked against the schema; InvalidInput names the field."""
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"arguments of tool {self.name!r} are not valid JSON: {exc}") from exc
        if not isinstance(args, dict):
            raise InvalidInput(f"arguments of tool {self.name!r} must be a JSON object, got {type(args).__name__}")
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(args))
        if error is not None:
            raise InvalidInput(f"argument {error.json_path} of tool {self.name!r}: {error.message}")
        return args

    async def __call__(self, ctx: Context[Any], args: dict[str, Any]) -> Any:
        return await (self.fn(ctx, **args) if self.wants_context else self.fn(**args))


@overload
def tool(fn: ToolFn, *, name: str | None = None, context: bool = False) -> Tool: ...


@overload
def tool(fn: None = None, *, name: str | None = None, context: bool = False) -> Callable[[ToolFn], Tool]: ...


def tool(
    fn: ToolFn | None = None, *, name: str | None = None, context: bool = False
) -> Tool | Callable[[ToolFn], Tool]:
    """Declare a tool: ``@tool`` as is, or ``@tool(context=True)`` for one that receives the `Context`."""
    if fn is not None:
        return Tool(fn, name=name, context=context)
    return lambda f: Tool(f, name=name, context=context)


def _is_context(annotation: Any) -> bool:
    return annotation is Context or getattr(annotation, "__origin__", None) is Context


def _schema(name: str, params: Sequence[inspect.Parameter], hints: dict[str, Any]) -> dict[str, Any]:
    fields: list[Any] = []
    for p in params:
        tp = hints.get(p.name, Any)
        fields.append((p.name, tp) if p.default is inspect.Parameter.empty else (p.name, tp, p.default))
    struct = msgspec.defstruct(name, fields, kw_only=True)
    _, defs = msgspec.json.schema_components([struct])
    body = defs.pop(struct.__name__)
    body.pop("title", None)
    if defs:
        body["$defs"] = defs
    return body


VerifyFn = Callable[[Task[Any], Rollout], Awaitable["float | Verdict"]]
SeedFn = Callable[[Context[Any]], Awaitable[None]]
ReferenceFn = Callable[[Task[Any]], Reference]


@dataclass
class Environment:
    """Tools the model may call, an optional ``seed`` for new sessions, and the ``verify`` that scores."""

    name: str
    verify: VerifyFn
    tools: Sequence[Tool | ToolFn] = ()
    seed: SeedFn | None = None
    meta: type | None = None
    """A msgspec Struct for the task's verifier fields; validated (naming the field) before use."""
    reference: ReferenceFn | None = None
    """A perfect and a plausibly wrong answer to a task: the simulated policy plays it, ``gymbus check`` proves it."""
    reward_range: tuple[float, float] = (0.0, 1.0)
    """The lowest and highest reward the verifier gives (``gymbus check`` expects both)."""
    accepts: Sequence[str] = ()
    """NeMo Gym resources servers whose rows it takes: a row's ``agent_ref`` naming one routes here."""
    agent: str = "simple_agent"
    """The agent of rows routed here that name none."""
    models: Sequence[Model] = ()
    """Named models it calls (judges); a local run with the simulated policy has it serve them too."""

    def __post_init__(self) -> None:
        tools = [t if isinstance(t, Tool) else Tool(t) for t in self.tools]
        names = [t.name for t in tools]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"environment {self.name!r} declares tool(s) {sorted(dupes)} more than once")
        self.tools = tools
        self.by_name: dict[str, Tool] = {t.name: t for t in tools}

    def tool_specs(self) -> list[dict[str, Any]]:
        return [t.spec() for t in self.by_name.values()]

    def task(self, session: Session) -> Task[Any]:
        return Task(
            index=session.task_index,
            rollout_index=session.rollout_index,
            meta=self.check_meta(session.meta),
            params=session.params,
            input=session.items[: session.n_input],
        )

    def check_meta(self, meta: Mapping[str, Any]) -> Any:
        """The task's verifier fields as ``meta`` declares them; InvalidInput names the field and this environment."""
        return convert_meta(self.name, self.meta, meta)


@dataclass(frozen=True)
class CallTools:
    """Agent action: send these calls to the environment, then step again."""

    calls: list[FunctionCall]


@dataclass(frozen=True)
class Finish:
    """Agent action: the rollout is done; send it to the verifier."""


Action = CallTools | Finish


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


class AgentContext:
    """What an agent step sees: the conversation so far, its own state, and a way to call the model.

    The session itself stays the runtime's: ``session`` is a read-only view of it, and what a step
    may change is the conversation (``items``: append to it) and ``state``, both committed with the
    step. Everything else it says by returning `CallTools` or `Finish`."""

    def __init__(self, session: Session, respond: Respond) -> None:
        self._session = session
        self._respond = respond
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
        )

    @property
    def items(self) -> list[dict[str, Any]]:
        """The conversation so far (input items, then everything produced); append to extend it."""
        return self._session.items

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
    def turns_taken(self) -> int:
        """Model calls made so far in this rollout, this one included once ``respond`` returns."""
        return self._session.turns_taken

    async def respond(self, **overrides: Any) -> list[dict[str, Any]]:
        """Call the model with the conversation and the task's tools; append and return its output items."""
        s = self._session
        out = await self._respond(s.items, {**s.params, **overrides}, s)
        s.items.extend(out.items)
        s.turns_taken += 1
        s.usage = Usage(
            input_tokens=s.usage.input_tokens + out.usage.input_tokens,
            output_tokens=s.usage.output_tokens + out.usage.output_tokens,
        )
        s.sampling = out.sampling
        if out.turn is not None:
            s.turns.append(out.turn)
        return out.items


StepFn = Callable[[AgentContext], Awaitable[Action]]


@dataclass
class Agent:
    """An agent: one ``step`` that calls the model and says what happens next."""

    name: str
    step: StepFn


Function = Agent | Environment


def load(ref: str) -> Function:
    """Load a function by import string: ``pkg.module:NAME``, or a short name under ``functions/``.

    ``math`` means ``functions.math`` and its ``ENVIRONMENT`` (or ``AGENT``).
    """
    module_name, _, attr = ref.partition(":")
    if "." not in module_name and not attr:
        module_name = f"functions.{module_name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise LookupError(f"function {ref!r}: no module {module_name!r}") from exc
        raise
    names = [attr] if attr else ["ENVIRONMENT", "AGENT"]
    for name in names:
        obj = getattr(module, name, None)
        if isinstance(obj, (Agent, Environment)):
            return obj
    raise LookupError(f"function {ref!r}: {module_name} has no Agent or Environment named {' or '.join(names)}")
