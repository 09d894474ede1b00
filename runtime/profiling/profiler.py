"""The profiling consumer: a live profile of every run, kept in the ``runs`` bucket as ``<run_id>.profile``.

One durable consumer (``profiler``) reads all of ``gym.result.>``. Counting exactly once under
at-least-once delivery rests on one rule: **a run's state is always a fold of its result subject
from the start of the stream, in stream order, up to some sequence** (``next_seq - 1``). The
consumer only says which run moved and how far; the profiler then reads the run's subject from
where its state ends up to the delivered message (direct gets) and folds each message once; a
delivered message whose sequence is the very next one is folded as delivered, with no read. So:

- a redelivered message is at or below ``next_seq - 1``: nothing is folded twice;
- after a restart (state lost) or on a run first seen mid-stream, the fold starts at sequence 1 and
  rebuilds the run from the stream, which keeps every Result;
- with several profiler replicas, each one's state is still a prefix of the same fold, and a
  snapshot is written by compare-and-set only if it covers more of the stream than the stored one;
- a message is acked only once a snapshot covering it is in KV, so a crash between folding and
  writing loses nothing: the message comes back and the run is rebuilt.

Within the fold, one Sample per rollout is kept (its latest attempt; `SampleTable.add`), the same rule
``gymbus collect`` applies, so live and offline profiles of the same Results agree.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from broker import inspect, topology
from broker.connect import connect
from broker.schemas import result_decoder
from broker.topology import Limits
from runtime.engine.pull import Puller
from runtime.profiling import profile
from runtime.profiling.profile import Profile, RunInfo, Sample, SampleTable, TaskProfile
from runtime.telemetry import health

log = logging.getLogger("gymbus.profiler")

SNAPSHOT_LIMIT = topology.MAX_MSG_SIZE - 64 * 1024
"""Past this, a snapshot leaves out its per-task rows (the run's profile.json still has them)."""


class Snapshot(msgspec.Struct, kw_only=True):
    """The value of ``<run_id>.profile``: the run's profile and, when they fit, its task rows."""

    profile: Profile
    tasks: list[TaskProfile] = []
    tasks_omitted: bool = False


snapshot_decoder = msgspec.json.Decoder(Snapshot)


class RunState:
    """One run as folded so far: every Result on its subject with a sequence below ``next_seq``."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.subject = topology.result_subject(run_id)
        self.info: RunInfo | None = None
        self.samples = SampleTable(run_id)
        self.next_seq = 1
        self.flushed_seq = 0
        """The snapshot in KV covers the stream up to here."""
        self.revision = 0
        """KV revision of the snapshot this profiler last wrote (0: none)."""
        self.flushed_at = 0.0
        self.cost_s = 0.0
        """How long building the last snapshot took; a big run is snapshotted less often."""
        self.touched = time.monotonic()

    @property
    def folded_seq(self) -> int:
        return self.next_seq - 1


@dataclass
class Profiler:
    """The profiling function: run with `serve` (``gymbus profiler --nats URL``) or as a task in tests."""

    nats_url: str
    limits: Limits = field(default_factory=Limits.from_env)
    interval_s: float = 0.5
    """Least time between two snapshots of one run while Results keep coming."""
    batch: int = 256
    idle_evict_s: float = 600.0
    """Forget a run's state after this long without Results (it is rebuilt from the stream if needed)."""
    stats: Counter[str] = field(default_factory=Counter)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    runs: dict[str, RunState] = field(default_factory=dict)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)

    drain_s: float = 5.0
    """On stop, keep folding what is already in the stream for up to this long, then store and exit."""
    http_port: int | None = None
    """Serve /healthz on 0.0.0.0:PORT (see runtime/profiling/health.py); None: off."""
    _stopped_at: float = 0.0
    _nc: Client | None = None

    def stop(self) -> None:
        self._stopped_at = time.monotonic()
        self._stopping.set()

    def health(self) -> str:
        """``ok`` once connected and bound to its consumer; otherwise starting, disconnected or draining."""
        return health.status(stopping=self._stopping, ready=self.ready, nc=self._nc)

    async def run(self) -> None:
        """Consume until `stop()`, then fold what is left, write the last snapshots and return."""
        probe = await health.HealthServer.start(self.health, self.http_port) if self.http_port is not None else None
        if probe is not None:
            self.http_port = probe.port
        try:
            await self._run()
        finally:
            if probe is not None:
                await probe.stop()

    async def _run(self) -> None:
        nc = self._nc = await connect(self.nats_url, name="gymbus-profiler")
        try:
            js = nc.jetstream()
            await topology.ensure(js, self.limits)
            await topology.ensure_profiler(js, self.limits)
            puller = await Puller.bind(js, topology.RESULTS_STREAM, topology.PROFILER)
            kv = await js.key_value(topology.RUNS)
            self.ready.set()
            log.info("profiler consuming gym.result.> (durable consumer %r)", topology.PROFILER)
            await self._loop(js, kv, puller)
        finally:
            await nc.close()

    async def _loop(self, js: JetStreamContext, kv: KeyValue, puller: Puller) -> None:
        pending: list[NatsMsg] = []
        while True:
            stopping = self._stopping.is_set()
            msgs = await puller.take(self.batch, 0.2 if stopping else 1.0)
            try:
                for m in msgs:
                    await self._apply(js, m)
            except NatsTimeoutError:  # a busy broker: what was not folded is redelivered and folded then
                log.warning("reading the results stream timed out; the Results not folded yet are redelivered")
                self.stats["read_timeouts"] += 1
            pending += msgs
            idle = not msgs
            done = stopping and (idle or time.monotonic() - self._stopped_at > self.drain_s)
            if pending:
                await self._flush(kv, force=idle or done)
                pending = await _ack_covered(pending, self.runs)
            if done:  # whatever is still unacked goes to the next profiler
                return
            if idle:
                self._evict()

    async def _apply(self, js: JetStreamContext, m: NatsMsg) -> None:
        run_id = m.subject.removeprefix("gym.result.")
        st = self.runs.get(run_id)
        if st is None:
            st = self.runs[run_id] = RunState(run_id)
        st.touched = time.monotonic()
        seq = m.metadata.sequence.stream
        if seq < st.next_seq:
            self.stats["redelivered"] += 1
            return
        if seq == st.next_seq:  # nothing of the run's lies between: fold the copy delivered, read nothing
            self._fold(st, m.data)
            st.next_seq = seq + 1
            return
        await self._advance(js, st, seq)

    async def _advance(self, js: JetStreamContext, st: RunState, upto: int) -> None:
        """Fold the run's subject from ``next_seq`` through ``upto``."""
        async for raw in inspect.messages(js, topology.RESULTS_STREAM, st.subject, start_seq=st.next_seq):
            assert raw.seq is not None
            self.stats["read"] += 1
            if raw.seq > upto:
                break
            self._fold(st, raw.data or b"")
            st.next_seq = raw.seq + 1
            if raw.seq == upto:
                return
        st.next_seq = max(st.next_seq, upto + 1)  # deleted since it was delivered

    def _fold(self, st: RunState, data: bytes) -> None:
        try:
            r = result_decoder.decode(data)
        except msgspec.DecodeError as exc:
            log.error("undecodable Result on %s, not profiled: %s", st.subject, exc)
            self.stats["undecodable"] += 1
            return
        self.stats["folded" if st.samples.add(Sample.of(r)) else "superseded"] += 1

    async def _flush(self, kv: KeyValue, *, force: bool) -> None:
        now = time.monotonic()
        for st in list(self.runs.values()):
            if st.folded_seq <= st.flushed_seq:
                continue
            if not force and now - st.flushed_at < max(self.interval_s, 10 * st.cost_s):
                continue
            try:
                await self._snapshot(kv, st)
            except Exception as exc:  # not acked, so redelivered and retried: nothing is lost
                log.warning("snapshot of run %s failed: %s", st.run_id, exc)
                self.stats["snapshot_errors"] += 1

    async def _snapshot(self, kv: KeyValue, st: RunState) -> None:
        if st.info is None:
            st.info = await manifest(kv, st.run_id)
        started = time.perf_counter()
        folded = st.folded_seq
        prof, tasks = profile.build(st.info or RunInfo(run_id=st.run_id), st.samples, source="live")
        prof.last_seq = folded
        data = msgspec.json.encode(Snapshot(profile=prof, tasks=tasks))
        if len(data) > SNAPSHOT_LIMIT:
            data = msgspec.json.encode(Snapshot(profile=prof, tasks_omitted=True))
        st.cost_s = time.perf_counter() - started
        await self._store(kv, st, data, folded)
        st.flushed_seq = folded
        st.flushed_at = time.monotonic()
        self.stats["snapshots"] += 1

    async def _store(self, kv: KeyValue, st: RunState, data: bytes, folded: int) -> None:
        """Compare-and-set: replace the stored snapshot only with one that covers more of the stream."""
        key = topology.profile_key(st.run_id)
        for _ in range(5):
            try:
                st.revision = await kv.update(key, data, last=st.revision)
                return
            except KeyWrongLastSequenceError:
                try:
                    entry = await kv.get(key)
                except KeyNotFoundError:
                    st.revision = 0
                    continue
                st.revision = entry.revision or 0
                if _last_seq(entry.value or b"") >= folded:
                    return  # another replica stored a snapshot covering at least as much
        raise RuntimeError(f"snapshot {key}: compare-and-set kept conflicting")

    def _evict(self) -> None:
        cutoff = time.monotonic() - self.idle_evict_s
        for run_id, st in list(self.runs.items()):
            if st.touched < cutoff and st.flushed_seq >= st.folded_seq:
                del self.runs[run_id]


