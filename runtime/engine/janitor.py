"""The janitor: what ends the rollouts no handler will ever end, so every run finishes.

Three sweeps, all idempotent (a session changes only by compare-and-set, a dead letter is keyed by
its work-stream sequence), so any number of janitors may run:

- **Lost messages.** A work message delivered ``max_deliver`` times without an answer (its workers
  died on it, or hung past the ack wait each time) is left in the work stream by the broker, which
  publishes a max-deliveries advisory. The advisory is captured in ``GYM_ADVISORIES`` (so none is
  lost while no janitor runs); the janitor moves the message to ``gym.dead.<function>`` and fails
  its rollout with ``worker_lost``.
- **Deadlines.** A rollout whose message is never handled (stuck behind a subject nobody serves)
  would never reach its in-handler deadline check. The reaper scans the ``sessions`` bucket and
  fails every live session past ``rollout_timeout_s`` (plus ``grace_s``) with ``timeout``.
- **Stalls.** A power cut under a sync interval can keep a step's consumed message gone (its ack
  synced) and lose the step's session write: the session is back at a step nothing will run. A
  live session not written for ``stall_after_s`` gets the message its state calls for published
  again under that message's id, once per write. While the message is still in the stream the
  stream drops the copy (its duplicate window outlasts the wait); after a broker restart its
  window knows only the messages it kept, so a consumed one is published and the step redone.
- **Unserved subjects.** A message on a work subject no consumer serves is dead-lettered and its
  rollout failed with ``invalid_input``, naming the subject: after ``unknown_after_s`` (seconds) when
  no worker of that name ever registered (an unknown agent or environment: a typo), after
  ``orphan_after_s`` when one did (its workers are away).

Every worker runs a janitor by default (``Worker.janitor``), so a deployment with any live worker
has one; ``gymbus janitor`` runs one on its own. The advisory consumer is shared by all janitors
(each advisory handled once); the two scans run in one janitor at a time, under a lease in the
``runs`` bucket.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field

import msgspec
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

from broker import advisories, functions, topology
from broker.denials import PermissionDenied
from broker.schemas import FailureKind, Msg, wire_decoder
from broker.sessions import Deadlines, SessionStore
from broker.topology import InvalidLimit, Limits
from runtime.engine.deadletters import dead_letter, lenient_ids, sid_of
from runtime.engine.failures import fail, fail_by_ids
from runtime.engine.pull import Puller
from runtime.engine.records import build_result, end
from runtime.engine.transitions import Delivery, Runtime, next_message

log = logging.getLogger("gymbus.janitor")

LEASE_KEY = "janitor.lease"
MOVE_PER_SWEEP = 1000
"""Most messages of unserved subjects moved per sweep (the next sweep takes the rest)."""


ENV = {
    "scan_interval_s": "GYMBUS_JANITOR_INTERVAL_S",
    "grace_s": "GYMBUS_JANITOR_GRACE_S",
    "stall_after_s": "GYMBUS_JANITOR_STALL_S",
    "orphan_after_s": "GYMBUS_ORPHAN_AFTER_S",
    "unknown_after_s": "GYMBUS_UNKNOWN_AFTER_S",
}
"""The janitor's settings and the variables that override them."""


