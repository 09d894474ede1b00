"""harness_agent: an existing agent harness (a program speaking the OpenAI API) run as one long step.

The step starts the configured command for the rollout with its OpenAI base URL pointed at a
recording endpoint gymbus serves for this rollout alone, waits for it to finish (the worker's
in-progress acks keep the step alive), and sends the rollout to the environment's verifier. Every
model call the harness made went through the model tier and is in the conversation, so the verifier
scores the harness's final answer; files the harness left in its working directory (``outputs``)
are in ``agent_info.files`` for verifiers that score them. If the worker dies during the run, the
step is redelivered and the harness run again from the start, which ``agent_info.harness`` records
(``runs``, ``restarts``). A harness exiting with an error ends the rollout as ``harness_error``.
See runtime/harnessing.py.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Annotated

import msgspec

from runtime.harnessing import run_harness
from runtime.sdk import Agent, AgentContext, Finish, Fit, Unfit

HERE = Path(__file__).resolve().parent
EXAMPLE = ["{python}", "{here}/examples/chat_tools.py"]


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    command: Annotated[list[str], msgspec.Meta(min_length=1)] = msgspec.field(default_factory=lambda: list(EXAMPLE))
    """The harness's command line; ``{python}`` is this Python, ``{here}`` this folder."""
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    """Longest a run may take (None: the step's deadline, ``step_timeout_s``)."""
    env: dict[str, str] = {}
    """More environment variables for the harness."""
    outputs: list[str] = []
    """Files the harness leaves in its working directory that the verifier may read (``agent_info.files``)."""


def command(config: Config) -> list[str]:
    return [part.replace("{python}", sys.executable).replace("{here}", str(HERE)) for part in config.command]


async def step(ctx: AgentContext) -> Finish:
    """Run the harness for this rollout, then verify."""
    config: Config = ctx.config
    await run_harness(ctx, command(config), env=config.env, timeout_s=config.timeout_s, outputs=config.outputs)
    return Finish()


def check(fit: Fit) -> None:
    """The command must be there, and the environment must score what a harness can give it."""
    argv = command(fit.config)
    if shutil.which(argv[0]) is None:
        raise Unfit(f"agent_options.command {fit.config.command!r}", f"{argv[0]!r} is not an executable found here")
    for name, env in fit.envs.items():
        if env.seed is not None:
            raise Unfit(
                f"environment {name!r}",
                "its verifier scores the state its own tools leave, and a harness runs its own tools, never "
                "the environment's; use simple_agent there",
            )


AGENT = Agent(name="harness_agent", step=step, config=Config, check=check)
