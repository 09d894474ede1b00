"""tool_simulation_agent: the model's tool calls are never run; a second model, or the task's recorded
outputs, answer them.

Each step calls the policy with the conversation and the task's tools. Its function calls are
answered here, never sent to the environment: by the tool simulator model (``config.simulator``,
reached through the model tier under its own name: routing, retries, a trace span, its usage in
``agent_info.models``), or by the task row's recorded ``tool_outputs``. Each output is marked in the
transcript as simulated (``gymbus: {"source": <model or "recorded">, "simulated": true}``), and the
agent steps again. A text answer (or ``max_steps``) sends the rollout to the verifier. A simulator
that fails or answers nothing ends the rollout as ``tool_sim_error`` naming it, never reward 0.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

from broker.schemas import FunctionCall
from runtime.errors import ToolSimError
from runtime.items import last_user_text
from runtime.sdk import Agent, AgentContext, Continue, Finish, Fit, Model, Unfit, function_calls, mark

PROMPT = """You simulate a tool that an AI assistant called. Answer exactly as the real tool would:
only its output (JSON or plain text), no explanation.

Tool: {name}
What it does: {description}
Its parameters (JSON schema): {parameters}

The user's request the assistant is working on: {request}"""


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    simulator: str = "tool_sim"
    """The model that plays the tools (a model of the run: the config's ``models:``)."""
    source: Literal["model", "recorded"] = "model"
    """``model``: the simulator answers every call; ``recorded``: the row's ``tool_outputs`` do."""


def models(config: Config) -> list[Model]:
    if config.source != "model":
        return []
    return [Model(config.simulator, role="tool_simulator", params={"temperature": 0.0})]


async def step(ctx: AgentContext) -> Continue | Finish:
    """One turn: call the policy; answer its tool calls with simulated outputs, or finish."""
    config: Config = ctx.config
    output = await ctx.respond()
    calls = function_calls(output)
    if not calls or ctx.turns_taken >= ctx.options.max_steps:
        return Finish()
    for call in calls:
        text, source = await answer(ctx, config, call)
        item = {"type": "function_call_output", "call_id": call.call_id, "output": text}
        ctx.items.append(mark(item, source, simulated=True))
    ctx.info["simulated_calls"] = ctx.info.get("simulated_calls", 0) + len(calls)
    return Continue()


async def answer(ctx: AgentContext, config: Config, call: FunctionCall) -> tuple[str, str]:
    """The simulated output of one call, and who made it."""
    spec = _tool_spec(ctx.params.get("tools") or [], call.name)
    if spec is None:
        return f"error: unknown tool {call.name!r}", "gymbus"
    if config.source == "recorded":
        return _recorded(ctx, call), "recorded"
    simulator = models(config)[0]
    prompt = PROMPT.format(
        name=call.name,
        description=spec.get("description", ""),
        parameters=json.dumps(spec.get("parameters", {})),
        request=last_user_text(ctx.items[: ctx.n_input]),
    )
    text = await simulator.ask([{"role": "system", "content": prompt}, {"role": "user", "content": _call_text(call)}])
    if not text.strip():
        raise ToolSimError(f"tool simulator model {simulator.name!r} gave no output for {_call_text(call)}")
    return text.strip(), simulator.name


def _recorded(ctx: AgentContext, call: FunctionCall) -> str:
    """The row's recorded output for the call: ``tool_outputs[name]``, a value or a list used in order."""
    recorded = ctx.session.meta.get("tool_outputs")
    if not isinstance(recorded, dict) or call.name not in recorded:
        have = sorted(recorded) if isinstance(recorded, dict) else "none"
        raise ToolSimError(f"no recorded output for tool {call.name!r} (the task row's `tool_outputs` has: {have})")
    value, used = recorded[call.name], ctx.state.setdefault("used", {})
    if isinstance(value, list):
        n = used.get(call.name, 0)
        if n >= len(value):
            why = f"has {len(value)} outputs, none for call {n + 1}"
            raise ToolSimError(f"the task row's `tool_outputs.{call.name}` {why}")
        used[call.name], value = n + 1, value[n]
    return value if isinstance(value, str) else json.dumps(value)


def _tool_spec(tools: Any, name: str) -> dict[str, Any] | None:
    for tool in tools:
        spec = tool.get("function", tool) if isinstance(tool, dict) else {}
        if spec.get("name") == name:
            return spec
    return None


def _call_text(call: FunctionCall) -> str:
    return f"{call.name}({call.arguments})"


def check(fit: Fit) -> None:
    """Simulated tools change no state: an environment that scores what its tools leave does not fit."""
    for name, env in fit.envs.items():
        if env.seed is not None:
            raise Unfit(
                f"environment {name!r}",
                "its verifier scores the state its tools leave (it seeds a state per session), and simulated "
                "tools change nothing; use simple_agent there",
            )


AGENT = Agent(name="tool_simulation_agent", step=step, config=Config, models=models, check=check)
