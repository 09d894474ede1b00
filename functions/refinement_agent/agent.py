"""refinement_agent: a failed verification's feedback goes back to the model for up to N corrections.

Each attempt is a tool loop (the model's calls go to the environment) that ends when the model
answers in text. The answer is then checked by the environment's verifier (a `Check`): a reward at
``until`` (default: the environment's best) ends the rollout with it; a lower one comes back here,
its feedback (the verifier's ``feedback`` or ``reason``, failed instructions, schema errors, the
extracted answer: whatever the verdict says) goes to the model as a user turn marked
``gymbus: {"source": "verifier", ...}``, and the model tries again. After ``max_corrections``
corrections the last answer is verified as usual. The reward is the final answer's; every
attempt's reward is in the Result's ``verifier.attempts``, in order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from runtime.sdk import Agent, AgentContext, CallTools, Check, Finish, Fit, Unfit, function_calls, mark

FEEDBACK = (
    "Your answer was checked and scored {reward:g}, which is not yet right.{details}\n\n"
    "Correct it, and give your final answer again in the same format."
)


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    max_corrections: Annotated[int, msgspec.Meta(ge=0, le=16)] = 2
    """Correction turns after the first attempt (so at most 1 + this many attempts)."""
    until: float | None = None
    """The reward that ends the rollout early (None: the environment's best)."""


async def step(ctx: AgentContext) -> CallTools | Check | Finish:
    """One turn of the current attempt; a text answer is checked, or finally verified."""
    config: Config = ctx.config
    fed = ctx.state.get("fed", 0)
    if len(ctx.checks) > fed:  # back from a failed check: its feedback opens the next attempt
        last = ctx.checks[-1]
        text = FEEDBACK.format(reward=last["reward"], details=details(last.get("info", {})))
        item = {"type": "message", "role": "user", "content": text}
        ctx.items.append(mark(item, "verifier", attempt=len(ctx.checks), reward=last["reward"]))
        ctx.state["fed"] = fed = len(ctx.checks)
        ctx.info["corrections"] = fed
    output = await ctx.respond()
    calls = function_calls(output)
    if calls and ctx.turns_taken < ctx.options.max_steps:
        return CallTools(calls)
    if fed < config.max_corrections and ctx.turns_taken < ctx.options.max_steps:
        return Check(until=config.until)
    return Finish()


def details(info: Mapping[str, Any]) -> str:
    """What the verdict says that the model can act on, in a few lines."""
    lines = []
    for key in ("feedback", "reason"):
        if isinstance(info.get(key), str):
            lines.append(info[key])
    followed = info.get("followed")
    if isinstance(followed, Mapping) and (missed := [k for k, ok in followed.items() if not ok]):
        lines.append("Instructions not followed: " + ", ".join(missed))
    if isinstance(info.get("errors"), list) and info["errors"]:
        lines.append("Errors: " + "; ".join(str(e) for e in info["errors"][:5]))
    if "extracted_answer" in info:
        lines.append(f"The answer read from your reply: {json.dumps(info['extracted_answer'])}")
    return "".join(f"\n- {line}" for line in lines)


def check(fit: Fit) -> None:
    """A game's episode is over once verified: there is nothing left to correct."""
    for name, env in fit.envs.items():
        if env.steps:
            raise Unfit(f"environment {name!r}", "a game's episode cannot be corrected after it ended; use step_agent")


AGENT = Agent(name="refinement_agent", step=step, config=Config, check=check)
