"""The closed loop: keep C rollouts in flight, one new Start for every Result, within the bounds.

Results are read from a core subscription on ``gym.result.<run_id>`` as they are published (the
results stream is checked afterwards: every submitted rollout must have its Result stored there).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg

from broker import inspect, topology
from broker.publish import publish
from broker.schemas import Result, result_decoder, session_id
from runtime.bench.workload import Starts


@dataclass
class Rollout:
    """One rollout as the driver saw it (times from ``time.perf_counter``)."""

    submitted: float
    received: float | None = None
    result: Result | None = None

    @property
    def e2e_s(self) -> float:
        assert self.received is not None
        return self.received - self.submitted


@dataclass
class Outcome:
    """What a closed-loop run observed; the measured window is [window_start, window_end]."""

    rollouts: dict[str, Rollout] = field(default_factory=dict)
    window_start: float = 0.0
    window_end: float = 0.0
    stored: int = 0
    """Distinct Results in the results stream for the run (must equal the rollouts submitted)."""
    hit_time_bound: bool = False

    @property
    def completed(self) -> list[Rollout]:
        return [r for r in self.rollouts.values() if r.result is not None]

    def in_window(self) -> list[Rollout]:
        """Rollouts that finished inside the measured window."""
        return [
            r for r in self.completed if r.received is not None and self.window_start < r.received <= self.window_end
        ]


Mark = Callable[[], None]


class ClosedLoop:
    """Drives one run: ``run_id``'s Starts on ``gym.agent.simple_agent``, C at a time."""

    def __init__(self, nc: Client, starts: Starts, concurrency: int) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.starts = starts
        self.concurrency = concurrency
        self.out = Outcome()
        self._slots = asyncio.Semaphore(concurrency)
        self._done = asyncio.Event()
        self._want = 0
        self._received = 0
        self._warm_at = 0
        self._on_warm: Mark | None = None

    async def run(self, n: int, seconds: float, drain_s: float, on_warm: Mark, on_stop: Mark) -> Outcome:
        """Submit up to ``n`` rollouts, for ``seconds`` past the warm-up; wait up to ``drain_s`` for the rest.

        The window opens when the first C Results are in (the start-up burst is over) and closes when
        submission stops; ``on_warm`` and ``on_stop`` are called at those two moments. If it never
        opens (too few rollouts), the whole run is the window."""
        subject = topology.result_subject(self.starts.run_id)
        sub = await self.nc.subscribe(subject, cb=self._on_result, pending_msgs_limit=-1, pending_bytes_limit=-1)
        self._warm_at, self._on_warm = min(self.concurrency, max(1, n // 4)), on_warm
        try:
            await self._submit(n, seconds)
            self.out.window_end = time.perf_counter()
            on_stop()
            try:
                await asyncio.wait_for(self._done.wait(), timeout=drain_s)
            except TimeoutError:
                pass
        finally:
            await sub.unsubscribe()
        if not 0.0 < self.out.window_start < self.out.window_end:
            self.out.window_start = min(r.submitted for r in self.out.rollouts.values())
            self.out.window_end = max((r.received or 0.0) for r in self.out.rollouts.values())
        self.out.stored = await self._stored(subject)
        return self.out

    async def _stored(self, subject: str, settle_s: float = 10.0) -> int:
        """Results the stream holds; it may store a Result a moment after subscribers saw it, so wait a little."""
        deadline = time.perf_counter() + settle_s
        while True:
            stored = await inspect.count(self.js, topology.RESULTS_STREAM, subject)
            if stored >= self._want or time.perf_counter() > deadline:
                return stored
            await asyncio.sleep(0.1)

    async def _submit(self, n: int, seconds: float) -> None:
        t0 = time.perf_counter()
        pending: set[asyncio.Task[None]] = set()
        for i in range(n):
            await self._slots.acquire()
            if self._over(t0, seconds):
                self.out.hit_time_bound = True
                self._slots.release()
                break
            self._want += 1
            task = asyncio.create_task(self._start(i))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.gather(*pending)
        if self._received >= self._want:
            self._done.set()

    def _over(self, t0: float, seconds: float) -> bool:
        """``seconds`` past the warm-up, or three times that since the start if it never warmed up."""
        now, warm = time.perf_counter(), self.out.window_start
        return now - warm > seconds if warm else now - t0 > 3 * seconds

    async def _start(self, i: int) -> None:
        start = self.starts(i)
        sid = session_id(start.run_id, start.task_index, start.rollout_index)
        self.out.rollouts[sid] = Rollout(submitted=time.perf_counter())
        await publish(self.js, topology.agent_subject(start.agent), start, f"{sid}:start:{start.attempt}")

    async def _on_result(self, m: NatsMsg) -> None:
        now = time.perf_counter()
        r = result_decoder.decode(m.data)
        rollout = self.out.rollouts.get(r.session_id)
        if rollout is None or rollout.result is not None:  # not ours, or a duplicate publish
            return
        rollout.received, rollout.result = now, r
        self._received += 1
        if self._received == self._warm_at and self._on_warm is not None:
            self.out.window_start = now
            self._on_warm()
        self._slots.release()
        if self._received >= self._want and self.out.window_end:
            self._done.set()
