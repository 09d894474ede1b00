"""A run's rollout keys as a grid: membership, order and size, without a tuple per rollout."""

from __future__ import annotations

import tracemalloc

import pytest

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
