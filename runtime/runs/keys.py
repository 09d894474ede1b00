"""A run's rollouts as a grid of (task_index, rollout_index) keys, held in about one byte each.

A run of 1,000,000 rollouts held its keys as Python sets and dicts of tuples: ~300 MB in the
gatherer before the first Start went out. The grid is the run's task indices times
``range(repeats)``; sets of its keys are bit-per-byte arrays over it, and attempts are kept only
where they are not 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

Key = tuple[int, int]
"""(task_index, rollout_index)"""


class Live(NamedTuple):
    """A rollout still in flight, as its session says."""

    step: int
    trace: dict[str, str]
    """The rollout's trace context (the session's headers): its nudge is a hop of the rollout's trace."""


class Grid:
    """Every key of a run: each task index with each rollout index below ``repeats``, in that order."""

    def __init__(self, tasks: Iterable[int], repeats: int) -> None:
        self.tasks = sorted(set(tasks))
        self.repeats = repeats
        self._row = {t: i for i, t in enumerate(self.tasks)}

    def index(self, key: Key) -> int | None:
        """The key's position in the grid, or None if it is not in it."""
        row = self._row.get(key[0])
        if row is None or not 0 <= key[1] < self.repeats:
            return None
        return row * self.repeats + key[1]

    def key(self, index: int) -> Key:
        row, rollout = divmod(index, self.repeats)
        return self.tasks[row], rollout

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and len(key) == 2 and self.index(key) is not None

    def __len__(self) -> int:
        return len(self.tasks) * self.repeats

    def __iter__(self) -> Iterator[Key]:
        for t in self.tasks:
            for k in range(self.repeats):
                yield t, k


class KeySet:
    """A set of a grid's keys, one byte per key of the grid; keys outside it are never members."""

    def __init__(self, grid: Grid, keys: Iterable[Key] = ()) -> None:
        self.grid = grid
        self._bits = bytearray(len(grid))
        self._count = 0
        for key in keys:
            self.add(key)

    def add(self, key: Key) -> None:
        i = self.grid.index(key)
        if i is None:
            raise KeyError(f"{key} is not a rollout of this run (tasks x {self.grid.repeats} repeats)")
        if not self._bits[i]:
            self._bits[i] = 1
            self._count += 1

    def discard(self, key: Key) -> None:
        i = self.grid.index(key)
        if i is not None and self._bits[i]:
            self._bits[i] = 0
            self._count -= 1

    def __contains__(self, key: object) -> bool:
        if not (isinstance(key, tuple) and len(key) == 2):
            return False
        i = self.grid.index(key)
        return i is not None and bool(self._bits[i])

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Key]:
        """The members in grid order (task, then rollout)."""
        i = self._bits.find(1)
        while i != -1:
            yield self.grid.key(i)
            i = self._bits.find(1, i + 1)


class Attempts:
    """The rollouts a command submits and the attempt of each: a `KeySet`, and the attempts that are
    not 0 (a rollout run again). Iterated in grid order, as Starts go out."""

    def __init__(self, grid: Grid) -> None:
        self.keys = KeySet(grid)
        self.again: dict[Key, int] = {}
        """The attempts above 0."""
        self.live: dict[Key, Live] = {}
        """Rollouts still in flight: their Start goes out again under their attempt to nudge them (see
        `runtime.runs.rollouts`), in their own trace, not counted as submitted."""

    def set(self, key: Key, attempt: int) -> None:
        self.keys.add(key)
        if attempt:
            self.again[key] = attempt
        else:
            self.again.pop(key, None)

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, key: object) -> bool:
        return key in self.keys

    def __getitem__(self, key: Key) -> int:
        if key not in self.keys:
            raise KeyError(key)
        return self.again.get(key, 0)

    def items(self) -> Iterator[tuple[Key, int]]:
        for key in self.keys:
            yield key, self.again.get(key, 0)
