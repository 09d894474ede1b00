"""The agent role: a Start opens a session, a Resume takes the next turn; both call the agent's step."""

from __future__ import annotations

import time
from typing import Any

from broker.schemas import NUDGE, Msg, Resume, Session, Start
from runtime.engine.clients import env_client
from runtime.engine.environments import verify_in_turn
from runtime.engine.records import new_session
from runtime.engine.transitions import Delivery, Runtime, advance, deadline, transition
from runtime.errors import InvalidInput, Retry
from runtime.judges import bound
from runtime.model.client import ModelOutput
from runtime.sdk import Action, Agent, AgentContext, CallTools, Check, Continue

START_CONFLICTS = 3
"""Writes a Start tries before it hands its message back for redelivery (each lost to another worker)."""


async def handle_agent(rt: Runtime, agent: Agent, msg: Msg, d: Delivery) -> None:
    match msg:
        case Start():
            await _start(rt, agent, msg, d)
        case Resume():
            await transition(rt, msg, "model", d, lambda s: _turn(rt, agent, s))
        case _:
            raise InvalidInput(f"agent {agent.name!r} cannot handle a {type(msg).__name__} message")


async def _start(rt: Runtime, agent: Agent, msg: Start, d: Delivery) -> None:
    """Open the session optimistically: most Starts are new, so the first turn runs and the session is
    created (CAS on "no value yet") without reading the key first. A redelivered Start reads it first,
    so it never pays for a model call its first delivery already made; so does a Start a resume sent
    again for a rollout in flight (`NUDGE`). When the session exists, a duplicate Start re-emits the
    message its state calls for; a newer attempt supersedes a finished one, its steps continuing
    from the old session's so old messages stay stale."""
    started = time.perf_counter()
    s = new_session(msg, 0, d)
    rev = 0
    if d.num_delivered > 1 or NUDGE in d.headers:
        loaded = await rt.store.get(s.session_id)
        if loaded is not None:
            if await _exists(rt, msg, *loaded):
                return
            s.base_step, s.step, rev = loaded[0].step, loaded[0].step, loaded[1]
    if msg.options.seed:
        s.phase = "seed"
    else:
        async with deadline(s):
            await _turn(rt, agent, s)
    advance(s, d, started)
    for _ in range(START_CONFLICTS):
        if await rt.write(s, rev, reemit=False):
            return
        loaded = await rt.store.get(s.session_id)
        if loaded is None:  # it expired in between: create it again
            rev, s.base_step, s.step = 0, 0, 1
            continue
        if await _exists(rt, msg, *loaded):
            return
        s.base_step, s.step, rev = loaded[0].step, loaded[0].step + 1, loaded[1]  # supersedes that attempt
    raise Retry(reason=f"session {s.session_id}: {START_CONFLICTS} conflicting writes while opening it")


async def _exists(rt: Runtime, msg: Start, old: Session, rev: int) -> bool:
    """Whether the stored session makes this Start a duplicate; False if it is a newer attempt.

    A duplicate of the session's attempt publishes again the message its state calls for, under that
    message's id: the stream drops the copy while the message is there (redelivered Starts, nudges
    from a resume). It runs a step whose session write was lost after its message was consumed (a
    power cut under a sync interval), which nothing else would; of a finished session, it publishes
    the Result its worker died before publishing."""
    if msg.attempt > old.attempt:
        return False
    if msg.attempt == old.attempt:
        await rt.emit(old)
    return True


async def _turn(rt: Runtime, agent: Agent, s: Session) -> None:
    """One agent step on the session; sets the next phase (tools, the agent again, or verify)."""
    if rt.respond is None:
        raise RuntimeError("this worker has no model client")
    respond = rt.respond

    async def timed(items: list[dict[str, Any]], params: dict[str, Any], session: Session) -> ModelOutput:
        c0 = time.perf_counter()
        try:
            return await respond(items, params, session)
        finally:
            session.timings.model_s += time.perf_counter() - c0
            session.timings.model_calls += 1

    config = agent.config_of(s.options.agent_options)
    with bound(rt.js, s, env_client(rt.js)) as models:  # the step may call named models (user, tool simulators)
        action = await agent.step(AgentContext(s, timed, config))
    if models.usage:
        record_usage(s.agent_info.setdefault("models", {}), models.usage)
    next_phase(s, action)
    if s.phase == "verify" and rt.verifiers is not None and (env := await rt.verifiers.get(s.env)) is not None:
        await verify_in_turn(rt, env, s)  # one hop fewer: done (or back to the agent) in this transition


def next_phase(s: Session, action: Action) -> None:
    """Where the agent's action sends the rollout: the tools, the agent again, a check, or the verifier
    (also when ``max_steps`` model calls are spent)."""
    more = s.turns_taken < s.options.max_steps
    s.pending, s.checking, s.check_until = [], False, None
    if isinstance(action, CallTools) and action.calls and more:
        s.phase, s.pending = "tools", list(action.calls)
    elif isinstance(action, Continue) and more:
        s.phase = "model"
    elif isinstance(action, Check):
        s.phase, s.checking, s.check_until = "verify", True, action.until
    else:
        s.phase = "verify"


def record_usage(into: dict[str, dict[str, int]], used: dict[str, dict[str, int]]) -> None:
    """Add a step's named-model usage (calls, tokens per model) to the rollout's."""
    for name, counts in used.items():
        total = into.setdefault(name, {})
        for key, n in counts.items():
            total[key] = total.get(key, 0) + n
