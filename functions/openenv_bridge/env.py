"""openenv_bridge: an OpenEnv environment (its own process or container), played step by step.

At seed the rollout is pinned to a session host (host.py) that opens the episode (a WebSocket
session on the OpenEnv server, reset with the row's ``openenv.reset``). The model acts through the
``step`` tool (its arguments are the environment's action), which the host forwards; the answer
(observation, reward, done) is the tool's output, each step's reward a step reward. ``observe``
returns the last observation again. The step loop is the agent's tool loop (``simple_agent``):
once the episode is done, ``step`` says so and the model's next answer ends the rollout. The
reward is the sum of the episode's step rewards. OpenEnv has no state export, so a host or server
that died (or a host that restarted) ends the rollout as ``env_lost``.
"""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec

from functions.openenv_bridge import envs
from runtime import pins
from runtime.sdk import (
    Context,
    Environment,
    EnvLost,
    InvalidInput,
    Reference,
    Rollout,
    Task,
    Tool,
    ToolError,
    Verdict,
    call,
)

EPISODE = "openenv"
"""Where the rollout's episode lives in the environment's state: env, host, instance, last observation, rewards."""


class Spec(msgspec.Struct, frozen=True, kw_only=True):
    env: str | None = None
    """The configured environment (default: the only one)."""
    reset: dict[str, Any] = {}
    """The reset's arguments (``seed``, ``episode_id``, or the environment's own)."""
    right: list[dict[str, Any]] | None = None
    """For the simulated policy: actions that win the episode."""
    wrong: list[dict[str, Any]] | None = None
    """For the simulated policy: actions that lose it."""


class Meta(msgspec.Struct, frozen=True, kw_only=True):
    openenv: Spec = Spec()


async def seed(ctx: Context[Meta]) -> None:
    """Pin the rollout to a session host and open its episode there."""
    key = envs.key_of(ctx.task.meta.openenv.env)
    url, name = random.Random(ctx.session_id).choice(sorted(await envs.hosts(key)))
    episode: dict[str, Any] = {
        "env": key,
        "host": url,
        "instance": name,
        "session": ctx.session_id,
        "rewards": [],
        "done": False,
        "observation": None,
    }
    body = {"session": ctx.session_id, "reset": {"episode_id": ctx.session_id, **ctx.task.meta.openenv.reset}}
    answer = await _send(episode, "/sessions", body)
    if answer.status >= 400:
        raise ToolError(f"OpenEnv environment {key!r} did not open an episode: {answer.text[:300]}")
    episode["instance"] = answer.headers.get(INSTANCE)  # a host started elsewhere is known by its first answer
    episode["observation"] = answer.json()
    ctx.state[EPISODE] = episode


INSTANCE = "X-Gymbus-Instance"


async def _send(episode: dict[str, Any], path: str, body: Any, method: str = "POST") -> pins.Answer:
    """A call to the rollout's host; EnvLost if the host is gone, restarted, or lost the episode."""
    who = f"OpenEnv session host {episode['instance'] or episode['host']} of environment {episode['env']!r}"
    answer = await pins.post(f"{episode['host']}{path}", body, who=who, method=method)
    seen = answer.headers.get(INSTANCE)
    if episode["instance"] is not None and seen != episode["instance"]:
        raise EnvLost(f"{who} now answers as {seen!r}: it restarted, and the episode went with it")
    if answer.status == 410:
        raise EnvLost(f"{who}: {answer.json().get('error')}")
    return answer


async def step(ctx: Context[Meta], **action: Any) -> str:
    """Act in the environment: the arguments are the environment's action. Returns the observation,
    the step's reward and whether the episode is done."""
    episode = _episode(ctx.state)
    if episode["done"]:
        return json.dumps({"error": "the episode is over (done): give your final answer"})
    reply = await _send(episode, f"/sessions/{ctx.session_id}/step", {"action": action})
    if reply.status == 400:
        return json.dumps({"error": reply.json().get("error")})  # the action was wrong: the model reads why
    if reply.status >= 400:
        raise ToolError(f"OpenEnv environment {episode['env']!r} step answered {reply.status}: {reply.text[:300]}")
    result = reply.json()
    reward = float(result.get("reward") or 0.0)
    episode["rewards"].append(reward)
    episode["done"] = bool(result.get("done"))
    episode["observation"] = result
    ctx.step_reward(reward)
    return json.dumps(result)


async def observe(ctx: Context[Meta]) -> str:
    """The environment's last observation (after the reset, or the last step)."""
    return json.dumps(_episode(ctx.state)["observation"])


def _episode(state: dict[str, Any]) -> dict[str, Any]:
    episode = state.get(EPISODE)
    if episode is None:
        raise ToolError("this rollout has no OpenEnv episode (it was never seeded)")
    return episode


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """The sum of the episode's step rewards, as the environment gave them."""
    episode = _episode(rollout.state)
    try:  # the episode is over for gymbus: free the server's environment (the host would reap it anyway)
        await _send(episode, f"/sessions/{episode['session']}", None, method="DELETE")
    except EnvLost:
        pass  # the rewards are in the rollout's state already; a host gone after the last step loses nothing
    return Verdict(
        sum(episode["rewards"]),
        {"done": episode["done"], "steps": len(episode["rewards"]), "openenv": episode["env"]},
    )


def reference(task: Task[Meta]) -> Reference:
    """The row's winning and losing actions, played one step per turn."""
    spec = task.meta.openenv
    if spec.right is None or spec.wrong is None:
        raise LookupError("the row gives no `openenv.right`/`openenv.wrong` actions for the simulated policy")
    return Reference(
        right=[*(call("step", **a) for a in spec.right), "Done."],
        wrong=[*(call("step", **a) for a in spec.wrong), "Done."],
    )


ENVIRONMENT = Environment(
    name="openenv_bridge",
    meta=Meta,
    seed=seed,
    tools=[Tool(step, parameters={"type": "object"}, context=True), Tool(observe, context=True)],
    verify=verify,
    reference=reference,
)
_convert = ENVIRONMENT.check_meta


def _check(meta: Any) -> Meta:
    """The row's fields, and the environment it names configured (InvalidInput names what is wrong)."""
    converted: Meta = _convert(meta)
    try:
        envs.key_of(converted.openenv.env)
    except envs.SetupError as exc:
        raise InvalidInput(f"environment 'openenv_bridge': {exc.reason}") from None
    return converted


ENVIRONMENT.check_meta = _check  # type: ignore[method-assign]
