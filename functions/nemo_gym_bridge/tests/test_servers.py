"""nemo_gym_bridge against real NeMo Gym resources servers, installed from the nemo-gym package.

mcqa (stateless) and example_session_state_mgmt (a counter kept in the server's memory per session)
run unchanged, each as its own process in NeMo Gym's own Python 3.13 environment
(``GYMBUS_NEMO_GYM_PYTHON``). Instances are killed mid-rollout: the rollouts pinned to the dead one
end once, as ``env_lost`` (or, when the run retries ``env_lost``, as a new attempt on a new
instance), the others with their reward.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.schemas import session_id
from broker.topology import Limits
from functions.nemo_gym_bridge import servers
from runtime.checking import check
from runtime.instances import Child
from runtime.testing import Harness, collect_rows

pytestmark = pytest.mark.bridges
EXAMPLES = Path(__file__).resolve().parent.parent / "data" / "example.jsonl"
ROWS = [json.loads(line) for line in EXAMPLES.read_text().splitlines()]
COUNTER_ROWS = [r for r in ROWS if "expected_count" in r]
RETRY_LOST = ["tool_error", "verifier_error", "internal", "env_lost"]


def _nemo_python() -> str:
    python = os.environ.get("GYMBUS_NEMO_GYM_PYTHON", "")
    if not python:
        pytest.skip("GYMBUS_NEMO_GYM_PYTHON is not set: a Python 3.13 with nemo-gym 0.7.0 (README: NeMo Gym)")
    probe = subprocess.run([python, "-c", "import nemo_gym, resources_servers"], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"{python} cannot import nemo-gym: {probe.stderr.strip()[-200:]}")
    return python


@pytest.fixture
def nemo_servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A servers file: mcqa with one instance, the counter with two, started by the bridge."""
    python = _nemo_python()
    path = tmp_path / "servers.yaml"
    path.write_text(
        f"python: {python}\nlog_dir: {tmp_path / 'nemo-logs'}\n"
        "servers:\n  mcqa: {instances: 1}\n  example_session_state_mgmt: {instances: 2}\n"
    )
    monkeypatch.setenv("GYMBUS_NEMO_GYM_SERVERS", str(path))
    monkeypatch.setenv("GYMBUS_NEMO_GYM_PYTHON", python)
    return path


@pytest.fixture
async def harness(nemo_servers: Path) -> AsyncIterator[Harness]:
    async with Harness(limits=Limits(ack_wait_s=10, max_deliver=3)) as h:

        async def stop_instances() -> None:
            servers.close()

        h.cleanups.append(stop_instances)
        await h.simulate(EXAMPLES, env="nemo_gym_bridge", accuracy=1.0, latency_ms=300)
        await h.worker("simple_agent")
        await h.worker("nemo_gym_bridge")
        yield h


async def test_check_passes_both_ways(nemo_servers: Path) -> None:
    try:
        report = await check("nemo_gym_bridge")
    finally:
        servers.close()
    assert report.ok, [t.problems for t in report.tasks]
    assert {report.right(i).verifier["resources_server"] for i in range(8)} == {"mcqa", "example_session_state_mgmt"}
    assert report.right(4).timings.tool_calls == 2  # the counter's calls reached its server


async def test_nemo_gym_rows_through_collect(nemo_servers: Path, tmp_path: Path) -> None:
    summary, rows = await collect_rows(tmp_path / "run", ROWS, env="nemo_gym_bridge", repeats=3)
    assert [r["reward"] for r in rows] == [1.0] * 24, [r.get("failure_reason") for r in rows]
    assert Counter(r["verifier"]["resources_server"] for r in rows) == {"mcqa": 12, "example_session_state_mgmt": 12}
    assert json.loads((summary.run_dir / "profile.json").read_text())["pass_at_k"][0]["value"] == 1.0


async def _pinned(h: Harness, sids: list[str], timeout_s: float = 120.0) -> dict[str, dict[str, Any]]:
    """Every rollout's pin, once all are seeded (the instances start on the first seed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sessions = {sid: await h.session(sid) for sid in sids}
        pins = {sid: s.env_state.get("nemo_gym") for sid, s in sessions.items() if s is not None}
        if len(pins) == len(sids) and all(pins.values()):
            return {sid: pin for sid, pin in pins.items() if pin}
        await asyncio.sleep(0.05)
    raise AssertionError(f"not every rollout was pinned within {timeout_s:g} s: {await h.backlog()}")


async def _kill_one_counter_instance(h: Harness, run_id: str, **options: Any) -> tuple[set[str], list[Any]]:
    """Submit 12 counter rollouts, kill one of the two instances once all are pinned; the rollouts
    pinned to it that had not ended, and every Result."""
    sids = []
    for k, row in enumerate(COUNTER_ROWS * 3):
        await h.submit(h.start(row, run_id=run_id, task_index=k, seed=True, **options))
        sids.append(session_id(run_id, k, 0))
    pins = await _pinned(h, sids)
    victim: Child = servers.pools()["example_session_state_mgmt"].children[0]
    victim.proc.kill()
    victim.proc.wait()
    open_ones = {sid for sid in sids if (s := await h.session(sid)) is not None and s.phase != "done"}
    lost = {sid for sid, pin in pins.items() if pin["name"] == victim.name and sid in open_ones}
    assert 0 < len(lost) < len(sids), "both instances should have rollouts pinned to them"
    return lost, await h.final_results(run_id, timeout=120)


async def test_an_instance_killed_mid_rollout_ends_its_rollouts_as_env_lost(harness: Harness) -> None:
    lost, results = await _kill_one_counter_instance(harness, "kill")
    assert Counter(r.session_id for r in results) == {r.session_id: 1 for r in results}  # each ended once
    assert len(results) == 12
    for r in results:
        if r.session_id in lost:
            assert (r.failure_kind, r.reward) == ("env_lost", None), r
            assert "example_session_state_mgmt" in (r.failure_reason or "")
        else:
            assert r.reward == 1.0, r


async def test_a_run_retrying_env_lost_starts_those_rollouts_over_on_a_new_instance(harness: Harness) -> None:
    lost, results = await _kill_one_counter_instance(harness, "retried", retry=RETRY_LOST)
    assert len(results) == 12 and len({r.session_id for r in results}) == 12  # the lost attempts sent no Result
    assert all(r.reward == 1.0 for r in results), [r.failure_reason for r in results if r.failed]
    assert {r.session_id for r in results if r.attempt == 1} == lost
    assert len(servers.pools()["example_session_state_mgmt"].children) == 2  # the dead one was replaced
