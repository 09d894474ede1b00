"""The rollout state machine's one mechanism: a transition, applied exactly once.

A session's ``step`` counts committed transitions. A message carries the step it applies to:

    Start          session absent (or an older attempt)  -> step b+1, phase seed|tools|verify
    Seed    (s)    phase seed                            -> step s+1, phase model
    Resume  (s)    phase model                           -> step s+1, phase tools|verify|model
    Tools   (s)    phase tools                           -> step s+1, phase model
    Verify  (s)    phase verify                          -> step s+1, phase done (Result stored),
                                                            or model (an agent's Check below its bar)

Each transition is one compare-and-set on the session's KV revision, and the one message that
follows is derived from the committed state alone, published with the id ``<session>:<step>``.
So a redelivered message finds the session one step ahead and re-emits what may have been lost
(the stream drops it if it was not), and a message that lost a race finds a CAS conflict and
steps aside: nothing is applied twice (DESIGN invariant 2). The handlers of each role
(``agents.py``, ``environments.py``) are the work done inside `transition`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
from nats.js import JetStreamContext

from broker import topology
from broker.publish import publish
from broker.schemas import CARRY_MAX_BYTES, Msg, Phase, Resume, Seed, Session, Tools, Verify, session_decoder
from broker.sessions import SessionStore, StateConflict
from runtime.engine.admission import Admission
from runtime.engine.records import finish_timings, fit, max_record_bytes
from runtime.errors import DeadlineExceeded, GymError, Retry, Timeout
from runtime.sdk import Respond

if TYPE_CHECKING:
    from runtime.engine.inline import Verifiers

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
    subject: str = ""
    """The subject the message was published to."""

    @property
    def queued_s(self) -> float:
        return max(0.0, self.received_at - self.published_at)


@dataclass
class Runtime:
    """Resources every handler of a worker shares; built once per worker process."""

    js: JetStreamContext
    store: SessionStore
    respond: Respond | None = None
    admission: Admission | None = None
    """Decides Starts (agent workers) and reads runs' defaults (environment workers); see admission.py."""
    verifiers: Verifiers | None = None
    """Environments an agent worker verifies in its own turn (runtime/engine/inline.py)."""
    done_ttl_s: float = topology.DEFAULT_LIMITS.done_ttl_s
    """How long a finished session stays in KV (so late duplicates find it done), then expires."""
    dedupe_s: float = topology.DEFAULT_LIMITS.work_dedupe_s
    """The work stream's duplicate window: no second copy of a message is stored within it."""

    async def emit(self, s: Session, carry: tuple[bytes, int] | None = None) -> None:
        """Publish the one message the session's committed state calls for; ``carry`` is the record
        just committed and its revision, for the message to carry (see `Carrier`)."""
        subject, msg = next_message(s, carry)
        await publish(self.js, subject, msg, message_id(s), s.headers or None)

    async def commit(self, s: Session, rev: int, d: Delivery, started: float, *, reemit: bool = True) -> bool:
        """Apply the transition (step + 1) by CAS and emit its message; False if another worker won."""
        advance(s, d, started)
        return await self.write(s, rev, reemit=reemit)

    async def write(self, s: Session, rev: int, *, reemit: bool = True) -> bool:
        """Store an advanced session by CAS on ``rev`` and emit its message; False if another worker won
        (then, with ``reemit``, publish what the winner's state calls for)."""
        record = fit(s, max_record_bytes(self.js))
        # a failed rollout's session outlives the short done TTL (bucket TTL), so `gymbus replay` can re-run it
        ttl = self.done_ttl_s if s.phase == "done" and s.result is not None and not s.result.failed else None
        try:
            new = await self.store.update(s, last=rev, ttl_s=ttl, record=record)
        except StateConflict:
            log.debug("session %s step %d: applied by another worker", s.session_id, s.step - 1)
            if reemit:
                await self.reemit_if(s.session_id, s.step)
            return False
        await self.emit(s, (record, new) if len(record) <= CARRY_MAX_BYTES else None)
        return True

    async def reemit_if(self, sid: str, step: int) -> None:
        """Publish what the session's state calls for if it is at ``step`` (a no-op if already published)."""
        loaded = await self.store.get(sid)
        if loaded is not None and loaded[0].step == step:
            await self.emit(loaded[0])


