"""One Sample per rollout, kept in columns: what a profile holds of a run of any size.

A run's profilers (the live one, and ``gymbus profile`` / ``collect`` at the end) kept a dict of
Sample structs, ~620 bytes a rollout with its key: a 1,000,000-rollout run's live profiler reached
817 MB and collect's final profile 980 MB. Here each rollout is a row of typed arrays (its attempt,
reward, timings and token counts as numbers, its failure kind, answer, environment and group as
codes into one table of strings): about 140 bytes. A Sample is built again when it is read, a task
at a time, so `profile.build` never holds the run as objects.

Rows are found by task and rollout index, as `runtime.runs.feed.DoneTable` finds its rollouts: a
session id other than the run's ``run_id.task.rollout``, or a rollout index far past those seen, is
kept in a dict instead, so a stray Result cannot make the arrays grow without bound.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator
from typing import Any

from broker.schemas import Timings, Usage, parse_session_id, session_id
from runtime.profiling.sample import NO_COMPONENTS, Sample

Where = tuple[tuple[str, str], ...]
"""Rows whose ``env`` / ``group`` equal these values (empty: every row)."""

_TEXT = ("failure_kind", "answer", "env", "group")
"""Sample fields kept as codes into the table of strings."""


def _typecode(struct: type, name: str) -> str:
    return "d" if isinstance(getattr(struct(), name), float) else "q"


_TIMINGS = tuple(Timings.__struct_fields__)
_USAGE = tuple(Usage.__struct_fields__)


class SampleTable:
    """Each rollout's latest Sample (a later attempt replaces it, a repeat or an older one is ignored:
    the rule ``gymbus collect`` applies to the results stream), in columns."""

    GROW = 1 << 16
    """Most rows one Sample may add to a task's index (a stray huge rollout index goes to the dict)."""

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id = run_id
        self._slots: dict[int, array[int]] = {}
        """task_index -> row per rollout index, -1 where there is none."""
        self._other: dict[str, int] = {}
        """Session id -> row, for the ids that are not the run's usual ones."""
        self._odd: dict[int, tuple[str, int, int]] = {}
        """Row -> (session id, task index, rollout index) of those."""
        self._attempt: array[int] = array("q")
        self._reward: array[float] = array("d")
        self._reports: bytearray = bytearray()
        self._codes: dict[str, array[int]] = {f: array("i") for f in _TEXT}
        self._texts: list[str | None] = [None, ""]
        self._code_of: dict[str | None, int] = {None: 0, "": 1}
        self._timings = {f: array(_typecode(Timings, f)) for f in _TIMINGS}
        self._usage = {f: array(_typecode(Usage, f)) for f in _USAGE}
        self._components: dict[int, dict[str, float]] = {}
        self._timing_columns = tuple(self._timings.items())
        self._usage_columns = tuple(self._usage.items())

    @classmethod
    def of(cls, samples: Iterable[Sample]) -> SampleTable:
        table = cls()
        for s in samples:
            table.add(s)
        return table

    def __len__(self) -> int:
        return len(self._attempt)

    def __contains__(self, sid: object) -> bool:
        return isinstance(sid, str) and self._row(sid) is not None

    def __iter__(self) -> Iterator[Sample]:
        """Every Sample, by task then rollout index."""
        for _, samples in self.by_task():
            yield from samples

    def add(self, s: Sample) -> bool:
        """Keep ``s`` if it is its rollout's first or a later attempt; True if the table changed."""
        if self.run_id is None:
            try:
                self.run_id = parse_session_id(s.session_id)[0]
            except ValueError:
                self.run_id = ""
        row = self._row(s.session_id, s.task_index, s.rollout_index)
        if row is not None:
            if s.attempt <= self._attempt[row]:
                return False
            self._write(row, s)
            return True
        row = len(self._attempt)
        self._append(s)
        t, k = s.task_index, s.rollout_index
        slots = self._slots.get(t)
        size = 0 if slots is None else len(slots)
        if s.session_id != session_id(self.run_id or "", t, k) or not 0 <= k < size + self.GROW:
            self._other[s.session_id] = row
            self._odd[row] = (s.session_id, t, k)
            return True
        if slots is None or k >= size:
            slots = self._slots.setdefault(t, array("q"))
            slots.extend([-1] * (k + 1 - size))
        slots[k] = row
        return True

    def _row(self, sid: str, t: int | None = None, k: int | None = None) -> int | None:
        if self._other and sid in self._other:
            return self._other[sid]
        if t is None or k is None:
            try:
                run_id, t, k = parse_session_id(sid)
            except ValueError:
                return None
            if run_id != self.run_id:
                return None
        elif sid != session_id(self.run_id or "", t, k):
            return None
        slots = self._slots.get(t)
        if slots is None or not 0 <= k < len(slots) or slots[k] < 0:
            return None
        return slots[k]

    def _append(self, s: Sample) -> None:
        self._attempt.append(0)
        self._reward.append(math.nan)
        self._reports.append(0)
        for column in (*self._codes.values(), *self._timings.values(), *self._usage.values()):
            column.append(0)
        self._write(len(self._attempt) - 1, s)

    def _write(self, row: int, s: Sample) -> None:
        self._attempt[row] = s.attempt
        self._reward[row] = math.nan if s.reward is None else s.reward
        self._reports[row] = s.reports_answer
        for f, column in self._codes.items():
            column[row] = self._code(getattr(s, f))
        for f, column in self._timings.items():
            column[row] = getattr(s.timings, f)
        for f, column in self._usage.items():
            column[row] = getattr(s.usage, f)
        if s.components:
            self._components[row] = s.components
        else:
            self._components.pop(row, None)

    def _code(self, text: str | None) -> int:
        code = self._code_of.get(text)
        if code is None:
            code = self._code_of[text] = len(self._texts)
            self._texts.append(text)
        return code

    # --- reading ---------------------------------------------------------------------------------

    def rows_by_task(self, where: Where = ()) -> Iterator[tuple[int, list[tuple[int, int]]]]:
        """(task index, its (rollout index, row) pairs in rollout order) for every task with a row
        matching ``where``, by task index."""
        wanted = [(self._codes[f], self._code_of.get(v, -1)) for f, v in where]
        odd: dict[int, list[tuple[int, int]]] = {}
        for row, (_, t, k) in self._odd.items():
            odd.setdefault(t, []).append((k, row))
        for t in sorted(self._slots.keys() | odd.keys()):
            pairs = [(k, r) for k, r in enumerate(self._slots.get(t, ())) if r >= 0]
            if t in odd:
                pairs = sorted(pairs + odd[t])
            if wanted:
                pairs = [(k, r) for k, r in pairs if all(column[r] == code for column, code in wanted)]
            if pairs:
                yield t, pairs

    def by_task(self, where: Where = ()) -> Iterator[tuple[int, list[Sample]]]:
        """`rows_by_task` with each row as its Sample."""
        for t, pairs in self.rows_by_task(where):
            yield t, [self.sample(r, t, k) for k, r in pairs]

    def scored(self, row: int) -> bool:
        return not math.isnan(self._reward[row])

    def reports_answer(self, row: int) -> bool:
        return bool(self._reports[row])

    def distinct(self, field: str, where: Where = ()) -> list[str]:
        """The values of ``env`` or ``group`` over the rows matching ``where``, sorted."""
        column = self._codes[field]
        codes = {column[r] for _, pairs in self.rows_by_task(where) for _, r in pairs}
        return sorted(self._texts[c] or "" for c in codes)

    def sample(self, row: int, task_index: int, rollout_index: int) -> Sample:
        """Row ``row`` (rollout ``rollout_index`` of task ``task_index``) as its Sample."""
        odd = self._odd.get(row)
        sid = odd[0] if odd is not None else session_id(self.run_id or "", task_index, rollout_index)
        reward = self._reward[row]
        texts, codes = self._texts, self._codes
        timings: dict[str, Any] = {f: column[row] for f, column in self._timing_columns}
        return Sample(
            session_id=sid,
            task_index=task_index,
            rollout_index=rollout_index,
            attempt=self._attempt[row],
            reward=None if reward != reward else reward,  # NaN: no reward
            failure_kind=texts[codes["failure_kind"][row]],
            answer=texts[codes["answer"][row]],
            reports_answer=bool(self._reports[row]),
            timings=Timings(**timings),
            usage=Usage(**{f: column[row] for f, column in self._usage_columns}),
            env=texts[codes["env"][row]] or "",
            group=texts[codes["group"][row]] or "",
            components=self._components.get(row, NO_COMPONENTS),
        )
