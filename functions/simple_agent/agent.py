"""simple_agent: the reference tool loop.

Each step calls the model with the conversation and the task's tools. If the model asked for
function calls and ``max_steps`` is not reached, they go to the environment and the agent steps
again when their outputs are in; otherwise the rollout goes to the verifier. A call with invalid
JSON arguments, an unknown tool name or arguments that fail the tool's schema is answered with an
error output the model reads on its next turn (the environment runtime does that), never a crash;
a run with ``invalid_tool_calls: fail`` ends the rollout as ``invalid_input`` instead.
"""

from runtime.sdk import Agent, AgentContext, CallTools, Finish, function_calls


async def step(ctx: AgentContext) -> CallTools | Finish:
    """One turn: call the model; run the tools it asked for, or finish."""
    output = await ctx.respond()
    calls = function_calls(output)
    if calls and ctx.turns_taken < ctx.options.max_steps:
        return CallTools(calls)
    return Finish()


AGENT = Agent(name="simple_agent", step=step)
