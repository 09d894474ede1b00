"""A run's Results as they are stored: replayed from the start of the results stream, then live."""

from __future__ import annotations

import asyncio
import logging
import math
from array import array
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from broker import topology
from broker.schemas import Result, parse_session_id, result_decoder, session_id

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


class DoneTable(Mapping[str, Done]):
    """Each rollout's `Done` by session id, kept in arrays per task: about 14 bytes a rollout, where a
    dict of Done structs took ~200 (a 1,000,000-rollout run's gatherer held 195 MB of them). A Done is
    built when it is read. Rollout indices far past those seen so far, and session ids that are not
    the run's usual ``run_id.task.rollout``, are kept in a plain dict instead."""

    GROW = 1 << 16
    """Most slots one Result may add to a task's arrays (a stray huge rollout index goes to the dict)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._attempt: dict[int, array[int]] = {}
        """task_index -> attempt per rollout index, -1 where there is none yet."""
        self._reward: dict[int, array[float]] = {}
        """task_index -> reward per rollout index, NaN for none."""
        self._kind: dict[int, array[int]] = {}
        self._kinds: list[str | None] = [None]
        self._reasons: dict[tuple[int, int], str] = {}
        self._other: dict[str, Done] = {}
        self._count = 0

    def attempt(self, task_index: int, rollout_index: int) -> int | None:
        """The attempt of the rollout's latest Result, or None if it has none."""
        a = self._attempt.get(task_index)
        if a is not None and 0 <= rollout_index < len(a) and a[rollout_index] >= 0:
            return a[rollout_index]
        if not self._other:  # the usual case: no formatting of a session id per look
            return None
        d = self._other.get(session_id(self.run_id, task_index, rollout_index))
        return None if d is None else d.attempt

    def attempt_of(self, sid: str, task_index: int, rollout_index: int) -> int | None:
        """`attempt` of a Result's rollout, which its session id names if it is not the usual one."""
        if sid != session_id(self.run_id, task_index, rollout_index):
            d = self._other.get(sid)
            return None if d is None else d.attempt
        return self.attempt(task_index, rollout_index)

    def rewards(self) -> Iterator[float]:
        """The reward of every rollout scored (its latest Result's)."""
        for r in self._reward.values():
            yield from (x for x in r if not math.isnan(x))
        yield from (d.reward for d in self._other.values() if d.reward is not None)

    def failures(self) -> Counter[str]:
        """How many rollouts failed (their latest Result), by kind."""
        counts: Counter[str] = Counter()
        for codes in self._kind.values():
            for code, n in Counter(codes).items():
                if kind := self._kinds[code]:
                    counts[kind] += n
        counts.update(d.failure_kind for d in self._other.values() if d.failure_kind)
        return counts

    def put(self, d: Done) -> None:
        """Keep ``d`` as its rollout's latest (the caller decides it is)."""
        t, k = d.task_index, d.rollout_index
        a = self._attempt.get(t)
        size = 0 if a is None else len(a)
        if d.session_id != session_id(self.run_id, t, k) or not 0 <= k < size + self.GROW:
            self._count += d.session_id not in self._other
            self._other[d.session_id] = d
            return
        if a is None or k >= size:
            more = k + 1 - size
            a = self._attempt.setdefault(t, array("l"))
            a.extend([-1] * more)
            self._reward.setdefault(t, array("d")).extend([math.nan] * more)
            self._kind.setdefault(t, array("B")).extend(bytes(more))
        self._count += a[k] < 0
        a[k] = d.attempt
        self._reward[t][k] = math.nan if d.reward is None else d.reward
        if d.failure_kind not in self._kinds:
            self._kinds.append(d.failure_kind)
        self._kind[t][k] = self._kinds.index(d.failure_kind)
        if d.failure_reason is None:
            self._reasons.pop((t, k), None)
        else:
            self._reasons[(t, k)] = d.failure_reason

    def _at(self, t: int, k: int) -> Done:
        reward = self._reward[t][k]
        return Done(
            session_id(self.run_id, t, k),
            t,
            k,
            self._attempt[t][k],
            None if math.isnan(reward) else reward,
            self._kinds[self._kind[t][k]],
            self._reasons.get((t, k)),
        )

    def __getitem__(self, sid: str) -> Done:
        if sid in self._other:
            return self._other[sid]
        try:
            run_id, t, k = parse_session_id(sid)
        except ValueError:
            raise KeyError(sid) from None
        if run_id != self.run_id or self.attempt(t, k) is None:
            raise KeyError(sid)
        return self._at(t, k)

    def _present(self) -> Iterator[tuple[int, int]]:
        """(task, rollout) of every Done kept in the arrays, in that order."""
        for t, a in sorted(self._attempt.items()):
            for k, attempt in enumerate(a):
                if attempt >= 0:
                    yield t, k

    def __iter__(self) -> Iterator[str]:
        for t, k in self._present():
            yield session_id(self.run_id, t, k)
        yield from self._other

    def __len__(self) -> int:
        return self._count

    def values(self) -> Iterator[Done]:  # type: ignore[override]  # an iterator, not a view: built as read
        for t, k in self._present():
            yield self._at(t, k)
        yield from self._other.values()

    def only(self, keep: Callable[[Done], bool]) -> DoneTable:
        """A table of the Dones ``keep`` accepts."""
        out = DoneTable(self.run_id)
        for d in self.values():
            if keep(d):
                out.put(d)
        return out


class ResultsFeed:
    """Every Result of a run, one per rollout (its latest attempt). Results are read, never consumed, so
    any number of gatherers can follow the same run.

    ``done`` has each rollout's `Done`; ``results`` its whole Result, unless the feed was made with
    ``keep=False`` (a gatherer that writes each Result out as it arrives holds none of them)."""

    def __init__(self, js: JetStreamContext, run_id: str, *, keep: bool = True) -> None:
        self.js = js
        self.subject = topology.result_subject(run_id)
        self.keep = keep
        self.done = DoneTable(run_id)
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
        old = self.done.attempt_of(r.session_id, r.task_index, r.rollout_index)
        latest = old is None or r.attempt > old
        if latest:
            self.done.put(Done.of(r))
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
