"""one_shot: one model call, then verification; tool calls the model makes are scored, never run.

For environments that judge what the model asks for rather than what it gets back (function calling,
structured outputs through a tool call), as NeMo Gym's non-executing agent does.
"""

from runtime.sdk import Agent, AgentContext, Finish


async def step(ctx: AgentContext) -> Finish:
    """Call the model once; the rollout goes to the verifier whatever it said."""
    await ctx.respond()
    return Finish()


AGENT = Agent(name="one_shot", step=step)
