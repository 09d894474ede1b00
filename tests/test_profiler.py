"""The profiling consumer on a real broker: each Result counted once through kills, restarts, replicas, duplicates."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

from broker import inspect, topology
from broker.publish import publish, publish_raw
from broker.schemas import Result, Timings, Usage, result_decoder
from conftest import ROOT
from runtime.profiling import profile
from runtime.profiling.profile import RunInfo, Sample
from runtime.profiling.profiler import Profiler, Snapshot, read_snapshot
from runtime.testing import Harness

INFO = RunInfo(run_id="p1", tasks=6, repeats=4, expected=24)


def result(task: int, rollout: int, attempt: int = 0, *, reward: float | None = 1.0) -> Result:
    kind = "tool_error" if reward is None else None
    return Result(
        session_id=f"{INFO.run_id}.{task}.{rollout}",
        run_id=INFO.run_id,
        task_index=task,
        rollout_index=rollout,
        attempt=attempt,
        reward=reward,
        failure_kind=kind,
        failure_reason="boom" if kind else None,
        verifier={"extracted_answer": str(task + (reward or 0))},
        usage=Usage(input_tokens=10, output_tokens=3),
        timings=Timings(submitted_at=1000.0 + task, finished_at=1001.5 + task + rollout / 10, hops=3, model_calls=1),
    )


async def send(h: Harness, results: list[Result], tag: str) -> None:
    for r in results:
        await publish(h.js, topology.result_subject(r.run_id), r, f"{r.session_id}:{tag}")


async def reference(h: Harness) -> dict:
    """The profile of everything on the run's subject, folded directly from the stream."""
    samples: dict[str, Sample] = {}
    async for m in inspect.messages(h.js, topology.RESULTS_STREAM, topology.result_subject(INFO.run_id)):
        try:
            profile.keep(samples, Sample.of(result_decoder.decode(m.data or b"")))
        except ValueError:
            continue
    prof, _ = profile.build(INFO, samples.values(), source="offline")
    return profile.comparable(prof)


async def last_seq(h: Harness) -> int:
    return (await h.js.stream_info(topology.RESULTS_STREAM)).state.last_seq


async def snapshot_at(h: Harness, seq: int, timeout: float = 30.0) -> Snapshot:
    """Wait until the stored snapshot of the run covers the stream up to ``seq``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        snap = await read_snapshot(h.js, INFO.run_id)
        if snap is not None and snap.profile.last_seq >= seq:
            return snap
        assert loop.time() < deadline, f"no snapshot covering seq {seq}: {snap and snap.profile.last_seq}"
        await asyncio.sleep(0.05)


async def put_manifest(h: Harness) -> None:
    """The run's manifest, as ``gymbus collect`` writes it: what the profile expects of the run."""
    manifest = {"run_id": INFO.run_id, "tasks": INFO.tasks, "repeats": INFO.repeats, "expected": INFO.expected}
    kv = await h.js.key_value(topology.RUNS)
    await kv.put(topology.manifest_key(INFO.run_id), json.dumps(manifest).encode())


def start_profiler(h: Harness) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GYMBUS_ACK_WAIT_S": "2"}
    cmd = [sys.executable, "-m", "runtime", "profiler", "--nats", h.broker.url, "--interval", "0.05"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE)


async def test_a_killed_and_restarted_profiler_counts_every_rollout_once(harness: Harness) -> None:
    await put_manifest(harness)
    first = [result(t, k, reward=1.0 if (t + k) % 3 else 0.0) for t in range(3) for k in range(4)]
    await send(harness, first, "a")
    proc = start_profiler(harness)
    try:
        snap = await snapshot_at(harness, await last_seq(harness))
        assert snap.profile.present == 12 and snap.profile.source == "live"
        # more Results arrive while the profiler is being killed: some folded, some acked, some neither
        second = [result(t, k, reward=None if k == 3 else 1.0) for t in range(3, 6) for k in range(4)]
        await send(harness, second[:6], "a")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        await send(harness, second[6:], "a")
        await send(harness, first[:3], "late-duplicate")  # past the duplicate window: stored again
        await send(harness, [result(0, 0, attempt=1, reward=1.0), result(5, 3, attempt=1, reward=0.0)], "retry")
        await publish_raw(harness.js, topology.result_subject(INFO.run_id), b"not a result")
        proc = start_profiler(harness)  # a new process: its memory is empty
        snap = await snapshot_at(harness, await last_seq(harness))
    finally:
        proc.kill()
        proc.wait(10)
    p = snap.profile
    assert p.present == 24 and p.completion == 1.0  # not 12 (acked before the kill), not 27 (duplicates)
    assert p.failures == {"tool_error": 2}  # task 3 and 4's rollout 3; task 5's was retried into a reward
    assert profile.comparable(p) == await reference(harness)
    assert [t.task_index for t in snap.tasks] == list(range(6))


