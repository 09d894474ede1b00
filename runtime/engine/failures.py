"""Ending a rollout as one failed Result, whatever message the failure happened on.

A failure is a transition like any other (a compare-and-set on the session), so a rollout gets
exactly one Result even when several workers fail it at once, and a failure that loses a race
to a step that moved the rollout on is dropped, not applied on top of it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

from nats.js import JetStreamContext

from broker import topology
from broker.publish import publish
from broker.schemas import (
    FailureKind,
    Msg,
    Result,
    Resume,
    Seed,
    Session,
    Start,
    Timings,
    Tools,
    Verify,
    parse_session_id,
    session_id,
)
from runtime.engine.records import RolloutIds, build_result, end, finish_timings, new_session, stub_session
from runtime.engine.transitions import Delivery, Runtime
from runtime.errors import GymError

log = logging.getLogger("gymbus.runtime")


async def fail(rt: Runtime, msg: Msg, kind: FailureKind, reason: str, d: Delivery) -> None:
    """End the message's rollout as a failed Result (unless it has moved on without this message).

    A compare-and-set conflict means another worker wrote the session meanwhile: reload and decide
    again, backing off, until the failure is committed or is no longer this message's to record.
    It never gives up (the kind would be lost and the rollout end later as a janitor timeout); a
    worker that stops meanwhile leaves the message unacked, so it is redelivered and failed again."""
    await _until_committed(_sid_step(msg)[0], lambda: _fail_once(rt, msg, kind, reason, d))


async def fail_by_ids(rt: Runtime, ids: RolloutIds, kind: FailureKind, reason: str, d: Delivery) -> None:
    """Fail the rollout a message names when the message cannot say more (unreadable, or its session
    is gone), unless that rollout lives on without it.

    A live (or finished) session of the same or a later attempt is left alone: a stray corrupt copy
    must not end a healthy rollout (if it was the rollout's only next message, the janitor's deadline
    ends it). Otherwise the failure is committed like any other, so the rollout gets exactly one Result."""
    await _until_committed(session_id(*ids[:3]), lambda: _fail_ids_once(rt, ids, kind, reason, d))


async def _until_committed(sid: str, attempt: Callable[[], Awaitable[bool]]) -> None:
    conflicts = 0
    while not await attempt():
        conflicts += 1
        if conflicts % 10 == 0:
            log.warning("recording the failure of %s: %d conflicting writes so far", sid, conflicts)
        await asyncio.sleep(min(2.0, 0.01 * 2**conflicts) * random.uniform(0.5, 1.0))


def _sid_step(msg: Msg) -> tuple[str, int | None]:
    match msg:
        case Start():
            return session_id(msg.run_id, msg.task_index, msg.rollout_index), None
        case Resume() | Seed() | Tools() | Verify():
            return msg.session_id, msg.step
        case Result():
            return msg.session_id, None
    raise TypeError(f"{type(msg).__name__} names no rollout")


async def _fail_once(rt: Runtime, msg: Msg, kind: FailureKind, reason: str, d: Delivery) -> bool:
    """One attempt; False on a compare-and-set conflict (decide again on the new state)."""
    sid, step = _sid_step(msg)
    loaded = await rt.store.get(sid)
    if loaded is None:
        if not isinstance(msg, Start):  # its session expired or never was: record the failure on a stub
            run_id, task, rollout = parse_session_id(sid)
            return await _fail_ids_once(rt, (run_id, task, rollout, 0), kind, reason, d)
        s, rev = new_session_or_stub(msg, d), 0
    else:
        s, rev = loaded
        if isinstance(msg, Start):
            if msg.attempt < s.attempt or (msg.attempt == s.attempt and s.step != s.base_step):
                await rt.reemit_if(sid, s.base_step + 1)
                return True
            if msg.attempt > s.attempt:
                s = new_session_or_stub(msg, d, s.step)
        elif s.step != step or s.attempt != getattr(msg, "attempt", 0) or s.phase == "done":
            # moved on without this message (or it is an earlier attempt's), or already ended
            await rt.reemit_if(sid, (step or 0) + 1)
            return True
    end(s, build_result(s, failure=(kind, reason)))
    return await rt.commit(s, rev, d, time.perf_counter())


def new_session_or_stub(msg: Start, d: Delivery, base: int = 0) -> Session:
    """A session for a Start that failed before one could be built (e.g. its input was invalid)."""
    try:
        return new_session(msg, base, d)
    except GymError:
        ids = (msg.run_id, msg.task_index, msg.rollout_index, msg.attempt)
        return stub_session(ids, d, base, msg.agent, msg.env, msg.model)


async def _fail_ids_once(rt: Runtime, ids: RolloutIds, kind: FailureKind, reason: str, d: Delivery) -> bool:
    run_id, task, rollout, attempt = ids
    sid = session_id(run_id, task, rollout)
    loaded = await rt.store.get(sid)
    if loaded is not None and loaded[0].attempt >= attempt:
        log.warning("a stray message for live rollout %s (attempt %d) left it running: %s", sid, attempt, reason)
        return True
    s, rev = stub_session(ids, d, loaded[0].step if loaded else 0), loaded[1] if loaded else 0
    end(s, build_result(s, failure=(kind, reason)))
    return await rt.commit(s, rev, d, time.perf_counter())


async def publish_orphan_failure(
    js: JetStreamContext, sid: str, kind: FailureKind, reason: str, ids: RolloutIds | None = None
) -> None:
    """A failed Result for a rollout with no session to attach it to (bad message, lost session)."""
    if ids is None:
        try:
            run_id, task, rollout = parse_session_id(sid)
        except ValueError:
            log.error("cannot report failure for unparseable session id %r: %s", sid, reason)
            return
        ids = (run_id, task, rollout, 0)
    run_id, task, rollout, attempt = ids
    result = Result(
        session_id=session_id(run_id, task, rollout),
        run_id=run_id,
        task_index=task,
        rollout_index=rollout,
        attempt=attempt,
        failure_kind=kind,
        failure_reason=reason,
        timings=finish_timings(Timings()),
    )
    await publish(js, topology.result_subject(run_id), result, f"{result.session_id}:failed:{attempt}")