async def _ack_covered(pending: list[NatsMsg], runs: dict[str, RunState]) -> list[NatsMsg]:
    """Ack the messages a stored snapshot covers; the rest stay pending."""
    left = []
    for m in pending:
        st = runs.get(m.subject.removeprefix("gym.result."))
        if st is not None and m.metadata.sequence.stream <= st.flushed_seq:
            await m.ack()
        else:
            left.append(m)
    return left


def _last_seq(value: bytes) -> int:
    try:
        return snapshot_decoder.decode(value).profile.last_seq
    except msgspec.DecodeError:
        return 0


async def manifest(kv: KeyValue, run_id: str) -> RunInfo | None:
    """A run's RunInfo from its manifest, or None if the run has none (Results published by hand)."""
    try:
        entry = await kv.get(topology.manifest_key(run_id))
    except KeyNotFoundError:
        return None
    try:
        raw: dict[str, Any] = json.loads(entry.value or b"{}")
        return msgspec.convert({**raw, "run_id": run_id}, RunInfo)
    except (ValueError, msgspec.ValidationError) as exc:
        log.warning("manifest of run %s is unreadable: %s", run_id, exc)
        return None


async def read_snapshot(js: JetStreamContext, run_id: str) -> Snapshot | None:
    """The latest snapshot of a run, or None if the profiler has not written one."""
    try:
        kv = await js.key_value(topology.RUNS)
        entry = await kv.get(topology.profile_key(run_id))
    except (BucketNotFoundError, KeyNotFoundError):
        return None
    return snapshot_decoder.decode(entry.value or b"")


async def serve(profiler: Profiler) -> None:
    """Run the profiler until SIGTERM or SIGINT, then write its last snapshots and exit."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, profiler.stop)
    await profiler.run()