def message_id(s: Session) -> str:
    """The stream's dedupe key of the message the session's state calls for: ``<session>:<step>``, and
    ``:<attempt>`` after it from the second attempt on (an attempt started over from a rolled-back
    session can reach the steps an earlier attempt's surviving messages carry)."""
    return f"{s.session_id}:{s.step}" if s.attempt == 0 else f"{s.session_id}:{s.step}:{s.attempt}"


Step = Resume | Seed | Tools | Verify
"""A message that applies to one step of one attempt of a session."""

Work = Callable[[Session], Awaitable[None]]
"""What a handler does inside a transition: change the loaded session, including its next ``phase``."""


async def transition(rt: Runtime, msg: Step, phase: Phase, d: Delivery, work: Work) -> None:
    """Load the session, and if ``msg`` (its step, in ``phase``, of its attempt) applies to it now, do
    ``work`` within the step's deadline and commit it (step + 1) by compare-and-set, emitting the
    message that follows. A first delivery of a message carrying its session skips the read (see `Carrier`);
    if the carried session then loses its compare-and-set, the bucket decides, as for a redelivery,
    and a session gone from it while its message is fresh was lost whole (`lost_whole`)."""
    from_msg = carried(msg, phase, d)
    if from_msg is not None:
        if await _apply(rt, *from_msg, d, work, reemit=False):
            return
        # The carried session lost its compare-and-set: the bucket decides, as for a redelivery.
        try:
            loaded = await load_at(rt, msg, phase, d)
        except SessionLost:
            if msg.state is not None and lost_whole(rt, d):
                raise RolledBack(msg.session_id, msg.step, session=session_decoder.decode(msg.state)) from None
            raise
    else:
        loaded = await load_at(rt, msg, phase, d)
    if loaded is not None:
        await _apply(rt, *loaded, d, work)


async def _apply(rt: Runtime, s: Session, rev: int, d: Delivery, work: Work, *, reemit: bool = True) -> bool:
    """Do ``work`` on the session within the step's deadline and commit it; False if another worker won."""
    started = time.perf_counter()
    async with deadline(s):
        await work(s)
    return await rt.commit(s, rev, d, started, reemit=reemit)


def lost_whole(rt: Runtime, d: Delivery) -> bool:
    """Whether a session missing for the first delivery of a message that carried it was lost whole
    (a power cut under a sync interval took its every write) rather than finished and expired.

    The message was published right after its session's write, and within the duplicate window no
    other copy of it can be stored, so nothing else could have taken the session past it: finishing
    and then expiring ``done_ttl_s`` later needs more time than has passed since."""
    return d.received_at - d.published_at < min(rt.dedupe_s, rt.done_ttl_s)


def carried(msg: Step, phase: Phase, d: Delivery) -> tuple[Session, int] | None:
    """The session a message carries, if this is its first delivery and the session is at its step.

    A redelivery reads the bucket instead: its first delivery may have committed the step already,
    and the bucket says so before any work is redone."""
    if msg.state is None or d.num_delivered > 1:
        return None
    if isinstance(msg, Resume) and not d.subject.endswith(topology.RESUME_SUFFIX):
        # Starts share the agent's other subject, and submitters may publish there: a state found
        # on it could be forged, so the bucket is read instead.
        log.warning("session %s: a Resume carrying a session on %s, not its resume subject: state ignored",
                    msg.session_id, d.subject or "an unknown subject")
        return None
    s = session_decoder.decode(msg.state)
    return (s, msg.rev) if (s.attempt, s.step, s.phase) == (msg.attempt, msg.step, phase) else None


