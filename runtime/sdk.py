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
from typing import Any, Generic, TypeVar, get_type_hints, overload

import jsonschema
import msgspec

from broker.schemas import Session
from runtime.agent import (
    Action,
    Agent,
    AgentContext,
    CallTools,
    Check,
    Continue,
    Finish,
    Fit,
    Respond,
    SessionView,
    StepFn,
    Unfit,
)
from runtime.errors import EnvLost, InvalidInput, Retry, ToolError, VerifierError
from runtime.items import function_calls, mark, message_text
from runtime.judges import Model
from runtime.offload import offload
from runtime.reference import Call, Reference, call
from runtime.taskrows import STEP_REWARDS, TERMINATED, convert_meta

__all__ = [
    "Action",
    "Agent",
    "AgentContext",
    "Call",
    "CallTools",
    "Check",
    "Context",
    "Continue",
    "EnvLost",
    "Environment",
    "Finish",
    "Fit",
    "InvalidInput",
    "Model",
    "Reference",
    "Respond",
    "Retry",
    "Rollout",
    "SessionView",
    "StepFn",
    "Task",
    "Tool",
    "ToolError",
    "Unfit",
    "Verdict",
    "VerifierError",
    "call",
    "function_calls",
    "load",
    "mark",
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

    def step_reward(self, value: float, *, terminated: bool = False) -> None:
        """Record this step's reward (a game's per-move feedback); the Result reports them in order.
        ``terminated``: the episode is over (a step loop stops there)."""
        self.state.setdefault(STEP_REWARDS, []).append(float(value))
        if terminated:
            self.state[TERMINATED] = True


@dataclass(frozen=True)
class Rollout:
    """What the verifier scores: every item the rollout produced, and the final text."""

    output: list[dict[str, Any]]
    state: dict[str, Any]
    agent_info: Mapping[str, Any] = field(default_factory=dict)
    """What the agent reported (e.g. the files a harness left, under ``files``)."""

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
        if self._validator.is_valid(args):  # the common case; best_match builds every error to rank them
            return args
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(args))
        assert error is not None
        raise InvalidInput(f"argument {error.json_path} of tool {self.name!r}: {error.message}")

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
    steps: bool = False
    """Its tools are the moves of an episode: each records a step reward and says when the episode ends
    (``ctx.step_reward(r, terminated=...)``), so a Gymnasium-style step loop (step_agent) fits it."""
    verify_inline: bool = False
    """Its verifier is pure and quick: it reads the task and the answer only, calls no model or tool and
    keeps no state. Then an agent worker that imports the same code (same source digest) scores the
    final answer in its own turn, one hop fewer per rollout; otherwise, or if the verifier raises there,
    the rollout takes the verification hop as usual."""

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
