"""The worker: binds one function to its durable consumer(s) and runs messages through it.

It keeps its free handler slots asked for, runs up to ``concurrency`` messages at once, tells the
broker a long handler is still in progress, acks on success, naks with backoff on retryable errors, and ends
the rollout with a failed Result (plus a dead letter when the delivery budget is spent) on
permanent ones. It holds no state between messages (DESIGN invariant 4); SIGTERM drains it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg

from broker import topology
from broker.connect import connect
from broker.schemas import (
    NUDGE,
    FailureKind,
    Msg,
    Options,
    Start,
    agent_decoder,
    tool_decoder,
    verify_decoder,
)
from broker.sessions import SessionStore
from broker.topology import Limits, Role
from runtime.engine import registry
from runtime.engine import retry as policy
from runtime.engine.admission import Admission, rejection
from runtime.engine.agents import handle_agent
from runtime.engine.attempts import NEW_ATTEMPT_KINDS, start_over, step_of
from runtime.engine.clients import close_client
from runtime.engine.deadletters import dead_letter, lenient_ids, sid_of
from runtime.engine.environments import handle_tool, handle_verify
from runtime.engine.failures import fail, fail_by_ids
from runtime.engine.inline import Verifiers, inline_from_env
from runtime.engine.janitor import Janitor
from runtime.engine.metrics import HttpServer, WorkerMetrics
from runtime.engine.pull import Consumer, Slots
from runtime.engine.transitions import Delivery, Handler, RolledBack, Runtime
from runtime.errors import RETRIED_KINDS, GymError, Retry
from runtime.model.client import Endpoints, ModelClient
from runtime.sdk import Agent, Function
from runtime.telemetry import genai, health, spans

log = logging.getLogger("gymbus.worker")

_ROUTES: dict[Role, tuple[Callable[[bytes], Any], Handler]] = {
    "agent": (agent_decoder.decode, handle_agent),
    "tool": (tool_decoder.decode, handle_tool),
    "verify": (verify_decoder.decode, handle_verify),
}


def roles_of(fn: Function) -> list[Role]:
    return ["agent"] if isinstance(fn, Agent) else ["tool", "verify"]


@dataclass
class Worker:
    """One function's worker process (or task, in tests)."""

    function: Function
    nats_url: str
    concurrency: int = 64
    batch: int | None = None
    """Fewest messages a pull request asks for: another is sent once this many slots are free beyond
    those asked for (None: a quarter of ``concurrency``; runtime/engine/pull.py `Consumer`)."""
    roles: list[Role] | None = None
    model_url: str | None = None
    limits: Limits = field(default_factory=Limits.from_env)
    drain_timeout_s: float = 30.0
    fetch_timeout_s: float = 1.0
    """How long each pull request waits at the broker (its ``expires``)."""
    retried_kinds: frozenset[FailureKind] = RETRIED_KINDS
    """The retry policy of rollouts whose ``Options.retry`` is None (see runtime/engine/retry.py)."""
    heartbeat: bool = True
    """Send in-progress acks every ack_wait/3 while a handler runs (off only to test what they prevent)."""
    janitor: bool = True
    """Also run a janitor (dead letters of lost messages, rollout deadlines); see runtime/engine/janitor.py."""
    http_port: int | None = None
    """Serve /metrics and /healthz on 0.0.0.0:PORT (0: any free port, written back here); None: off."""
    verify_inline: bool = field(default_factory=inline_from_env)
    """An agent worker verifies in the agent's last turn for environments declaring ``verify_inline``
    (runtime/engine/inline.py); ``GYMBUS_VERIFY_INLINE=0`` keeps every verification a hop."""
    stats: Counter[str] = field(default_factory=Counter)
    metrics: WorkerMetrics = field(default_factory=WorkerMetrics)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _beating: dict[int, tuple[NatsMsg, float]] = field(default_factory=dict)
    """Messages being handled (by id) and the monotonic time of their last sign of life (see `_sweep`)."""
    _nc: Client | None = None
    _slots: list[Slots] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.function.name

    def stop(self) -> None:
        self._stopping.set()
        for slots in self._slots:
            slots.close()

    def health(self) -> str:
        """``ok`` once connected with its consumers bound; otherwise starting, disconnected or draining."""
        return health.status(stopping=self._stopping, ready=self.ready, nc=self._nc)

    async def run(self) -> None:
        """Serve until `stop()` (or SIGTERM in `serve`), then drain."""
        http = await HttpServer.start(self, self.http_port) if self.http_port is not None else None
        try:
            await self._run()
        finally:
            if http is not None:
                await http.stop()

    async def _connect(self) -> Client | None:
        """The broker connection, or None if the worker was stopped first (SIGTERM while a broker that
        was never reached is still being tried ends the worker at once)."""
        connecting = asyncio.ensure_future(connect(self.nats_url, name=f"gymbus-worker-{self.name}"))
        stopped = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({connecting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not connecting.done():
            connecting.cancel()
            await asyncio.gather(connecting, return_exceptions=True)
            return None
        return connecting.result()

    async def _run(self) -> None:
        nc = self._nc = await self._connect()
        if nc is None:
            return
        client: ModelClient | None = None
        sweeper: asyncio.Task[None] | None = None
        try:
            js = nc.jetstream()
            await topology.ensure(js, self.limits)
            if isinstance(self.function, Agent):
                client = ModelClient(Endpoints(js, self.model_url))
            admission = Admission(js, agent=self.name)
            rt = Runtime(
                js,
                SessionStore(js),
                respond=genai.TracedModel(client) if client else None,
                admission=admission,
                verifiers=Verifiers(admission) if isinstance(self.function, Agent) and self.verify_inline else None,
                done_ttl_s=self.limits.done_ttl_s,
                dedupe_s=self.limits.work_dedupe_s,
            )
            loops = []
            for role in self.roles or roles_of(self.function):
                durable = await topology.ensure_consumer(js, role, self.name, self.limits)
                slots = Slots(self.concurrency)
                self._slots.append(slots)
                consumer = Consumer(nc, topology.WORK_STREAM, durable)
                await consumer.start(slots, self._taker(rt, role, slots))
                threshold = self.batch or self.concurrency // 4
                loops.append(asyncio.create_task(consumer.run(threshold, self.fetch_timeout_s)))
            if self.janitor:
                jan = Janitor.from_env(js, self.limits, holder=f"worker-{self.name}-{os.getpid()}-{id(self):x}")
                loops.append(asyncio.create_task(jan.run(self._stopping)))
            sweeper = asyncio.create_task(self._sweep()) if self.heartbeat else None
            await registry.register(js, self.function)
            self.ready.set()
            log.info(
                "worker %s serving %s",
                self.name,
                [s for r in self.roles or roles_of(self.function) for s in topology.subjects(r, self.name)],
            )
            await self._stopping.wait()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._drain()
        finally:
            if sweeper is not None:
                sweeper.cancel()
            if client is not None:
                await client.close()
            await close_client(nc.jetstream())  # the one environments opened for named models (judges)
            await _close(nc)

    def _taker(self, rt: Runtime, role: Role, slots: Slots) -> Callable[[NatsMsg], None]:
        """What the consumer of ``role`` calls with each message it delivers: a handler task of its own."""
        decode, handle = _ROUTES[role]

        def take(m: NatsMsg) -> None:
            task = asyncio.create_task(self._process(rt, m, role, decode, handle, slots))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return take

    async def _process(
        self,
        rt: Runtime,
        m: NatsMsg,
        role: Role,
        decode: Callable[[bytes], Any],
        handle: Handler,
        slots: Slots,
    ) -> None:
        md = m.metadata
        d = Delivery(
            published_at=md.timestamp.timestamp(),
            num_delivered=md.num_delivered,
            headers={k: v for k, v in (m.headers or {}).items() if not k.startswith("Nats-")},
            subject=m.subject,
        )
        hop = spans.hop(m.subject, topology.durable(role, self.name), d, len(m.data))
        self._beating[id(m)] = (m, time.monotonic())
        self.stats["in_flight"] += 1
        self.stats["redelivered"] += md.num_delivered > 1
        try:
            try:
                msg = decode(m.data)
            except msgspec.DecodeError as exc:
                await self._reject(rt, m, role, exc, d)
                return
            kind = "nudge" if isinstance(msg, Start) and NUDGE in d.headers else type(msg).__name__.lower()
            hop.message(kind, sid_of(msg))
            try:
                if isinstance(msg, Start) and rt.admission is not None:
                    msg = await rt.admission.admit(msg, m.data)  # decided here, whoever published it
                await handle(rt, self.function, msg, d)
            except Retry as exc:
                await self._retry_or_fail(rt, m, role, msg, "internal", exc.reason, d, True, exc.delay)
            except RolledBack as exc:
                await self._start_over(rt, m, role, msg, exc, d)
            except GymError as exc:
                retry = exc.retry if exc.retry is not None else await self._retried(rt, msg, exc.kind)
                await self._retry_or_fail(rt, m, role, msg, exc.kind, exc.reason, d, retry)
            except Exception as exc:
                log.exception("%s: unexpected error handling %s", self.name, type(msg).__name__)
                retry = await self._retried(rt, msg, "internal")
                await self._retry_or_fail(rt, m, role, msg, "internal", f"{type(exc).__name__}: {exc}", d, retry)
            else:
                await m.ack()
                self.stats["processed"] += 1
                spans.settled("ack")
        except Exception:  # could not even settle the message: leave it to redelivery
            log.exception("%s: could not settle message %s", self.name, md.sequence.stream)
        finally:
            del self._beating[id(m)]
            self.stats["in_flight"] -= 1
            self.metrics.observe(self.name, role, time.time() - d.received_at, d.queued_s)
            hop.end()
            slots.give()

    async def _retried(self, rt: Runtime, msg: Msg, kind: FailureKind) -> bool:
        """The rollout's retry policy for ``kind``: the Start's options, else its session's."""
        options: Options | None = msg.options if isinstance(msg, Start) else None
        sid = sid_of(msg)
        if options is None and sid is not None:
            loaded = await rt.store.get(sid)
            options = loaded[0].options if loaded else None
        return policy.retried(options, kind, self.retried_kinds)

    async def _sweep(self) -> None:
        """Keep long handlers' messages from being redelivered while they still run: every message
        handled for ack_wait/3 gets an in-progress ack, and another each ack_wait/3 after. One task per
        worker, not one per message: creating and cancelling a task per message cost more than the
        few in-progress acks ever sent (handlers rarely run that long)."""
        period = max(0.2, self.limits.ack_wait_s / 3)
        while True:
            await asyncio.sleep(period / 4)  # so a beat is at most period * 1.25 late, well inside ack_wait
            now = time.monotonic()
            due = [m for m, last in self._beating.values() if now - last >= period]
            for m in due:
                if id(m) in self._beating:
                    self._beating[id(m)] = (m, now)
                    try:
                        await m.in_progress()
                    except Exception as exc:
                        log.debug("in_progress failed: %s", exc)

    async def _retry_or_fail(
        self,
        rt: Runtime,
        m: NatsMsg,
        role: Role,
        msg: Msg,
        kind: FailureKind,
        reason: str,
        d: Delivery,
        retry: bool,
        delay: float | None = None,
    ) -> None:
        if retry and kind in NEW_ATTEMPT_KINDS and (sid := sid_of(msg)) is not None:
            if await start_over(rt, sid, step_of(msg), reason, self.limits.max_deliver) in ("started", "moved"):
                self.stats["retried"] += 1
                spans.settled("retry", kind, reason)
                await m.ack()
                return
            reason, retry = f"{reason} (gave up after {self.limits.max_deliver} attempts)", False
        if retry and d.num_delivered < self.limits.max_deliver:
            self.stats["retried"] += 1
            spans.settled("retry", kind, reason)
            await m.nak(delay=delay if delay is not None else backoff(d.num_delivered))
            return
        if retry:
            reason = f"{reason} (gave up after {d.num_delivered} deliveries)"
            await self._dead_letter(rt, m, role, kind, reason, d, sid_of(msg))
        await fail(rt, msg, kind, reason, d)
        self.stats[f"failed:{kind}"] += 1
        spans.settled("fail", kind, reason)
        await m.term()

    async def _start_over(self, rt: Runtime, m: NatsMsg, role: Role, msg: Msg, exc: RolledBack, d: Delivery) -> None:
        """Start a rolled-back rollout over; if its session moved in the meantime (the lost step was
        redone), take the message again at once, as it may apply now."""
        outcome = await start_over(rt, exc.sid, exc.at, exc.reason, self.limits.max_deliver, exc.session)
        if outcome == "moved":
            spans.settled("retry", exc.kind, "the session moved since it was found behind")
            await m.nak()
            return
        if outcome == "started":
            self.stats["restarted:rolled_back"] += 1
            spans.settled("retry", exc.kind, exc.reason)
            await m.ack()
            return
        reason = (
            f"{exc.reason} (gave up after {self.limits.max_deliver} attempts)" if outcome == "spent" else exc.reason
        )
        await self._retry_or_fail(rt, m, role, msg, exc.kind, reason, d, False)

    async def _reject(self, rt: Runtime, m: NatsMsg, role: Role, exc: msgspec.DecodeError, d: Delivery) -> None:
        """A message that does not decode is permanent: dead-letter it and fail its rollout if it names one."""
        reason = rejection(role, m.data, exc)
        ids = lenient_ids(m.data)
        await self._dead_letter(rt, m, role, "invalid_input", reason, d, ids[0] if ids else None)
        if ids:
            await fail_by_ids(rt, ids[1:], "invalid_input", reason, d)
        else:
            log.error("%s: dropped a message naming no rollout (dead-lettered): %s", self.name, reason)
        self.stats["failed:invalid_input"] += 1
        spans.settled("fail", "invalid_input", reason)
        await m.term()

    async def _dead_letter(
        self, rt: Runtime, m: NatsMsg, role: Role, kind: FailureKind, error: str, d: Delivery, sid: str | None
    ) -> None:
        await dead_letter(
            rt.js,
            function=self.name,
            subject=m.subject,
            stream_seq=m.metadata.sequence.stream,
            data=m.data,
            headers=m.headers,
            num_delivered=d.num_delivered,
            kind=kind,
            error=error,
            sid=sid,
        )

    async def _drain(self) -> None:
        if not self._tasks:
            return
        log.info("worker %s draining %d in-flight messages", self.name, len(self._tasks))
        _, pending = await asyncio.wait(set(self._tasks), timeout=self.drain_timeout_s)
        for task in pending:  # not committed, so safe to hand back: the broker redelivers them
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


def backoff(num_delivered: int) -> float:
    """Delay before redelivery: 0.5 s doubling per delivery, capped at 30 s, with ±25% jitter."""
    return min(30.0, 0.5 * 2 ** (num_delivered - 1)) * random.uniform(0.75, 1.25)


async def _close(nc: Client) -> None:
    """Flush what is buffered (acks, naks), then close; in-flight work was drained already."""
    try:
        await nc.flush(timeout=5)
    except Exception as exc:
        log.debug("flush before close failed: %s", exc)
    await nc.close()


async def serve(worker: Worker) -> None:
    """Run a worker until SIGTERM or SIGINT, then drain and exit."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    await worker.run()
