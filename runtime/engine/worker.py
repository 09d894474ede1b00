"""The worker: binds one function to its durable consumer(s) and runs messages through it.

It pulls in batches, runs up to ``concurrency`` messages at once, tells the broker a long
handler is still in progress, acks on success, naks with backoff on retryable errors, and ends
the rollout with a failed Result (plus a dead letter when the delivery budget is spent) on
permanent ones. It holds no state between messages (DESIGN invariant 4); SIGTERM drains it.
"""

from __future__ import annotations

import asyncio
import json
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
from nats.js import JetStreamContext
from nats.js.api import DEFAULT_PREFIX
from nats.js.errors import APIError

from broker import topology
from broker.connect import connect
from broker.schemas import (
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
from runtime.engine import handlers
from runtime.engine import retry as policy
from runtime.engine.deadletters import dead_letter, lenient_ids, sid_of
from runtime.engine.handlers import Delivery, Runtime
from runtime.engine.janitor import Janitor
from runtime.engine.metrics import HttpServer, WorkerMetrics
from runtime.errors import RETRIED_KINDS, GymError, Retry
from runtime.model.client import Endpoints, ModelClient
from runtime.sdk import Agent, Function
from runtime.telemetry import genai, spans

log = logging.getLogger("gymbus.worker")

_ROUTES: dict[Role, tuple[Callable[[bytes], Any], handlers.Handler]] = {
    "agent": (agent_decoder.decode, handlers.handle_agent),
    "tool": (tool_decoder.decode, handlers.handle_tool),
    "verify": (verify_decoder.decode, handlers.handle_verify),
}


def roles_of(fn: Function) -> list[Role]:
    return ["agent"] if isinstance(fn, Agent) else ["tool", "verify"]


class _Slots:
    """Free handler slots of one consumer. Each subject a worker serves has its own, so a long poll
    on an idle subject never holds up work waiting on another."""

    def __init__(self, n: int) -> None:
        self.free = n
        self._cond = asyncio.Condition()

    async def take(self, most: int) -> int:
        async with self._cond:
            await self._cond.wait_for(lambda: self.free > 0)
            k = min(most, self.free)
            self.free -= k
            return k

    async def give(self, k: int = 1) -> None:
        async with self._cond:
            self.free += k
            self._cond.notify_all()


class _Puller:
    """Pull requests on one durable consumer, each answered as soon as any message is available.

    Not ``PullSubscription.fetch(n)``: when another client (a second replica) has a pull request
    waiting on the same consumer while a message is pending, the server answers its ``no_wait``
    probe with 408 Requests Pending; nats-py then sends a plain (lingering) request for n messages
    and, once the first arrives, waits for the rest until the request expires. Nothing more comes
    in a closed loop whose in-flight messages that fetch is itself holding, so it sat on them for
    the whole fetch timeout (1 s): with two replicas, throughput fell fivefold and p99 rose to ~1 s.

    Here every request is a one-shot (``no_wait`` with ``expires``: wait for the first message,
    then take what is there and end), falling back to a lingering request for a single message on
    Requests Pending. Each request has its own reply subject, so a late status of an earlier one
    is never taken for the end of the current one.
    """

    def __init__(self, nc: Client, stream: str, durable: str, prefix: str = DEFAULT_PREFIX) -> None:
        self._nc = nc
        self._next = f"{prefix}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._inbox = nc.new_inbox()
        self._seq = 0
        self._queue: asyncio.Queue[NatsMsg] = asyncio.Queue()

    async def start(self) -> _Puller:
        async def put(m: NatsMsg) -> None:
            self._queue.put_nowait(m)

        await self._nc.subscribe(f"{self._inbox}.*", cb=put)
        return self

    async def fetch(self, n: int, timeout: float) -> list[NatsMsg]:
        """Up to ``n`` messages; waits at most ``timeout`` for the first, not at all for the rest."""
        msgs = self._ready(n)  # delivered to an earlier request after we stopped waiting for it
        if msgs:
            return msgs
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        status = await self._request(n, timeout, True, deadline + 0.25, msgs)
        if not msgs and status == "408" and loop.time() < deadline - 0.01:  # Requests Pending
            await self._request(1, deadline - loop.time(), False, deadline + 0.25, msgs)
        return msgs

    def _ready(self, n: int) -> list[NatsMsg]:
        msgs: list[NatsMsg] = []
        while len(msgs) < n and not self._queue.empty():
            m = self._queue.get_nowait()
            if not JetStreamContext.is_status_msg(m):
                msgs.append(m)
        return msgs

    async def _request(self, n: int, expires: float, one_shot: bool, until: float, msgs: list[NatsMsg]) -> str | None:
        """One pull request for ``n`` messages, collected into ``msgs``; returns the status that ended it."""
        self._seq += 1
        reply = f"{self._inbox}.{self._seq}"
        req: dict[str, Any] = {"batch": n, "expires": max(1_000_000, int(expires * 1e9))}
        if one_shot:
            req["no_wait"] = True
        await self._nc.publish(self._next, json.dumps(req).encode(), reply=reply)
        loop = asyncio.get_running_loop()
        want = len(msgs) + n
        while len(msgs) < want:
            try:
                m = await asyncio.wait_for(self._queue.get(), max(0.0, until - loop.time()))
            except TimeoutError:
                return None
            status = JetStreamContext.is_status_msg(m)
            if not status:
                msgs.append(m)
            elif m.subject != reply or status == "100":  # an earlier request's end, or a heartbeat
                continue
            elif status in ("404", "408"):  # no (more) messages, request expired, or Requests Pending
                return status
            elif msgs:
                return status
            else:
                raise APIError.from_msg(m)  # 409: consumer deleted, leadership change, max waiting...
        return None


@dataclass
class Worker:
    """One function's worker process (or task, in tests)."""

    function: Function
    nats_url: str
    concurrency: int = 64
    batch: int = 32
    roles: list[Role] | None = None
    model_url: str | None = None
    limits: Limits = field(default_factory=Limits.from_env)
    drain_timeout_s: float = 30.0
    fetch_timeout_s: float = 1.0
    retried_kinds: frozenset[FailureKind] = RETRIED_KINDS
    """The retry policy of rollouts whose ``Options.retry`` is None (see runtime/engine/retry.py)."""
    heartbeat: bool = True
    """Send in-progress acks every ack_wait/3 while a handler runs (off only to test what they prevent)."""
    janitor: bool = True
    """Also run a janitor (dead letters of lost messages, rollout deadlines); see runtime/engine/janitor.py."""
    http_port: int | None = None
    """Serve /metrics and /healthz on 0.0.0.0:PORT (0: any free port, written back here); None: off."""
    stats: Counter[str] = field(default_factory=Counter)
    metrics: WorkerMetrics = field(default_factory=WorkerMetrics)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _beating: dict[int, tuple[NatsMsg, float]] = field(default_factory=dict)
    """Messages being handled (by id) and the monotonic time of their last sign of life (see `_sweep`)."""
    _nc: Client | None = None

    @property
    def name(self) -> str:
        return self.function.name

    def stop(self) -> None:
        self._stopping.set()

    def health(self) -> str:
        """``ok`` once connected with its consumers bound; otherwise starting, disconnected or draining."""
        if self._stopping.is_set():
            return "draining"
        if not self.ready.is_set():
            return "starting"
        return "ok" if self._nc is not None and self._nc.is_connected else "disconnected"

    async def run(self) -> None:
        """Serve until `stop()` (or SIGTERM in `serve`), then drain."""
        http = await HttpServer.start(self, self.http_port) if self.http_port is not None else None
        try:
            await self._run()
        finally:
            if http is not None:
                await http.stop()

    async def _run(self) -> None:
        nc = self._nc = await connect(self.nats_url, name=f"gymbus-worker-{self.name}")
        client: ModelClient | None = None
        sweeper: asyncio.Task[None] | None = None
        try:
            js = nc.jetstream()
            await topology.ensure(js, self.limits)
            if isinstance(self.function, Agent):
                client = ModelClient(Endpoints(js, self.model_url))
            rt = Runtime(js, SessionStore(js), respond=genai.TracedModel(client) if client else None)
            loops = []
            for role in self.roles or roles_of(self.function):
                durable = await topology.ensure_consumer(js, role, self.name, self.limits)
                puller = await _Puller(nc, topology.WORK_STREAM, durable).start()
                loops.append(asyncio.create_task(self._loop(rt, puller, role, _Slots(self.concurrency))))
            if self.janitor:
                jan = Janitor.from_env(js, self.limits, holder=f"worker-{self.name}-{os.getpid()}-{id(self):x}")
                loops.append(asyncio.create_task(jan.run(self._stopping)))
            sweeper = asyncio.create_task(self._sweep()) if self.heartbeat else None
            self.ready.set()
            log.info(
                "worker %s serving %s",
                self.name,
                [topology.subject(r, self.name) for r in self.roles or roles_of(self.function)],
            )
            await self._stopping.wait()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._drain()
        finally:
            if sweeper is not None:
                sweeper.cancel()
            if client is not None:
                await client.close()
            await _close(nc)

    async def _loop(self, rt: Runtime, puller: _Puller, role: Role, slots: _Slots) -> None:
        decode, handle = _ROUTES[role]
        while not self._stopping.is_set():
            n = await slots.take(self.batch)
            try:
                msgs = await puller.fetch(n, timeout=self.fetch_timeout_s)
            except TimeoutError:
                msgs = []
            except Exception as exc:  # broker gone for a moment: reconnect logic lives in the client
                log.warning("fetch on %s failed: %s", topology.subject(role, self.name), exc)
                msgs = []
                await asyncio.sleep(0.5)
            if len(msgs) < n:
                await slots.give(n - len(msgs))
            for m in msgs:
                task = asyncio.create_task(self._process(rt, m, role, decode, handle, slots))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _process(
        self,
        rt: Runtime,
        m: NatsMsg,
        role: Role,
        decode: Callable[[bytes], Any],
        handle: handlers.Handler,
        slots: _Slots,
    ) -> None:
        md = m.metadata
        d = Delivery(
            published_at=md.timestamp.timestamp(),
            num_delivered=md.num_delivered,
            headers={k: v for k, v in (m.headers or {}).items() if not k.startswith("Nats-")},
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
            hop.message(type(msg).__name__.lower(), sid_of(msg))
            try:
                await handle(rt, self.function, msg, d)
            except Retry as exc:
                await self._retry_or_fail(rt, m, role, msg, "internal", exc.reason, d, True, exc.delay)
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
            await slots.give()

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
        if retry and d.num_delivered < self.limits.max_deliver:
            self.stats["retried"] += 1
            spans.settled("retry", kind, reason)
            await m.nak(delay=delay if delay is not None else backoff(d.num_delivered))
            return
        if retry:
            reason = f"{reason} (gave up after {d.num_delivered} deliveries)"
            await self._dead_letter(rt, m, role, kind, reason, d, sid_of(msg))
        await handlers.fail(rt, msg, kind, reason, d)
        self.stats[f"failed:{kind}"] += 1
        spans.settled("fail", kind, reason)
        await m.term()

    async def _reject(self, rt: Runtime, m: NatsMsg, role: Role, exc: msgspec.DecodeError, d: Delivery) -> None:
        """A message that does not decode is permanent: dead-letter it and fail its rollout if it names one."""
        reason = f"invalid {role} message: {exc}"
        ids = lenient_ids(m.data)
        await self._dead_letter(rt, m, role, "invalid_input", reason, d, ids[0] if ids else None)
        if ids:
            await handlers.fail_by_ids(rt, ids[1:], "invalid_input", reason, d)
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