@dataclass
class Janitor:
    js: JetStreamContext
    limits: Limits = field(default_factory=Limits)
    holder: str = "janitor"
    """Who holds the scan lease (unique per janitor)."""
    scan_interval_s: float = 5.0
    grace_s: float = 5.0
    """How long past a rollout's deadline the reaper waits (its own handler's deadline fires first)."""
    orphan_after_s: float = 120.0
    """How long a message may wait on a subject no worker serves, of a function that registered once."""
    unknown_after_s: float = 5.0
    """How long a message may wait on a subject of a function that never registered (an unknown name)."""
    stall_after_s: float = 20.0
    """How long a live session may go unwritten before the message its state calls for is published
    again (see Stalls above)."""
    stats: Counter[str] = field(default_factory=Counter)
    deadlines: Deadlines | None = None
    """The live sessions' deadlines, kept by the reaper across sweeps (each reads only the new writes)."""
    nudged: dict[str, float] = field(default_factory=dict)
    """Session id -> the write whose message was published again (once per write)."""

    @classmethod
    def from_env(cls, js: JetStreamContext, limits: Limits, holder: str, **given: float) -> Janitor:
        """Defaults overridden by the variables of `ENV`, then by ``given``; `InvalidLimit` names a
        variable that is not a number."""
        values: dict[str, float] = {}
        for name, variable in ENV.items():
            raw = os.environ.get(variable)
            if not raw:
                continue
            try:
                values[name] = float(raw)
            except ValueError:
                raise InvalidLimit(f"{variable}={raw!r} is not a number of seconds") from None
        janitor = cls(js, limits, holder=holder)
        for name, value in {**values, **given}.items():
            setattr(janitor, name, value)
        return janitor

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set."""
        rt = Runtime(self.js, SessionStore(self.js), done_ttl_s=self.limits.done_ttl_s)
        try:
            await advisories.ensure_consumer(self.js)
        except PermissionDenied as denied:  # a least-privileged worker: `gymbus janitor` has the identity
            log.info("no janitor in this process: %s", denied)
            return
        puller = await Puller.bind(self.js, topology.ADVISORY_STREAM, advisories.JANITOR)
        loops = [asyncio.create_task(self._advisories(rt, puller, stop)), asyncio.create_task(self._sweeps(rt, stop))]
        try:
            await stop.wait()
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    async def _advisories(self, rt: Runtime, puller: Puller, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for m in await puller.take(16, 1.0):
                try:
                    await self.move_lost(rt, advisories.decoder.decode(m.data))
                except msgspec.DecodeError as exc:
                    log.error("undecodable advisory dropped: %s", exc)
                except Exception as exc:
                    log.warning("advisory not handled yet (%s); it comes back", exc)
                    await m.nak(delay=2.0)
                    continue
                await m.ack()

    async def _sweeps(self, rt: Runtime, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                if await self._lease():
                    await self.reap(rt)
                    await self.nudge_stalled(rt)
                    await self.move_orphans(rt)
            except Exception as exc:
                log.warning("janitor sweep failed (next one in %gs): %s", self.scan_interval_s, exc)
            try:
                await asyncio.wait_for(stop.wait(), self.scan_interval_s)
            except TimeoutError:
                pass

    # ---- lost messages ---------------------------------------------------------------------------

    async def move_lost(self, rt: Runtime, adv: advisories.MaxDeliveries) -> None:
        """Dead-letter the message an advisory names and fail its rollout with ``worker_lost``."""
        if adv.stream != topology.WORK_STREAM:
            return
        try:
            raw = await self.js.get_msg(topology.WORK_STREAM, seq=adv.stream_seq)
        except NotFoundError:  # acknowledged or moved since: nothing was lost
            self.stats["advisory_stale"] += 1
            return
        reason = (
            f"{adv.deliveries} deliveries to {adv.consumer} went unanswered "
            "(the workers died or hung past the ack wait each time)"
        )
        await self._bury(rt, raw, advisories.function_of(adv.consumer), "worker_lost", reason, adv.deliveries)
        self.stats["worker_lost"] += 1

    async def _bury(
        self, rt: Runtime, raw: RawStreamMsg, function: str, kind: FailureKind, reason: str, deliveries: int
    ) -> None:
        """Dead letter, failed Result, then remove it from the work stream (each step idempotent)."""
        data = raw.data or b""
        msg = _decode(data)
        sid = sid_of(msg) if msg is not None else (ids[0] if (ids := lenient_ids(data)) else None)
        await dead_letter(
            self.js,
            function=function,
            subject=raw.subject or "",
            stream_seq=raw.seq or 0,
            data=data,
            headers=raw.headers,
            num_delivered=deliveries,
            kind=kind,
            error=reason,
            sid=sid,
        )
        published = raw.time.timestamp() if raw.time else time.time()
        d = Delivery(published_at=published, num_delivered=deliveries)
        if msg is not None:
            await fail(rt, msg, kind, reason, d)
        elif (ids := lenient_ids(data)) is not None:
            await fail_by_ids(rt, ids[1:], kind, reason, d)
        try:
            await self.js.delete_msg(topology.WORK_STREAM, raw.seq or 0)
        except NotFoundError:
            pass

    # ---- deadlines -------------------------------------------------------------------------------

    async def reap(self, rt: Runtime, now: float | None = None) -> int:
        """Fail every live session past its rollout deadline with ``timeout``; returns how many."""
        now = time.time() if now is None else now
        reaped = 0
        if self.deadlines is None:
            self.deadlines = Deadlines(self.js)
        for sid in await self.deadlines.overdue(now - self.grace_s):
            loaded = await rt.store.get(sid)
            if loaded is None or loaded[0].phase == "done":  # expired, or ended since the look
                self.deadlines.forget(sid)
                continue
            s, rev = loaded
            if now < s.timings.submitted_at + s.options.rollout_timeout_s + self.grace_s:
                continue
            waiting_on, _ = next_message(s)
            reason = (
                f"rollout exceeded rollout_timeout_s={s.options.rollout_timeout_s:g} waiting on {waiting_on} "
                f"(phase {s.phase}, step {s.step}); ended by the janitor"
            )
            end(s, build_result(s, failure=("timeout", reason)))
            if await rt.commit(s, rev, Delivery(published_at=now), time.perf_counter()):
                reaped += 1
        self.stats["reaped"] += reaped
        return reaped

    # ---- stalls ----------------------------------------------------------------------------------

    async def nudge_stalled(self, rt: Runtime, now: float | None = None) -> int:
        """Publish again what each live session unwritten for ``stall_after_s`` calls for (once per
        write); returns how many. Only within half the work stream's duplicate window (the rest is a
        margin for clocks): past it a copy of a message still waiting would not be dropped, and the
        reaper ends the rollout at its deadline."""
        if self.deadlines is None:
            return 0
        now = time.time() if now is None else now
        window = self.limits.work_dedupe_s / 2
        self.nudged = {sid: w for sid, w in self.nudged.items() if sid in self.deadlines.written}
        nudged = 0
        for sid, written in list(self.deadlines.written.items()):
            if not self.stall_after_s <= now - written < window or self.nudged.get(sid) == written:
                continue
            self.nudged[sid] = written
            loaded = await rt.store.get(sid)
            if loaded is None or loaded[0].phase == "done":
                continue
            try:
                await rt.emit(loaded[0])
            except PermissionDenied as denied:
                log.warning("session %s looks stalled, and this janitor may not publish its message: %s", sid, denied)
                continue
            nudged += 1
        self.stats["nudged"] += nudged
        return nudged

    # ---- unserved subjects -----------------------------------------------------------------------

    async def move_orphans(self, rt: Runtime, now: float | None = None) -> int:
        """Fail messages waiting on subjects no consumer serves for ``orphan_after_s``; returns how many."""
        now = time.time() if now is None else now
        info = await self.js.stream_info(topology.WORK_STREAM, subjects_filter="gym.>")
        waiting = {s: n for s, n in (info.state.subjects or {}).items() if n}
        if not waiting:
            return 0
        served: set[str] = set()
        for c in await self.js.consumers_info(topology.WORK_STREAM):
            served.update([c.config.filter_subject or "", *(c.config.filter_subjects or [])])
        unserved = sorted(set(waiting) - served)
        if not unserved:
            return 0
        registered = await functions.registered(self.js)
        moved = 0
        for subject in unserved:
            moved += await self._move_subject(rt, subject, now, MOVE_PER_SWEEP - moved, registered)
        self.stats["orphaned"] += moved
        return moved

    async def _move_subject(
        self, rt: Runtime, subject: str, now: float, most: int, registered: set[tuple[functions.FunctionRole, str]]
    ) -> int:
        role, name = topology.function_of(subject)
        what, field = ("agent", "agent") if role == "agent" else ("environment", "env")
        if ("agent" if role == "agent" else "env", name) in registered:
            after = self.orphan_after_s
            why = f"nothing consumed it for {after:g}s, though a worker of it registered once"
        else:
            after = min(self.orphan_after_s, self.unknown_after_s)
            known = sorted(n for r, n in registered if r == ("agent" if role == "agent" else "env"))
            why = f"no worker of it ever registered; registered {what}s: {', '.join(known) or 'none'}"
        reason = f"no worker serves {subject}: unknown {what} {name!r} ({why}) - at `$.{field}`"
        moved, seq = 0, 1
        while moved < most:
            try:
                raw = await self.js.get_msg(topology.WORK_STREAM, seq=seq, subject=subject, next=True)
            except NotFoundError:
                break
            if raw.time is not None and now - raw.time.timestamp() < after:
                break
            await self._bury(rt, raw, name, "invalid_input", reason, 0)
            moved, seq = moved + 1, (raw.seq or seq) + 1
        return moved

    # ---- lease -----------------------------------------------------------------------------------

    async def _lease(self) -> bool:
        """Hold the scan lease for three intervals (taken over when its holder stops renewing it)."""
        kv = await self.js.key_value(topology.RUNS)
        now = time.time()
        value = json.dumps({"holder": self.holder, "until": now + 3 * self.scan_interval_s}).encode()
        try:
            entry = await kv.get(LEASE_KEY)
        except KeyNotFoundError:
            try:
                await kv.create(LEASE_KEY, value)
            except KeyWrongLastSequenceError:
                return False
            return True
        held = json.loads(entry.value or b"{}")
        if held.get("holder") != self.holder and float(held.get("until", 0)) > now:
            return False
        try:
            await kv.update(LEASE_KEY, value, last=entry.revision)
        except KeyWrongLastSequenceError:
            return False
        return True


def _decode(data: bytes) -> Msg | None:
    try:
        return wire_decoder.decode(data)
    except msgspec.DecodeError:
        return None
