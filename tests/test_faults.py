"""The fault suite at CI size (scripts/faults.py runs it at full size and prints the figures).

Each scenario ends with the auditor reading every stream: every rollout exactly one Result, none
unexpected, the dead letters exactly the expected ones, no work left behind.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from runtime.testing import Harness
from tests import fault_suite as fs


def check(f: fs.Figures) -> None:
    print(f)
    assert f.ok, (f.problems, f)
    assert f.lost == 0 and f.duplicates == 0 and f.unexpected == 0


@pytest.mark.slow  # ~45 s; tests/test_crash.py SIGKILLs workers mid-run in the default suite
async def test_workers_sigkilled_at_random(tmp_path: Path) -> None:
    """R1 + duplicate Starts: results = N, none twice, rewards equal to the fault-free run."""
    async with Harness(tmp_path / "broker", limits=fs.CHAOS_LIMITS) as h:
        f = await fs.chaos(h, 60, tmp_path / "logs", kill_every=1.0, latency_ms=500, concurrency=4)
    check(f)
    assert f.results == 60 and f.failures == {} and f.notes["kills"] >= 3


async def test_broker_killed_and_restarted(tmp_path: Path) -> None:
    """R2: kill -9 the broker twice mid-run; the run completes from the same store."""
    async with Harness(tmp_path / "broker", limits=fs.LIMITS) as h:
        f = await fs.broker_restart(h, 60, tmp_path / "logs")
    check(f)
    assert f.results == 60 and f.failures == {}


async def test_model_endpoint_faults(tmp_path: Path) -> None:
    """20% 500s and 5% hangs: the run completes; failures only model_error or timeout."""
    async with Harness(tmp_path / "broker", limits=fs.LIMITS) as h:
        f = await fs.model_faults(h, 40, step_timeout_s=2.0)
    check(f)
    assert f.notes["calls_500"] > 0 and f.notes["calls_hang"] > 0


async def test_poison_and_crash_are_dead_lettered_then_replayed(tmp_path: Path) -> None:
    """A poison verifier and a worker-killing tool end as verifier_error and worker_lost dead letters;
    replay after the fix completes the poisoned rollout."""
    async with Harness(tmp_path / "broker", limits=fs.POISON_LIMITS) as h:
        f = await fs.poison(h, 12, tmp_path / "logs")
    check(f)
    assert f.failures == {"verifier_error": 1, "worker_lost": 1} and f.notes["replayed_reward"] == 1.0


async def test_broker_paused_past_ack_wait(tmp_path: Path) -> None:
    """R3: SIGSTOP the broker for 2.5 x ack wait; nothing lost, no worker exits."""
    async with Harness(tmp_path / "broker", limits=fs.LIMITS) as h:
        f = await fs.pause(h, 40, tmp_path / "logs")
    check(f)


async def test_network_blackhole_reset_delay(tmp_path: Path) -> None:
    """R4: blackhole 5 s, reset every connection, then 50 ms per chunk; clients reconnect, nothing lost."""
    async with Harness(tmp_path / "broker", limits=fs.NETWORK_LIMITS) as h:
        f = await fs.network(h, 40)
    check(f)


@pytest.mark.parametrize("heartbeat", [True, False], ids=["in-progress-acks", "no-in-progress-acks"])
async def test_handler_slower_than_ack_wait(tmp_path: Path, heartbeat: bool, caplog: pytest.LogCaptureFixture) -> None:
    """R5/R6: a tool 3x slower than the ack wait. With in-progress acks the worker sends them while it
    runs; without them it is redelivered (to a second replica, racing the first: the stale-ack race),
    and the loser's CAS conflict makes it step aside, so there is still exactly one Result. That in-progress
    acks prevent every redelivery depends on the machine keeping up: a figure of `scripts/faults.py
    --only slow`, not an assertion here."""
    caplog.set_level(logging.DEBUG, logger="gymbus.runtime")
    async with Harness(tmp_path / "broker", limits=fs.SLOW_LIMITS) as h:
        f = await fs.slow_handler(h, 3, heartbeat=heartbeat, replicas=2)
    check(f)
    assert f.failures == {}
    if heartbeat:
        assert f.notes["in_progress_acks"] >= 3, f.notes  # at least one per slow tool call
    else:
        assert f.notes["in_progress_acks"] == 0
        assert f.notes["redelivered"] > 0
        assert "applied by another worker" in caplog.text


async def test_backlog_respects_max_ack_pending(tmp_path: Path) -> None:
    """R13 (scaled): 1,500 rollouts queued at once; unacked never exceeds max_ack_pending."""
    async with Harness(tmp_path / "broker", limits=fs.BACKLOG_LIMITS) as h:
        f = await fs.backlog(h, 1500, tmp_path / "logs")
    check(f)
    assert f.notes["slow_consumer_logs"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("n", [1000])
async def test_workers_sigkilled_at_random_full_size(tmp_path: Path, n: int) -> None:
    async with Harness(tmp_path / "broker", limits=fs.CHAOS_LIMITS) as h:
        f = await fs.chaos(h, n, tmp_path / "logs", replicas=3)
    check(f)
    assert f.results == n
