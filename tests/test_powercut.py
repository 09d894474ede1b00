"""Power cuts under a run (CI size; scripts/powercut.py runs many and prints the figures).

A `gymbus collect` run with its run folder and the embedded broker's store on a lazy mount
(tests/lazyfs: data reaches the disk only when fsynced) loses power at random moments: every
unsynced write is dropped and every process SIGKILLed; then the same command resumes it. See
tests/powercut.py for the checks.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.lazyfs import unavailable
from tests.powercut import PowerCuts, summary

pytestmark = [
    pytest.mark.powercut,
    pytest.mark.skipif(unavailable() is not None, reason=f"no lazy mount here: {unavailable()}"),
]


def test_sync_always_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """The shipped policy: every Result shown before a cut is still there after it, unchanged, and
    every rollout ends with its reward (none failed)."""
    with PowerCuts(tmp_path, sync="always", repeats=4) as pc:
        t = pc.trial("always", random.Random(1), cuts=2)  # each cut some Results into the run
    print(summary([t]))
    assert t.ok, t.problems
    assert t.cuts, "no cut landed while the run was going"
    assert sum(t.outcomes.values()) == t.rollouts and set(t.outcomes) == {"reward"}
    assert t.shown_lost == 0 and t.shown_changed == 0
    assert not any(c.unloadable for c in t.cuts), "a stream or consumer definition was lost"


def test_sync_interval_ends_every_rollout_once(tmp_path: Path) -> None:
    """fsync every 20 ms: acknowledged writes of the last interval may be lost, yet every rollout
    still ends exactly once (a reward or a typed failure) and the run folder agrees with the stream."""
    with PowerCuts(tmp_path, sync="20ms", repeats=4) as pc:
        t = pc.trial("interval", random.Random(2), cuts=2)
    print(summary([t]))
    assert t.ok, t.problems
    assert t.cuts, "no cut landed while the run was going"
    assert sum(t.outcomes.values()) == t.rollouts
    # internal: a session lost whole while the message after it survived without carrying it (a
    # re-emit, or a session over 64 KiB): "missing from the sessions bucket"; every other survivor
    # carries its session and starts the rollout over. timeout: a rollout past rollout_timeout_s
    # across the cuts and restarts
    assert set(t.outcomes) <= {"reward", "internal", "timeout"}
