"""Which rollouts of a run still need a Start, and publishing them.

A rollout that has a Result is never submitted again; one whose Result was deleted, or that is stuck
past its deadline, is submitted again as a new attempt (one whose finished session lacks a Result
never stored is nudged: see `_never_removed`). One still in flight within its deadline gets its
Start again under the same attempt, marked `NUDGE` and with an id of its own
(``<session>:nudge:<attempt>:<step>``): the agent finds the session live and publishes again the
message its state calls for. The nudge carries the rollout's trace context, so its hop (message kind
``nudge``) is one more span of the rollout's trace, not a trace of its own. The stream drops that
copy while the message is still there (its id is the same); it redoes a step whose session write a
power cut under a sync interval took after the step's own message was consumed, which nothing else
would run before the rollout's deadline. Every Start carries its deterministic message id, so
submitting twice publishes nothing twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable

from nats.errors import MaxPayloadError
from nats.js import JetStreamContext

from broker import topology
from broker.publish import publish
from broker.schemas import NUDGE, Session, encoder, parse_session_id, session_id
from broker.sessions import SessionStore
from runtime.engine import deadletters
from runtime.engine.failures import publish_orphan_failure
from runtime.errors import InputError
from runtime.runs.config import RunConfig
from runtime.runs.keys import Attempts, Grid, Key, Live
from runtime.runs.tasks import TaskRow, build_start
from runtime.telemetry.spans import RolloutSpans

log = logging.getLogger("gymbus.collect")


async def plan(
    js: JetStreamContext,
    grid: Grid,
    missing: Iterable[Key],
    run_id: str,
    fresh: bool,
    now: float,
    finished: Callable[[list[Key]], Awaitable[set[Key]]] | None = None,
) -> Attempts:
    """The attempt to submit per missing rollout (in grid order); rollouts still in flight within their
    deadline are nudged (`Attempts.live`).

    ``missing`` was read from the run's Results before the sessions are: a rollout that finishes in
    between has a finished session and a Result the caller has not seen, so ``finished`` (which of
    these keys have a Result now) is asked about those first. See `_never_removed` for the others."""
    attempts = Attempts(grid)
    if fresh:
        for key in missing:
            attempts.set(key, 0)
        return attempts
    store, todo = SessionStore(js), iter(missing)
    restorable = await _never_removed(js)
    ended: dict[Key, tuple[int, Live | None]] = {}
    """Rollouts whose session is finished: its attempt, and how to nudge it if its Result can be restored."""

    def decide(s: Session | None) -> tuple[int, Live | None]:
        """The attempt to submit for an unfinished session, and the session of a rollout still in
        flight (to nudge it)."""
        if s is None:
            return 0, None
        if s.timings.submitted_at + s.options.rollout_timeout_s < now:  # stuck past its deadline
            return s.attempt + 1, None
        return s.attempt, _live(s)

    async def reader() -> None:  # 64 of these share one iterator: as many reads in flight
        for key in todo:
            loaded = await store.get(session_id(run_id, *key))
            s = loaded[0] if loaded is not None else None
            if s is not None and s.phase == "done":  # finished, but no Result was seen (yet)
                restore = restorable and s.result is not None
                ended[key] = (s.attempt, _live(s) if restore else None)
                continue
            attempt, live = decide(s)
            attempts.set(key, attempt)
            if live is not None:
                attempts.live[key] = live

    await asyncio.gather(*(reader() for _ in range(64)))
    if ended:
        present = await finished(list(ended)) if finished is not None else set()
        for key, (attempt, live) in ended.items():
            if key in present:
                continue
            attempts.set(key, attempt if live is not None else attempt + 1)
            if live is not None:
                attempts.live[key] = live
    return attempts  # publish_starts submits them in task order


def _live(s: Session) -> Live:
    """How to nudge the session's rollout: its step, and its trace context (the session's headers)."""
    return Live(s.step, dict(s.headers))


async def _never_removed(js: JetStreamContext) -> bool:
    """Whether no Result was ever removed from the results stream (no deletion, no purge).

    Then a finished session's Result that is not in the stream was never stored: its worker died
    between writing the session and publishing it, or a power cut lost it. Its rollout is nudged,
    and the agent publishes the Result again from the session, reward and all (the redelivery of
    the dead worker's message would too, an ack wait later). Otherwise the Result may have been
    deleted, which is how a rollout is run again: its copy would be dropped as a duplicate, so the
    rollout runs again as a new attempt."""
    state = (await js.stream_info(topology.RESULTS_STREAM)).state
    return not state.num_deleted and state.first_seq <= 1


class Window:
    """At most ``size`` of the rollouts a command submitted are without a Result: a Start is published
    when a slot is free, and a slot frees when its rollout's Result (of that attempt) arrives. A large
    run is thus fed to the workers as they take it, not queued whole: what waits in the broker, what
    the gatherer holds, and the time a Start waits before a worker takes it (which its rollout's
    deadline counts) stay the same whatever the run's size."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = asyncio.Semaphore(size)
        self._open: dict[Key, int] = {}
        self.entered = 0
        """How many rollouts were let through so far."""

    async def enter(self, key: Key, attempt: int) -> None:
        await self._free.acquire()
        self._open[key] = attempt
        self.entered += 1

    def leave(self, key: Key, attempt: int) -> None:
        """A Result of ``key`` arrived; its slot frees if it is of the attempt submitted (or later)."""
        if key in self._open and attempt >= self._open[key]:
            del self._open[key]
            self._free.release()


async def publish_starts(
    js: JetStreamContext,
    cfg: RunConfig,
    run_id: str,
    tasks: dict[int, TaskRow],
    attempts: Attempts,
    roots: RolloutSpans | None = None,
    window: Window | None = None,
) -> int:
    """Publish the Start of every rollout in ``attempts``, in task order and, with a ``window``, as its
    slots free; a row that cannot be a Start (unreadable, over the broker's max_payload) ends its
    rollouts as failed Results instead. Returns how many, not counting the nudges (``attempts.live``)."""

    async def one(task_index: int, rollout: int, attempt: int) -> None:
        task, ids = tasks[task_index], (run_id, task_index, rollout, attempt)
        sid = session_id(run_id, task_index, rollout)
        live = attempts.live.get((task_index, rollout))
        if live is None:
            msg_id, headers = f"{sid}:start:{attempt}", None
        else:  # a nudge never fails its rollout: it is running, and ends with a Result of its own
            msg_id, headers = f"{sid}:nudge:{attempt}:{live.step}", {**live.trace, NUDGE: "1"}
        if task.row is None or task.error:  # unreadable or refused row: its rollouts fail here, with the reason
            if live is None:
                await publish_orphan_failure(js, sid, "invalid_input", task.error or "unreadable task row", ids)
            return
        start = build_start(cfg, run_id, task, rollout, attempt)  # the row as it is: the workers decide
        subject = topology.agent_subject(start.agent)
        try:
            # a rollout's root opens once, with its first Start; a nudge is a hop of that trace
            with roots.submitting(start, sid) if roots and live is None else contextlib.nullcontext():
                await publish(js, subject, start, msg_id, headers)
        except MaxPayloadError:  # too big for one message: the rollout fails with the reason, the run goes on
            reason = (
                f"task row {task_index} is {len(encoder.encode(start)) / 2**20:.1f} MiB as a Start message, "
                f"over the broker's max_payload ({js._nc.max_payload / 2**20:.1f} MiB)"
            )
            if live is None:
                await publish_orphan_failure(js, sid, "invalid_input", reason, ids)

    todo = attempts.items()

    async def publisher() -> None:  # 256 of these share one iterator: as many publishes in flight
        for (task_index, rollout), attempt in todo:
            if window is not None:
                await window.enter((task_index, rollout), attempt)
            await one(task_index, rollout, attempt)

    await asyncio.gather(*(publisher() for _ in range(min(256, len(attempts)))))
    return len(attempts) - len(attempts.live)


async def replay(js: JetStreamContext, run_id: str, seqs: list[int]) -> dict[Key, int]:
    """Re-submit dead-lettered rollouts of the run (``seqs``; empty: all of them); returns the attempt
    each now waits for. InputError, before anything is re-submitted, if a seq is not one of the run's."""
    letters = await deadletters.letters(js, run_id=run_id)
    unknown = sorted(set(seqs) - {x.seq for x in letters})
    if unknown:
        have = ", ".join(str(x.seq) for x in letters) or "none"
        raise InputError(f"no dead letter {unknown[0]} in run {run_id!r} (its dead letters: {have})")
    chosen = [x for x in letters if not seqs or x.seq in seqs]
    if not chosen:
        raise InputError(f"run {run_id!r} has no dead letters to replay")
    wanted = {}
    for done in await deadletters.replay(js, chosen):
        log.warning("replay of dead letter %d (%s): %s", done.seq, done.session_id, done.note)
        if done.attempt is not None and done.session_id:
            _, task, rollout = parse_session_id(done.session_id)
            wanted[(task, rollout)] = done.attempt
    return wanted