async def load_at(rt: Runtime, msg: Step, phase: Phase, d: Delivery) -> tuple[Session, int] | None:
    """The session if ``msg`` applies to it now; otherwise re-emit if needed and return None.

    Steps are compared within an attempt, and a later attempt is ahead of every step of an earlier
    one. A session the leader shows behind its message lost the write that message was emitted
    after: a power cut under a sync interval kept the message and not the write. The first delivery
    asks for another look a second later; a later delivery that finds it still behind raises
    `RolledBack`, and the worker starts the rollout over as a new attempt (runtime/engine/attempts.py)."""
    sid, step, at = msg.session_id, msg.step, (msg.attempt, msg.step)
    loaded = await rt.store.get(sid, any_replica=True)
    if loaded is None or (loaded[0].attempt, loaded[0].step) < at:
        # The message was emitted after its step's write was acknowledged, so a session behind it was
        # read from a replica that has not applied that write yet: ask the leader.
        loaded = await rt.store.get(sid)
    if loaded is None:
        raise SessionLost(sid)
    s, rev = loaded
    now = (s.attempt, s.step)
    if now == at and s.phase == phase:
        return s, rev
    if now == (msg.attempt, step + 1):
        await rt.emit(s)  # our transition is committed; the message after it may have been lost
    elif now == at:
        log.error("session %s step %d is in phase %s, not %s: message dropped", sid, step, s.phase, phase)
    elif now < at:
        if d.num_delivered < 2:
            raise Retry(reason=f"session {sid} is at {_where(*now)}, behind its message's {_where(*at)}")
        raise RolledBack(sid, s.step, f"{_where(*now)}, behind its message's {_where(*at)}")
    return None


def _where(attempt: int, step: int) -> str:
    return f"step {step}" if attempt == 0 else f"step {step} of attempt {attempt}"


def advance(s: Session, d: Delivery, started: float) -> None:
    """Count the hop in the session's timings and take the transition (step + 1), before it is stored."""
    t = s.timings
    t.hops += 1
    t.queue_s += d.queued_s
    t.handler_s += time.perf_counter() - started
    if s.phase == "done" and s.result is not None:
        s.result = msgspec.structs.replace(s.result, timings=finish_timings(t))
    s.step += 1


def next_message(s: Session, carry: tuple[bytes, int] | None = None) -> tuple[str, Msg]:
    """The message the session's state calls for, carrying ``carry`` (the record and revision just
    committed) unless it is the Result. Each goes to a subject only workers may publish to
    (broker/auth.py): a Resume to the agent's resume subject, not to the one Starts share."""
    sid, step, a = s.session_id, s.step, s.attempt
    state, rev = carry or (None, 0)
    match s.phase:
        case "seed":
            return topology.tool_subject(s.env), Seed(session_id=sid, step=step, attempt=a, state=state, rev=rev)
        case "model":
            resume = Resume(session_id=sid, step=step, attempt=a, state=state, rev=rev)
            return topology.resume_subject(s.agent), resume
        case "tools":
            tools = Tools(session_id=sid, step=step, attempt=a, calls=s.pending, state=state, rev=rev)
            return topology.tool_subject(s.env), tools
        case "verify":
            return topology.verify_subject(s.env), Verify(session_id=sid, step=step, attempt=a, state=state, rev=rev)
        case "done":
            assert s.result is not None
            return topology.result_subject(s.run_id), s.result
    raise AssertionError(f"unknown phase {s.phase!r}")


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


class SessionLost(GymError):
    """A message arrived for a session that is not in KV (expired or purged)."""

    kind = "internal"
    retry = False

    def __init__(self, sid: str) -> None:
        super().__init__(
            f"session {sid} is missing from the sessions bucket (expired, purged, or its first write lost "
            "to a power cut under a sync interval)"
        )
        self.sid = sid


class RolledBack(GymError):
    """The session is behind the message in hand on a second look, or gone while the message carried
    it: the write the message was emitted after is lost (a broker's power cut under a sync interval).
    Nothing left runs the step the session is at, so the rollout starts over as a new attempt, from
    the session in the bucket or, when it is gone, from the one the message carried (``session``)."""

    kind = "internal"
    retry = False

    def __init__(self, sid: str, at: int, where: str = "", session: Session | None = None) -> None:
        what = f"is at {where} on a second look" if session is None else "is gone though its message carried it"
        super().__init__(
            f"session {sid} {what}: the broker lost the write that message was emitted after "
            "(a power cut under a sync interval)"
        )
        self.sid, self.at, self.session = sid, at, session


Handler = Callable[[Runtime, Any, Msg, Delivery], Awaitable[None]]
"""A role's entry point: the runtime, the function it serves, the decoded message, its delivery."""
