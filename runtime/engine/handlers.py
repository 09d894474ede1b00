"""The rollout state machine: how each message advances a session, exactly once.

A session's ``step`` counts committed transitions. A message carries the step it applies to:

    Start          session absent (or an older attempt)  -> step b+1, phase seed|tools|verify
    Seed    (s)    phase seed                            -> step s+1, phase model
    Resume  (s)    phase model                           -> step s+1, phase tools|verify
    Tools   (s)    phase tools                           -> step s+1, phase model
    Verify  (s)    phase verify                          -> step s+1, phase done (Result stored)

Each transition is one compare-and-set on the session's KV revision, and the one message that
follows is derived from the committed state alone, published with the id ``<session>:<step>``.
So a redelivered message finds the session one step ahead and re-emits what may have been lost
(the stream drops it if it was not), and a message that lost a race finds a CAS conflict and
steps aside: nothing is applied twice (DESIGN invariant 2).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.js import JetStreamContext

from broker import topology
from broker.publish import publish
from broker.schemas import (
    FailureKind,
    FunctionCall,
    Msg,
    Result,
    Resume,
    Seed,
    Session,
    Start,
    Timings,
    Tools,
    Verify,
    encoder,
    parse_session_id,
    session_encoder,
    session_id,
)
from broker.sessions import SessionStore, StateConflict
from runtime.errors import (
    ContextLength,
    DeadlineExceeded,
    GymError,
    InvalidInput,
    Retry,
    Timeout,
    ToolError,
    VerifierError,
)
from runtime.sdk import Agent, AgentContext, CallTools, Context, Environment, Respond, Rollout, Verdict
from runtime.telemetry import genai, spans

log = logging.getLogger("gymbus.runtime")


@dataclass(frozen=True)
class Delivery:
    """What the runtime knows about the message in hand."""

    published_at: float
    """Unix time the broker stored the message."""
    received_at: float = field(default_factory=time.time)
    """Unix time a worker took it."""
    num_delivered: int = 1
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def queued_s(self) -> float:
        return max(0.0, self.received_at - self.published_at)


@dataclass
class Runtime:
    """Resources every handler of a worker shares; built once per worker process."""

    js: JetStreamContext
    store: SessionStore
    respond: Respond | None = None
    done_ttl_s: float = 3600.0
    """How long a finished session stays in KV (so late duplicates find it done), then expires."""

    async def emit(self, s: Session) -> None:
        """Publish the one message the session's committed state calls for."""
        subject, msg = next_message(s)
        await publish(self.js, subject, msg, f"{s.session_id}:{s.step}", s.headers or None)

    async def commit(self, s: Session, rev: int, d: Delivery, started: float) -> bool:
        """Apply the transition (step + 1) by CAS and emit its message; False if another worker won."""
        advance(s, d, started)
        return await self.write(s, rev)

    async def write(self, s: Session, rev: int, *, reemit: bool = True) -> bool:
        """Store an advanced session by CAS on ``rev`` and emit its message; False if another worker won
        (then, with ``reemit``, publish what the winner's state calls for)."""
        record = fit(s, max_record_bytes(self.js))
        # a failed rollout's session outlives the short done TTL (bucket TTL), so `gymbus replay` can re-run it
        ttl = self.done_ttl_s if s.phase == "done" and s.result is not None and not s.result.failed else None
        try:
            await self.store.update(s, last=rev, ttl_s=ttl, record=record)
        except StateConflict:
            log.debug("session %s step %d: applied by another worker", s.session_id, s.step - 1)
            if reemit:
                await self._reemit(s.session_id, s.step)
            return False
        await self.emit(s)
        return True

    async def _reemit(self, sid: str, step: int) -> None:
        """After a lost race, publish what the winner's state calls for (a no-op if it already did)."""
        loaded = await self.store.get(sid)
        if loaded is not None and loaded[0].step == step:
            await self.emit(loaded[0])


