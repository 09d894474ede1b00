"""user_sim_agent: a multi-turn conversation with a simulated user played by a second model.

Each step calls the policy with the conversation. Its tool calls go to the environment as in a tool
loop; when it answers in text, the user simulator (``config.user_model``, a named model reached
through the model tier) is asked for the user's next message, given a persona and a goal (the row's
``user`` field, else the config's) and the dialogue seen from the user's side. Its message joins the
conversation as a user turn marked ``gymbus: {"source": <user model>, "role": "user_simulator"}``
and the policy speaks again. The conversation ends when the user's message holds the stop signal
(``config.stop``), after ``max_user_turns`` user turns, or at ``max_steps``; then the environment
verifies the policy's last answer. The user model's usage is in ``agent_info.models``; a user model
that fails or says nothing ends the rollout as ``user_sim_error`` naming it, never reward 0.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from runtime.errors import InvalidInput, UserSimError
from runtime.items import message_text
from runtime.sdk import Agent, AgentContext, CallTools, Continue, Finish, Model, function_calls, mark

SYSTEM = """You are role-playing a user who is talking with an AI assistant. Stay in character.

Who you are: {persona}
Your goal: {goal}

Write only your next message to the assistant, briefly, as that user would. When your goal is met,
or cannot be met, end your message with {stop}"""


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    user_model: str = "user_sim"
    """The model that plays the user (a model of the run: the config's ``models:``)."""
    max_user_turns: Annotated[int, msgspec.Meta(ge=1, le=64)] = 4
    """User messages after the task's own, at most."""
    stop: Annotated[str, msgspec.Meta(min_length=1)] = "###STOP###"
    """The signal with which the user ends the conversation."""
    persona: str = "Someone who asked the question above and wants a correct, clear answer."
    goal: str = "Get a correct final answer to your question, and make sure the assistant is sure of it."


class UserSpec(msgspec.Struct, frozen=True):
    """A task row's ``user`` field: who the simulated user is, and what they want."""

    persona: str | None = None
    goal: str | None = None


def models(config: Config) -> list[Model]:
    return [Model(config.user_model, role="user_simulator")]


async def step(ctx: AgentContext) -> CallTools | Continue | Finish:
    """One policy turn; a text answer gets the simulated user's reply, or ends the conversation."""
    config: Config = ctx.config
    output = await ctx.respond()
    calls = function_calls(output)
    if calls and ctx.turns_taken < ctx.options.max_steps:
        return CallTools(calls)
    spoken = ctx.state.get("user_turns", 0)
    if spoken >= config.max_user_turns or ctx.turns_taken >= ctx.options.max_steps:
        ctx.info["ended_by"] = "turn budget"
        return Finish()
    user = models(config)[0]
    reply = (await user.ask(user_view(ctx, config))).strip()
    if not reply:
        raise UserSimError(f"user simulator model {user.name!r} said nothing")
    stopped = config.stop in reply
    text = reply.replace(config.stop, "").strip()
    if text:
        ctx.items.append(mark({"type": "message", "role": "user", "content": text}, user.name, role="user_simulator"))
    ctx.state["user_turns"] = ctx.info["user_turns"] = spoken + 1
    if stopped:
        ctx.info["ended_by"] = "user"
        return Finish()
    return Continue()


def user_view(ctx: AgentContext, config: Config) -> list[dict[str, Any]]:
    """The dialogue from the user's side: its own messages (the task's included) as the assistant's,
    the policy's text replies as the user's; tool traffic and system prompts left out."""
    spec = _spec(ctx.session.meta.get("user"))
    system = SYSTEM.format(persona=spec.persona or config.persona, goal=spec.goal or config.goal, stop=config.stop)
    view: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for item in ctx.items:
        role, text = item.get("role"), message_text(item) if item.get("type", "message") == "message" else ""
        if text and role in ("user", "assistant"):
            view.append({"role": "assistant" if role == "user" else "user", "content": text})
    return view


def _spec(raw: Any) -> UserSpec:
    if raw is None:
        return UserSpec()
    try:
        return msgspec.convert(raw, UserSpec)
    except msgspec.ValidationError as exc:
        why = str(exc)
        raise InvalidInput(why.replace("`$", "`$.user", 1) if "`$" in why else f"{why} - at `$.user`") from None


AGENT = Agent(name="user_sim_agent", step=step, config=Config, models=models)
