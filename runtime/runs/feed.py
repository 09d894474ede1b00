"""A run's Results as they are stored: replayed from the start of the results stream, then live."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import msgspec
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from broker import topology
from broker.schemas import Result, result_decoder

log = logging.getLogger("gymbus.collect")

CATCH_UP_S = 60.0
"""How long reading a run's stored Results may take before the broker counts as unresponsive."""


class Done(msgspec.Struct, frozen=True, gc=False):
    """What a gatherer keeps of a rollout's latest Result: enough to count the run and resume it, a
    few dozen bytes where the Result (its conversation) is kilobytes."""

    session_id: str
    task_index: int
    rollout_index: int
    attempt: int
    reward: float | None
    failure_kind: str | None
    failure_reason: str | None

    @classmethod
    def of(cls, r: Result) -> Done:
        return cls(r.session_id, r.task_index, r.rollout_index, r.attempt, r.reward, r.failure_kind, r.failure_reason)


class ResultsFeed:
    """Every Result of a run, one per rollout (its latest attempt). Results are read, never consumed, so
    any number of gatherers can follow the same run.

    ``done`` has each rollout's `Done`; ``results`` its whole Result, unless the feed was made with
    ``keep=False`` (a gatherer that writes each Result out as it arrives holds none of them)."""

    def __init__(self, js: JetStreamContext, run_id: str, *, keep: bool = True) -> None:
        self.js = js
        self.subject = topology.result_subject(run_id)
        self.keep = keep
        self.done: dict[str, Done] = {}
        self.results: dict[str, Result] = {}
        self.caught_up = asyncio.Event()
        self.changed = asyncio.Event()
        self.on_result: Callable[[Result, bool, bool], None] | None = None
        """Called with each Result read, whether its rollout was not done before, and whether it is now
        the rollout's latest (a new rollout, or a later attempt)."""
        self._expected_backlog = 0
        self._seen = 0

    async def start(self) -> None:
        info = await self.js.stream_info(topology.RESULTS_STREAM, subjects_filter=self.subject)
        self._expected_backlog = (info.state.subjects or {}).get(self.subject, 0)
        if self._expected_backlog == 0:
            self.caught_up.set()
        self._sub = await self.js.subscribe(
            self.subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL, cb=self._on_msg
        )

    async def catch_up(self) -> None:
        """Wait until the Results stored before `start` have been read."""
        async with asyncio.timeout(CATCH_UP_S):  # not wait_for: on 3.11 it can swallow a cancel (Ctrl-C)
            await self.caught_up.wait()

    async def settle(self) -> None:
        """Wait until every Result stored by now has been read (bounded like `catch_up`)."""
        info = await self.js.stream_info(topology.RESULTS_STREAM, subjects_filter=self.subject)
        stored = (info.state.subjects or {}).get(self.subject, 0)
        async with asyncio.timeout(CATCH_UP_S):
            while self._seen < stored:
                self.changed.clear()
                await self.changed.wait()

    async def _on_msg(self, m: Any) -> None:
        self._seen += 1
        try:
            r = result_decoder.decode(m.data)
        except msgspec.DecodeError as exc:
            log.error("undecodable message on %s: %s", self.subject, exc)
        else:
            new, latest = self.add(r)
            if self.on_result:
                self.on_result(r, new, latest)
        if not self.caught_up.is_set() and (self._seen >= self._expected_backlog or m.metadata.num_pending == 0):
            self.caught_up.set()
        self.changed.set()

    def add(self, r: Result) -> tuple[bool, bool]:
        """Keep one Result per rollout, its latest attempt. Whether the rollout was not done before, and
        whether ``r`` is now its latest."""
        old = self.done.get(r.session_id)
        latest = old is None or r.attempt > old.attempt
        if latest:
            self.done[r.session_id] = Done.of(r)
            if self.keep:
                self.results[r.session_id] = r
        return old is None, latest

    async def stop(self) -> None:
        await self._sub.unsubscribe()


async def stored_results(js: JetStreamContext, run_id: str) -> list[Result]:
    """The run's Results stored so far (replayed, not waited for)."""
    feed = ResultsFeed(js, run_id)
    await feed.start()
    try:
        await feed.catch_up()
    finally:
        await feed.stop()
    return list(feed.results.values())
