"""step_agent: a Gymnasium-style reset/step loop against an environment whose tools are an episode's moves.

The environment's ``seed`` is the reset (the episode's state, seeded per session). Each step shows
the model the observation so far (the conversation: the task, then each move's output) and asks for
exactly one action (a tool call, ``tool_choice: required``); the environment runs it, records the
step's reward and says whether the episode ended (``ctx.step_reward(r, terminated=...)``). The loop
stops when the episode terminates, not when the model stops calling: then the verifier scores the
episode. A reply with no action is a wasted step (the model is told to act); more than
``max_invalid`` of them, or ``max_steps`` model calls, truncate the episode. When the model makes
several calls at once only the first is run, the others are answered as not run. The episode's
return, per-step rewards, steps, and whether it terminated or was truncated are in ``agent_info.episode``.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from runtime.sdk import Agent, AgentContext, CallTools, Continue, Finish, Fit, Unfit, function_calls, mark

NOT_RUN = "error: one action per step; this call was not run"


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    force_action: bool = True
    """Ask the model for a tool call on every step (``tool_choice: required``)."""
    max_invalid: Annotated[int, msgspec.Meta(ge=0)] = 3
    """Replies without an action tolerated before the episode is truncated."""
    nudge: str = "Reply with exactly one action: call one of the tools."


async def step(ctx: AgentContext) -> CallTools | Continue | Finish:
    """One step of the episode: act, or stop when it terminated (or must be truncated)."""
    config: Config = ctx.config
    for call_id in ctx.state.pop("dropped", []):
        ctx.items.append(mark({"type": "function_call_output", "call_id": call_id, "output": NOT_RUN}, "step_agent"))
    if ctx.session.terminated:
        return _end(ctx, truncated=False)
    if ctx.turns_taken >= ctx.options.max_steps:
        return _end(ctx, truncated=True)
    output = await ctx.respond(**({"tool_choice": "required"} if config.force_action else {}))
    calls = function_calls(output)
    if not calls:
        invalid = ctx.state["invalid"] = ctx.state.get("invalid", 0) + 1
        if invalid > config.max_invalid or ctx.turns_taken >= ctx.options.max_steps:
            return _end(ctx, truncated=True)
        ctx.items.append(mark({"type": "message", "role": "user", "content": config.nudge}, "step_agent"))
        return Continue()
    if ctx.turns_taken >= ctx.options.max_steps:  # the runtime runs no call past max_steps
        return _end(ctx, truncated=True)
    ctx.state["dropped"] = [c.call_id for c in calls[1:]]
    _record(ctx)
    return CallTools(calls[:1])


def _end(ctx: AgentContext, *, truncated: bool) -> Finish:
    _record(ctx, terminated=ctx.session.terminated, truncated=truncated)
    return Finish()


def _record(ctx: AgentContext, *, terminated: bool = False, truncated: bool = False) -> None:
    rewards = list(ctx.session.step_rewards)
    ctx.info["episode"] = {
        "return": sum(rewards),
        "step_rewards": rewards,
        "steps": len(rewards),
        "invalid_replies": ctx.state.get("invalid", 0),
        "terminated": terminated,
        "truncated": truncated,
    }


def check(fit: Fit) -> None:
    """Every environment of its rows must have steps (an episode its tools play and end)."""
    for name, env in fit.envs.items():
        if not env.steps:
            raise Unfit(
                f"environment {name!r}",
                "it has no steps (an environment whose tools are an episode's moves, each recording a step reward "
                "and saying when the episode ends: Environment(steps=True), like wordle and blackjack); "
                "use simple_agent there",
            )


AGENT = Agent(name="step_agent", step=step, config=Config, check=check)
