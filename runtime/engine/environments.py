"""The environment roles: seeding a session, running the model's tool calls, verifying the rollout."""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

from broker.schemas import FunctionCall, Msg, Seed, Session, Tools, Verify
from runtime.engine.clients import env_client
from runtime.engine.records import build_result, end
from runtime.engine.transitions import Delivery, Runtime, transition
from runtime.errors import GymError, InvalidInput, ToolError, VerifierError
from runtime.judges import bound
from runtime.sdk import Context, Environment, Rollout, Verdict
from runtime.taskrows import step_rewards
from runtime.telemetry import genai, spans

log = logging.getLogger("gymbus.runtime")


async def handle_tool(rt: Runtime, env: Environment, msg: Msg, d: Delivery) -> None:
    match msg:
        case Seed():
            await transition(rt, msg, "seed", d, lambda s: _seed(rt, env, s))
        case Tools():
            await transition(rt, msg, "tools", d, lambda s: _tools(rt, env, s))
        case _:
            raise InvalidInput(f"environment {env.name!r} tools cannot handle a {type(msg).__name__} message")


async def handle_verify(rt: Runtime, env: Environment, msg: Msg, d: Delivery) -> None:
    if not isinstance(msg, Verify):
        raise InvalidInput(f"environment {env.name!r} verifier cannot handle a {type(msg).__name__} message")
    await transition(rt, msg, "verify", d, lambda s: _verify(rt, env, s))


async def _seed(rt: Runtime, env: Environment, s: Session) -> None:
    """Set up a new session before its first model call: check its task fields, offer this environment's
    tools if the Start listed none (the run's ``env_tools`` permitting; the agent worker already did
    if it knew this environment's registration), then the environment's own ``seed``."""
    task = env.task(s)
    if "tools" not in s.params and env.by_name and rt.admission is not None:
        if (await rt.admission.defaults(s.run_id)).env_tools:
            s.params["tools"] = env.tool_specs()
    if env.seed is not None:
        await env.seed(Context(s.session_id, task, s.env_state))
    s.phase = "model"


async def _tools(rt: Runtime, env: Environment, s: Session) -> None:
    with bound(rt.js, s, env_client(rt.js)):  # a tool may call a named model for this rollout
        s.items.extend(await run_tools(env, s, s.pending))
    s.pending, s.phase = [], "model"


async def run_tools(env: Environment, s: Session, calls: list[FunctionCall]) -> list[dict[str, Any]]:
    """Run the calls in order. A call the model got wrong (unknown tool, bad JSON, schema) is answered
    with an error output the model can read, or fails the rollout with ``invalid_input`` under
    ``options.invalid_tool_calls: fail``; a tool that raises is a ``tool_error``."""
    ctx = Context(s.session_id, env.task(s), s.env_state)
    strict = s.options.invalid_tool_calls == "fail"
    outputs = []
    for n, call in enumerate(calls):
        t0 = time.perf_counter()
        try:
            output = await genai.tool_call(s.session_id, call, _call(env, ctx, call))
        except InvalidCall as exc:
            if strict:
                raise InvalidInput(f"tool call {n} ({call.call_id}) of turn {s.turns_taken}: {exc}") from None
            output = f"error: {exc}"
        outputs.append({"type": "function_call_output", "call_id": call.call_id, "output": output})
        s.timings.tool_s += time.perf_counter() - t0
        s.timings.tool_calls += 1
    return outputs


class InvalidCall(Exception):
    """The model's tool call cannot be run as written (unknown tool, bad JSON, schema violation)."""


async def _call(env: Environment, ctx: Context[Any], call: FunctionCall) -> str:
    tool = env.by_name.get(call.name)
    if tool is None:
        raise InvalidCall(f"unknown tool {call.name!r}; this environment has {sorted(env.by_name)}")
    try:
        args = tool.parse(call.arguments)
    except InvalidInput as exc:
        raise InvalidCall(exc.reason) from None
    try:
        value = await tool(ctx, args)
    except GymError:
        raise
    except Exception as exc:
        raise ToolError(f"tool {call.name!r} raised {type(exc).__name__}: {exc}") from exc
    return value if isinstance(value, str) else json.dumps(value)


async def verify_in_turn(rt: Runtime, env: Environment, s: Session) -> None:
    """Score the rollout inside the agent's transition (runtime/engine/inline.py). If the verifier
    raises, the session stays in phase ``verify`` and the environment's worker verifies it as usual."""
    try:
        await _verify(rt, env, s)
    except Exception as exc:
        log.info(
            "session %s: verifying in the agent's turn failed (%s); the environment verifies it", s.session_id, exc
        )


async def _verify(rt: Runtime, env: Environment, s: Session) -> None:
    task = env.task(s)
    started = time.perf_counter()
    try:
        rollout = Rollout(output=s.items[s.n_input :], state=s.env_state, agent_info=s.agent_info)
        with bound(rt.js, s, env_client(rt.js)) as models:  # the verifier may call named models (judges)
            verdict = await spans.verification(env.name, s.session_id, env.verify(task, rollout))
    except GymError:
        raise
    except Exception as exc:
        raise VerifierError(f"verifier of {env.name!r} raised {type(exc).__name__}: {exc}") from exc
    finally:
        s.timings.verify_s += time.perf_counter() - started
    reward, info = _reward(env, verdict)
    if s.checking and not _passes(env, s, reward, info):
        return  # a draft the agent refines: it steps again with the verdict
    if steps := step_rewards(s.env_state):
        info = {**info, "step_rewards": steps}
    if models.usage:
        info = {**info, "models": models.usage}
    if s.checks:
        info = {**info, "attempts": [c["reward"] for c in s.checks] + ([] if s.checking else [reward])}
    end(s, build_result(s, reward=reward, verifier=info))


def _passes(env: Environment, s: Session, reward: float, info: dict[str, Any]) -> bool:
    """Record a check's verdict (the agent's `Check`); False sends the rollout back to the agent."""
    s.checks.append({"reward": reward, "info": info})
    until = s.check_until if s.check_until is not None else env.reward_range[1]
    if reward >= until:
        return True
    s.checking, s.check_until, s.phase = False, None, "model"
    return False


def _reward(env: Environment, verdict: object) -> tuple[float, dict[str, Any]]:
    """A verifier's answer as (reward, info): a float, a bool (1.0 or 0.0) or a Verdict; anything else,
    or a reward that is not finite, is a ``verifier_error``."""
    reward, info = (verdict.reward, verdict.info) if isinstance(verdict, Verdict) else (verdict, {})
    if isinstance(reward, bool):
        return float(reward), info
    if not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise VerifierError(f"verifier of {env.name!r} returned reward {reward!r}, not a finite number")
    return float(reward), info