def advance(s: Session, d: Delivery, started: float) -> None:
    """Count the hop in the session's timings and take the transition (step + 1), before it is stored."""
    t = s.timings
    t.hops += 1
    t.queue_s += d.queued_s
    t.handler_s += time.perf_counter() - started
    if s.phase == "done" and s.result is not None:
        s.result = msgspec.structs.replace(s.result, timings=_finished(t))
    s.step += 1


def next_message(s: Session) -> tuple[str, Msg]:
    sid, step = s.session_id, s.step
    match s.phase:
        case "seed":
            return topology.tool_subject(s.env), Seed(session_id=sid, step=step)
        case "model":
            return topology.agent_subject(s.agent), Resume(session_id=sid, step=step)
        case "tools":
            return topology.tool_subject(s.env), Tools(session_id=sid, step=step, calls=s.pending)
        case "verify":
            return topology.verify_subject(s.env), Verify(session_id=sid, step=step)
        case "done":
            assert s.result is not None
            return topology.result_subject(s.run_id), s.result
    raise AssertionError(f"unknown phase {s.phase!r}")


def _finished(t: Timings) -> Timings:
    t.finished_at = time.time()
    return msgspec.structs.replace(t)


def build_result(
    s: Session,
    *,
    reward: float | None = None,
    verifier: dict[str, Any] | None = None,
    failure: tuple[FailureKind, str] | None = None,
) -> Result:
    return Result(
        session_id=s.session_id,
        run_id=s.run_id,
        task_index=s.task_index,
        rollout_index=s.rollout_index,
        attempt=s.attempt,
        agent=s.agent,
        env=s.env,
        model=s.model,
        reward=None if failure else reward,
        failure_kind=failure[0] if failure else None,
        failure_reason=failure[1] if failure else None,
        verifier=verifier or {},
        output=s.items[s.n_input :],
        usage=s.usage,
        sampling=s.sampling,
        turns=s.turns,
        timings=_finished(s.timings),
    )


@asynccontextmanager
async def deadline(s: Session) -> AsyncIterator[None]:
    """Bound one step by ``step_timeout_s`` and by what is left of ``rollout_timeout_s``."""
    o = s.options
    left = s.timings.submitted_at + o.rollout_timeout_s - time.time()
    if left <= 0:
        raise DeadlineExceeded(f"rollout exceeded rollout_timeout_s={o.rollout_timeout_s:g}")
    budget = min(o.step_timeout_s, left)
    try:
        async with asyncio.timeout(budget) as cm:
            yield
    except TimeoutError as exc:
        if not cm.expired():
            raise
        if budget == o.step_timeout_s:
            raise Timeout(f"step {s.step} ({s.phase}) exceeded step_timeout_s={o.step_timeout_s:g}") from exc
        raise DeadlineExceeded(f"step {s.step} ({s.phase}) exceeded rollout_timeout_s={o.rollout_timeout_s:g}") from exc


class CreateParams(msgspec.Struct):
    """The parts of a Responses create body gymbus reads; the rest passes through to the model."""

    input: str | list[dict[str, Any]]
    tools: list[dict[str, Any]] = []
    instructions: str | None = None