async def test_a_run_delivered_in_order_is_folded_from_the_messages_without_reading_the_stream(
    harness: Harness,
) -> None:
    """Each Result delivered right after the last one folded is folded as delivered: a run of a million
    rollouts made a million direct gets of what the consumer had just handed over."""
    await put_manifest(harness)
    await send(harness, [result(t, k) for t in range(6) for k in range(4)], "a")
    p = Profiler(harness.broker.url, interval_s=0.05)
    task = asyncio.create_task(p.run())
    try:
        snap = await snapshot_at(harness, await last_seq(harness))
    finally:
        p.stop()
        await asyncio.wait_for(task, 30)
    assert snap.profile.present == 24 and profile.comparable(snap.profile) == await reference(harness)
    assert p.stats["folded"] == 24 and p.stats["read"] == 0


async def test_replicas_fill_each_others_gaps_and_never_store_an_older_snapshot(harness: Harness) -> None:
    await put_manifest(harness)

    async def serve(p: Profiler) -> asyncio.Task[None]:
        task = asyncio.create_task(p.run())
        await asyncio.wait({task, asyncio.create_task(p.ready.wait())}, return_when=asyncio.FIRST_COMPLETED)
        return task

    async def stop(p: Profiler, task: asyncio.Task[None]) -> None:
        p.stop()
        await asyncio.wait_for(task, 30)

    a = Profiler(harness.broker.url, interval_s=0.05)
    task_a = await serve(a)
    await send(harness, [result(0, k) for k in range(4)], "a")
    await snapshot_at(harness, await last_seq(harness))
    await stop(a, task_a)

    b = Profiler(harness.broker.url, interval_s=0.05)  # a second replica, on its own since the start
    task_b = await serve(b)
    await send(harness, [result(1, k) for k in range(4)], "a")
    await snapshot_at(harness, await last_seq(harness))
    await stop(b, task_b)
    assert all(f"p1.0.{k}" in b.runs[INFO.run_id].samples for k in range(4))  # it rebuilt the run from the start

    # replica A comes back with its old state (up to task 0) and is handed only the next Result
    a2 = Profiler(harness.broker.url, interval_s=0.05, runs=a.runs)
    task_a2 = await serve(a2)
    await send(harness, [result(2, 0, reward=0.0)], "a")
    snap = await snapshot_at(harness, await last_seq(harness))
    await stop(a2, task_a2)
    assert snap.profile.present == 9  # A read task 1's Results, which B had been handed, from the stream
    assert profile.comparable(snap.profile) == await reference(harness)
    stored = await read_snapshot(harness.js, INFO.run_id)
    assert stored is not None and stored.profile.last_seq == await last_seq(harness)


async def test_healthz_is_ok_once_bound_and_not_while_draining(harness: Harness) -> None:
    """The container health check asks this: a compose `up --wait` waits on it."""
    import aiohttp

    p = Profiler(harness.broker.url, interval_s=0.05, http_port=0, drain_s=2.0)
    task = asyncio.create_task(p.run())
    await asyncio.wait({task, asyncio.create_task(p.ready.wait())}, return_when=asyncio.FIRST_COMPLETED)
    assert p.http_port
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{p.http_port}/healthz") as r:
            assert (r.status, await r.json()) == (200, {"status": "ok"})
        p.stop()
        async with http.get(f"http://127.0.0.1:{p.http_port}/healthz") as r:
            assert (r.status, await r.json()) == (503, {"status": "draining"})
    await asyncio.wait_for(task, 30)
