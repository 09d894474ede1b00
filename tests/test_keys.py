"""What a gatherer keeps per rollout of a large run: its key in a grid, and its latest Result's outcome."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from runtime.runs.feed import Done, DoneTable
from runtime.runs.keys import Attempts, Grid, KeySet


def test_grid_is_the_tasks_times_the_repeats_in_order() -> None:
    grid = Grid([5, 2, 9, 2], 3)  # task indices as the rows give them: unsorted, repeated
    assert list(grid) == [(t, k) for t in (2, 5, 9) for k in range(3)] and len(grid) == 9
    assert (5, 2) in grid and (5, 3) not in grid and (4, 0) not in grid and (5, -1) not in grid
    assert "5.2" not in grid and (5,) not in grid
    assert [grid.key(grid.index(k) or 0) for k in grid] == list(grid)


def test_key_set_holds_members_of_its_grid_in_grid_order() -> None:
    grid = Grid(range(3), 4)
    keys = KeySet(grid, [(2, 1), (0, 3), (2, 1)])
    assert list(keys) == [(0, 3), (2, 1)] and len(keys) == 2 and keys
    keys.discard((0, 3))
    keys.discard((0, 3))  # twice: still one member fewer, not two
    keys.discard((7, 0))  # not of the grid: nothing to discard
    assert list(keys) == [(2, 1)] and len(keys) == 1 and (0, 3) not in keys
    keys.discard((2, 1))
    assert not keys and list(keys) == []
    with pytest.raises(KeyError, match=r"\(3, 0\) is not a rollout of this run"):
        keys.add((3, 0))


def test_attempts_keep_only_the_attempts_above_zero() -> None:
    attempts = Attempts(Grid(range(2), 3))
    for key in [(1, 2), (0, 1), (0, 0)]:
        attempts.set(key, 0)
    attempts.set((0, 1), 2)
    assert list(attempts.items()) == [((0, 0), 0), ((0, 1), 2), ((1, 2), 0)]
    assert attempts.again == {(0, 1): 2} and len(attempts) == 3 and attempts[(1, 2)] == 0
    with pytest.raises(KeyError):
        attempts[(1, 0)]


def test_rollouts_take_about_a_byte_each() -> None:
    """The gatherer held a run of 1,000,008 rollouts as sets and dicts of tuples: ~300 MB before its
    first Start. The keys, the rollouts not done and their attempts now take two bytes per rollout."""
    tracemalloc.start()
    try:
        grid = Grid(range(24), 10_000)
        pending = KeySet(grid, grid)
        attempts = Attempts(grid)
        for key in grid:
            attempts.set(key, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(pending) == len(attempts) == 240_000
    assert peak < 2.5 * 240_000


def done(task: int, rollout: int, attempt: int = 0, reward: float | None = 1.0, **kw: Any) -> Done:
    kind, reason = (None, None) if reward is not None else ("timeout", "too slow")
    sid = kw.get("sid") or f"run.{task}.{rollout}"
    return Done(sid, task, rollout, attempt, reward, kw.get("kind", kind), kw.get("reason", reason))


def test_done_table_reads_back_what_it_keeps() -> None:
    table = DoneTable("run")
    for d in [done(1, 0), done(0, 2, reward=None), done(1, 0, attempt=1, reward=0.5), done(0, 0, reward=0.0)]:
        table.put(d)
    table.put(done(0, 2, attempt=1))  # retried into a reward: its failure is gone
    assert len(table) == 3 and list(table) == ["run.0.0", "run.0.2", "run.1.0"]
    assert table["run.1.0"] == done(1, 0, attempt=1, reward=0.5)
    assert table["run.0.2"] == done(0, 2, attempt=1) and table.attempt(0, 2) == 1
    assert table.attempt(0, 1) is None and table.get("run.0.1") is None and "other.0.0" not in table
    assert sorted(table.rewards()) == [0.0, 0.5, 1.0] and table.failures() == {}
    table.put(done(0, 1, reward=None))
    assert table.failures() == {"timeout": 1} and table["run.0.1"].failure_reason == "too slow"
    assert [d.session_id for d in table.only(lambda d: d.task_index == 0).values()] == ["run.0.0", "run.0.1", "run.0.2"]


def test_done_table_keeps_odd_ids_and_stray_indices_aside() -> None:
    """A session id that is not ``run.task.rollout``, or a rollout index far past those seen, is kept
    as it is instead of growing a task's arrays to it."""
    table = DoneTable("run")
    odd, far = done(0, 0, sid="custom-id"), done(0, 10**9)
    table.put(odd)
    table.put(far)
    assert len(table) == 2 and table["custom-id"] == odd and table["run.0.1000000000"] == far
    assert table.attempt_of("custom-id", 0, 0) == 0 and table.attempt(0, 0) is None
    assert table.attempt(0, 10**9) == 0 and sum(len(a) for a in table._attempt.values()) == 0


def test_done_table_takes_about_fourteen_bytes_a_rollout() -> None:
    tracemalloc.start()
    try:
        table = DoneTable("run")
        for k in range(100_000):
            table.put(done(k % 4, k // 4, reward=None if k % 10 == 0 else 1.0))
        size, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(table) == 100_000 and table.failures() == {"timeout": 10_000}
    assert size < 100_000 * 14 + 10_000 * 150  # the failed rollouts' reasons kept besides