def input_items(params: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        parsed = msgspec.convert(params, CreateParams)
    except msgspec.ValidationError as exc:
        raise InvalidInput(str(exc).replace("`$", "`$.responses_create_params", 1)) from exc
    if isinstance(parsed.input, str):
        return [{"type": "message", "role": "user", "content": parsed.input}]
    items = [dict(i) for i in parsed.input]
    for n, item in enumerate(items):
        if "type" not in item:
            if "role" not in item:
                raise InvalidInput(f"item has neither `type` nor `role` - at `$.responses_create_params.input[{n}]`")
            item["type"] = "message"
    return items


def new_session(msg: Start, base_step: int, d: Delivery) -> Session:
    """The session a Start opens; InvalidInput (naming the field) if its create params are malformed."""
    ids = (msg.run_id, msg.task_index, msg.rollout_index, msg.attempt)
    s = stub_session(ids, d, base_step, msg.agent, msg.env, msg.model)
    s.meta, s.options = msg.meta, msg.options
    params = dict(msg.responses_create_params)
    s.items = input_items(params)
    s.n_input = len(s.items)
    params.pop("input", None)
    s.params = params
    return s


# ---- agent ---------------------------------------------------------------------------------------


async def handle_agent(rt: Runtime, agent: Agent, msg: Msg, d: Delivery) -> None:
    match msg:
        case Start():
            await _start(rt, agent, msg, d)
        case Resume():
            loaded = await _load(rt, msg.session_id, msg.step, "model")
            if loaded:
                s, rev = loaded
                started = time.perf_counter()
                async with deadline(s):
                    await _turn(rt, agent, s)
                await rt.commit(s, rev, d, started)
        case _:
            raise InvalidInput(f"agent {agent.name!r} cannot handle a {type(msg).__name__} message")


async def _start(rt: Runtime, agent: Agent, msg: Start, d: Delivery) -> None:
    """Open the session optimistically: most Starts are new, so the first turn runs and the session is
    created (CAS on "no value yet") without reading the key first. Only when it exists is it read: a
    duplicate Start re-emits what its first delivery may have lost; a newer attempt supersedes a
    finished one, its steps continuing from the old session's so old messages stay stale."""
    started = time.perf_counter()
    s = new_session(msg, 0, d)
    if msg.options.seed:
        s.phase = "seed"
    else:
        async with deadline(s):
            await _turn(rt, agent, s)
    advance(s, d, started)
    rev = 0
    for _ in range(START_CONFLICTS):
        if await rt.write(s, rev, reemit=False):
            return
        loaded = await rt.store.get(s.session_id)
        if loaded is None:  # it expired in between: create it again
            rev, s.base_step, s.step = 0, 0, 1
            continue
        old, rev = loaded
        if msg.attempt <= old.attempt:  # a duplicate Start: re-emit if its transition is the last one
            if msg.attempt == old.attempt and old.step == old.base_step + 1:
                await rt.emit(old)
            return
        s.base_step, s.step = old.step, old.step + 1  # rebased onto the attempt it supersedes
    raise Retry(reason=f"session {s.session_id}: {START_CONFLICTS} conflicting writes while opening it")


START_CONFLICTS = 3
"""Writes a Start tries before it hands its message back for redelivery (each lost to another worker)."""


async def _turn(rt: Runtime, agent: Agent, s: Session) -> None:
    if rt.respond is None:
        raise RuntimeError("this worker has no model client")
    respond = rt.respond

    async def timed(items: list[dict[str, Any]], params: dict[str, Any], session: Session) -> Any:
        c0 = time.perf_counter()
        try:
            return await respond(items, params, session)
        finally:
            session.timings.model_s += time.perf_counter() - c0
            session.timings.model_calls += 1

    action = await agent.step(AgentContext(s, timed))  # type: ignore[arg-type]
    if isinstance(action, CallTools) and action.calls and s.turns_taken < s.options.max_steps:
        s.phase, s.pending = "tools", list(action.calls)
    else:
        s.phase, s.pending = "verify", []


# ---- environment -----------------------------------------------------------------------------------


async def handle_tool(rt: Runtime, env: Environment, msg: Msg, d: Delivery) -> None:
    match msg:
        case Seed():
            loaded = await _load(rt, msg.session_id, msg.step, "seed")
            if loaded:
                s, rev = loaded
                started = time.perf_counter()
                if env.seed is not None:
                    async with deadline(s):
                        await env.seed(Context(s.session_id, env.task(s), s.env_state))
                s.phase = "model"
                await rt.commit(s, rev, d, started)
        case Tools():
            loaded = await _load(rt, msg.session_id, msg.step, "tools")
            if loaded:
                s, rev = loaded
                started = time.perf_counter()
                async with deadline(s):
                    s.items.extend(await run_tools(env, s, s.pending))
                s.pending, s.phase = [], "model"
                await rt.commit(s, rev, d, started)
        case _:
            raise InvalidInput(f"environment {env.name!r} tools cannot handle a {type(msg).__name__} message")


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


async def handle_verify(rt: Runtime, env: Environment, msg: Msg, d: Delivery) -> None:
    if not isinstance(msg, Verify):
        raise InvalidInput(f"environment {env.name!r} verifier cannot handle a {type(msg).__name__} message")
    loaded = await _load(rt, msg.session_id, msg.step, "verify")
    if not loaded:
        return
    s, rev = loaded
    started = time.perf_counter()
    task = env.task(s)
    async with deadline(s):
        try:
            rollout = Rollout(output=s.items[s.n_input :], state=s.env_state)
            verdict = await spans.verification(env.name, s.session_id, env.verify(task, rollout))
        except GymError:
            raise
        except Exception as exc:
            raise VerifierError(f"verifier of {env.name!r} raised {type(exc).__name__}: {exc}") from exc
        finally:
            s.timings.verify_s += time.perf_counter() - started
    if not isinstance(verdict, Verdict):
        verdict = Verdict(verdict)  # type: ignore[arg-type]
    if (
        isinstance(verdict.reward, bool)
        or not isinstance(verdict.reward, (int, float))
        or not math.isfinite(verdict.reward)
    ):
        raise VerifierError(f"verifier of {env.name!r} returned reward {verdict.reward!r}, not a finite number")
    s.result = build_result(s, reward=float(verdict.reward), verifier=verdict.info)
    s.phase = "done"
    await rt.commit(s, rev, d, started)


# ---- shared ------------------------------------------------------------------------------------------


async def _load(rt: Runtime, sid: str, step: int, phase: str) -> tuple[Session, int] | None:
    """The session if ``step`` applies to it now; otherwise re-emit if needed and return None."""
    loaded = await rt.store.get(sid)
    if loaded is None:
        raise SessionLost(sid)
    s, rev = loaded
    if s.step == step and s.phase == phase:
        return s, rev
    if s.step == step + 1:
        await rt.emit(s)  # our transition is committed; the message after it may have been lost
    elif s.step == step:
        log.error("session %s step %d is in phase %s, not %s: message dropped", sid, step, s.phase, phase)
    return None


class SessionLost(GymError):
    """A message arrived for a session that is not in KV (expired or purged)."""

    kind = "internal"
    retry = False

    def __init__(self, sid: str) -> None:
        super().__init__(f"session {sid} is missing from the sessions bucket (expired or purged)")
        self.sid = sid


async def fail(rt: Runtime, msg: Msg, kind: FailureKind, reason: str, d: Delivery) -> None:
    """End the message's rollout as a failed Result (unless it has moved on without this message)."""
    if isinstance(msg, Start):
        sid, step = session_id(msg.run_id, msg.task_index, msg.rollout_index), None
    else:
        sid, step = msg.session_id, getattr(msg, "step", None)  # type: ignore[attr-defined]
    for _ in range(5):
        loaded = await rt.store.get(sid)
        if loaded is None:
            if not isinstance(msg, Start):  # its session expired or never was: record the failure on a stub
                run_id, task, rollout = parse_session_id(sid)
                await fail_by_ids(rt, (run_id, task, rollout, 0), kind, reason, d)
                return
            s, rev = new_session_or_stub(msg, d), 0
        else:
            s, rev = loaded
            if isinstance(msg, Start):
                if msg.attempt < s.attempt or (msg.attempt == s.attempt and s.step != s.base_step):
                    return await _reemit_if(rt, s, s.base_step + 1)
                if msg.attempt > s.attempt:
                    base = s.step
                    s, rev = new_session_or_stub(msg, d, base), rev
            elif s.step != step or s.phase == "done":  # moved on without this message, or already ended
                return await _reemit_if(rt, s, (step or 0) + 1)
        s.result = build_result(s, failure=(kind, reason))
        s.phase = "done"
        if await rt.commit(s, rev, d, time.perf_counter()):
            return
    log.error("could not record the failure of %s after 5 conflicts", sid)


async def _reemit_if(rt: Runtime, s: Session, step: int) -> None:
    if s.step == step:
        await rt.emit(s)


def new_session_or_stub(msg: Start, d: Delivery, base: int = 0) -> Session:
    """A session for a Start that failed before one could be built (e.g. its input was invalid)."""
    try:
        return new_session(msg, base, d)
    except GymError:
        return stub_session(
            (msg.run_id, msg.task_index, msg.rollout_index, msg.attempt), d, base, msg.agent, msg.env, msg.model
        )


def stub_session(
    ids: tuple[str, int, int, int], d: Delivery, base: int = 0, agent: str = "", env: str = "", model: str = ""
) -> Session:
    """A session holding only a rollout's identity, to record its failure."""
    run_id, task, rollout, attempt = ids
    return Session(
        session_id=session_id(run_id, task, rollout),
        run_id=run_id,
        task_index=task,
        rollout_index=rollout,
        attempt=attempt,
        agent=agent,
        env=env,
        model=model,
        step=base,
        base_step=base,
        phase="model",
        params={},
        timings=Timings(submitted_at=d.published_at),
        headers=d.headers,
    )


async def fail_by_ids(rt: Runtime, ids: tuple[str, int, int, int], kind: FailureKind, reason: str, d: Delivery) -> None:
    """Fail the rollout a message names when the message cannot say more (unreadable, or its session
    is gone), unless that rollout lives on without it.

    A live (or finished) session of the same or a later attempt is left alone: a stray corrupt copy
    must not end a healthy rollout (if it was the rollout's only next message, the janitor's deadline
    ends it). Otherwise the failure is committed like any other, so the rollout gets exactly one Result."""
    run_id, task, rollout, attempt = ids
    sid = session_id(run_id, task, rollout)
    loaded = await rt.store.get(sid)
    if loaded is not None and loaded[0].attempt >= attempt:
        log.warning("a stray message for live rollout %s (attempt %d) left it running: %s", sid, attempt, reason)
        return
    s, rev = stub_session(ids, d, loaded[0].step if loaded else 0), loaded[1] if loaded else 0
    s.result = build_result(s, failure=(kind, reason))
    s.phase = "done"
    await rt.commit(s, rev, d, time.perf_counter())


async def publish_orphan_failure(
    js: JetStreamContext, sid: str, kind: FailureKind, reason: str, ids: tuple[str, int, int, int] | None = None
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
        timings=_finished(Timings()),
    )
    await publish(js, topology.result_subject(run_id), result, f"{result.session_id}:failed:{attempt}")


RECORD_HEADROOM = 64 * 1024
"""Bytes kept free under the broker's max_payload for headers."""


def max_record_bytes(js: JetStreamContext) -> int:
    """Largest session record or Result this broker takes: its max_payload (8 MiB shipped, 1 MiB default)."""
    nc = getattr(js, "_nc", None)
    server = getattr(nc, "max_payload", 0) or topology.MAX_MSG_SIZE
    return min(server, topology.MAX_MSG_SIZE) - RECORD_HEADROOM


def fit(s: Session, limit: int) -> bytes:
    """Keep a session (and its Result) within ``limit`` bytes; returns the session's record, encoded
    once here for both the size check and the write.

    A live rollout that outgrows it fails with ``context_length`` (the transcript no longer fits a
    message); a finished one that does is kept as a failure whose output is dropped, so it still ends
    as one Result with its reason, never as a lost rollout."""
    record = session_encoder.encode(s)
    size = max(len(record), len(encoder.encode(s.result)) if s.result else 0)
    if size <= limit:
        return record
    reason = f"the rollout's record is {size / 2**20:.1f} MiB, over the {limit / 2**20:.1f} MiB message limit"
    if s.phase != "done":
        raise ContextLength(reason)
    kind, why = (s.result.failure_kind, s.result.failure_reason) if s.result and s.result.failed else (None, None)
    s.items, s.pending, s.env_state, s.turns = s.items[: s.n_input], [], {}, []
    if len(session_encoder.encode(s)) > limit:
        s.items, s.n_input, s.params, s.meta = [], 0, {}, {}
    s.result = build_result(s, failure=(kind or "context_length", f"{why}; {reason}" if why else reason))
    s.result = msgspec.structs.replace(s.result, output=[])
    return session_encoder.encode(s)


Handler = Callable[[Runtime, Any, Msg, Delivery], Awaitable[None]]
