"""The agent role: a Start opens a session, a Resume takes the next turn; both call the agent's step."""

from __future__ import annotations

import time
from typing import Any

from broker.schemas import Msg, Resume, Session, Start
from runtime.engine.records import new_session
from runtime.engine.transitions import Delivery, Runtime, advance, deadline, transition
from runtime.errors import InvalidInput, Retry
from runtime.model.client import ModelOutput
from runtime.sdk import Agent, AgentContext, CallTools

START_CONFLICTS = 3
"""Writes a Start tries before it hands its message back for redelivery (each lost to another worker)."""


async def handle_agent(rt: Runtime, agent: Agent, msg: Msg, d: Delivery) -> None:
    match msg:
        case Start():
            await _start(rt, agent, msg, d)
        case Resume():
            await transition(rt, msg.session_id, msg.step, "model", d, lambda s: _turn(rt, agent, s))
        case _:
            raise InvalidInput(f"agent {agent.name!r} cannot handle a {type(msg).__name__} message")


async def _start(rt: Runtime, agent: Agent, msg: Start, d: Delivery) -> None:
    """Open the session optimistically: most Starts are new, so the first turn runs and the session is
    created (CAS on "no value yet") without reading the key first. A redelivered Start reads it first,
    so it never pays for a model call its first delivery already made. When the session exists, a
    duplicate Start re-emits what its first delivery may have lost; a newer attempt supersedes a
    finished one, its steps continuing from the old session's so old messages stay stale."""
    started = time.perf_counter()
    s = new_session(msg, 0, d)
    rev = 0
    if d.num_delivered > 1:
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
    """Whether the stored session makes this Start a duplicate (then re-emit its first transition's
    message if that is the last one committed); False if the Start is a newer attempt."""
    if msg.attempt > old.attempt:
        return False
    if msg.attempt == old.attempt and old.step == old.base_step + 1:
        await rt.emit(old)
    return True


async def _turn(rt: Runtime, agent: Agent, s: Session) -> None:
    """One agent step on the session; sets the next phase (tools or verify)."""
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

    action = await agent.step(AgentContext(s, timed))
    if isinstance(action, CallTools) and action.calls and s.turns_taken < s.options.max_steps:
        s.phase, s.pending = "tools", list(action.calls)
    else:
        s.phase, s.pending = "verify", []
