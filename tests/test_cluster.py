"""A 3-node NATS cluster, as deploy/k8s runs one: streams and buckets replicated, rollouts served,
and nothing lost when the node leading the work stream is killed or loses power mid-run.

Three real nats-server processes with routes between them, on loopback. The settings are the ones the
Kubernetes example gives every pod (GYMBUS_STREAM_REPLICAS from its ConfigMap, ``sync_interval:
always`` from the NATS chart's values). A node's power cut puts its store on a lazy mount
(tests/lazyfs) that drops every write it had not fsynced.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import subprocess
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import nats
import pytest
import yaml

from broker import topology
from broker.connect import connect
from broker.server import binary
from broker.sessions import SessionStore
from conftest import MATH_TASKS
from runtime.bench.micro import tool_session
from runtime.engine import audit
from runtime.testing import Harness, task_rows
from tests import fault_suite as fs
from tests.compose_local import free_port
from tests.compose_spec import ROOT
from tests.lazyfs import LazyMount, unavailable

CONFIGMAP = yaml.safe_load((ROOT / "deploy" / "k8s" / "gymbus" / "10-config.yaml").read_text())["data"]
REPLICAS = int(CONFIGMAP["GYMBUS_STREAM_REPLICAS"])


def node_config(i: int, store: Path, client: int, routes: list[int]) -> str:
    return "\n".join(
        [
            f"server_name: n{i}",
            f"listen: 127.0.0.1:{client}",
            # deploy/k8s/nats/values.yaml: every node fsyncs every write before it acknowledges it
            f"jetstream {{ store_dir: {json.dumps(str(store / f'n{i}'))}, sync_interval: always }}",
            f"cluster {{ name: gymbus, listen: 127.0.0.1:{routes[i]}, routes: [",
            *[f"  nats-route://127.0.0.1:{r}" for r in routes],
            "] }",
        ]
    )


class Cluster:
    """Three nats-server processes routed to each other; any one can be SIGKILLed and started again.
    With ``lazy``, each node's store is on a lazy mount of its own, so a node can lose power."""

    def __init__(self, store: Path, lazy: bool = False) -> None:
        self.store = store
        self.clients = [free_port() for _ in range(REPLICAS)]
        self.routes = [free_port() for _ in range(REPLICAS)]
        self.urls = [f"nats://127.0.0.1:{port}" for port in self.clients]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * REPLICAS
        self.mounts = [LazyMount(store / f"disk-n{i}", store / f"n{i}") for i in range(REPLICAS)] if lazy else []

    def start(self, i: int) -> None:
        if self.mounts and not self.mounts[i].mounted():
            self.mounts[i].start()
        conf = self.store / f"n{i}.conf"
        conf.write_text(node_config(i, self.store, self.clients[i], self.routes))
        with open(self.store / f"n{i}.log", "ab") as log:
            self.procs[i] = subprocess.Popen([binary(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None:
            proc.kill()
            proc.wait()
        self.procs[i] = None

    def power_cut(self, i: int) -> None:
        """Node ``i``'s machine loses power: the node stops dead, its unsynced writes are gone."""
        proc = self.procs[i]
        assert proc is not None and self.mounts
        proc.send_signal(signal.SIGSTOP)
        self.mounts[i].cut()
        self.kill(i)

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None:
                proc.terminate()
        for proc in self.procs:
            if proc is not None:
                proc.wait(10)
        for mount in self.mounts:
            mount.close()


@pytest.fixture
async def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, lazy=getattr(request, "param", False))
    for i in range(REPLICAS):
        c.start(i)
    try:
        await _meta_leader(c.urls[0])
        yield c
    finally:
        c.stop()


async def _meta_leader(url: str, timeout: float = 30.0) -> None:
    """Wait until the cluster has elected its JetStream meta leader (it answers account info)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            nc = await nats.connect(url, connect_timeout=1, max_reconnect_attempts=0)
            try:
                await nc.jetstream().account_info()
                return
            finally:
                await nc.close()
        except Exception:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_replicated_topology_serves_rollouts(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    assert REPLICAS == 3
    monkeypatch.setenv("GYMBUS_STREAM_REPLICAS", CONFIGMAP["GYMBUS_STREAM_REPLICAS"])
    limits = topology.Limits.from_env()
    harness = Harness(limits=limits)  # its own server is never started: the cluster stands in
    harness.broker.url = cluster.urls[0]  # workers connect to one node...
    harness.nc = await nats.connect(cluster.urls[1])  # ...the client to another
    try:
        await topology.ensure(harness.js, limits)
        for config in topology.streams():
            info = await harness.js.stream_info(config.name or "")
            assert info.config.num_replicas == 3 and len(info.cluster.replicas or []) == 2, config.name  # type: ignore[union-attr]
        await harness.simulate(MATH_TASKS, accuracy=1.0)
        await harness.worker("simple_agent", limits=limits)
        await harness.worker("math", limits=limits)
        rows = task_rows(MATH_TASKS)[:4]
        for i, row in enumerate(rows):
            await harness.submit(harness.start(row, run_id="cluster", task_index=i))
        results = await harness.results("cluster", 4)
        assert sorted(r.task_index for r in results) == [0, 1, 2, 3]
        assert all(r.reward == 1.0 for r in results)
    finally:
        await harness.__aexit__(None, None, None)  # workers, client, simulated policy


async def test_a_session_read_is_the_write_just_acknowledged(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any replica of a replicated bucket answers a direct get, and a follower that has not applied the
    latest write answers with the value before it. A worker that read its session that way once took a
    tool call's message for one from the future and dropped it: the rollout never ended. The session
    store reads from the stream's leader (and the engine's fast replica read asks the leader again
    before it acts on a session behind its message), so each read returns the write just acknowledged."""
    monkeypatch.setenv("GYMBUS_STREAM_REPLICAS", CONFIGMAP["GYMBUS_STREAM_REPLICAS"])
    nc = await connect(cluster.urls[0], name="gymbus-test")
    try:
        js = nc.jetstream()
        await topology.ensure(js, topology.Limits.from_env())
        store, s = SessionStore(js), tool_session()
        rev, behind, step = 0, 0, 0
        # until replicas have answered behind a few times (the followers serve direct gets once they
        # are current; a few in a hundred reads are then behind on two cores)
        while behind < 5:
            step += 1
            assert step <= 5000, f"direct gets were behind only {behind} times in 5000 writes: nothing shown"
            s.step = step
            rev = await store.update(s, last=rev)
            loaded, replica = await asyncio.gather(
                store.get(s.session_id), store.get(s.session_id, any_replica=True)
            )
            assert loaded is not None and (loaded[1], loaded[0].step) == (rev, step)
            behind += replica is None or replica[1] < rev
        print(f"direct gets behind the write just acknowledged: {behind} of {step}")
    finally:
        await nc.close()


@pytest.mark.parametrize("restart", [True, False], ids=["node-restarted", "node-lost"])
async def test_a_node_killed_mid_run_loses_nothing(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, restart: bool
) -> None:
    """kill -9 the node leading the work stream with rollouts in flight (then start it again, or
    not): the other two keep a quorum of every R3 stream, clients move to them, and every rollout
    still ends exactly once with its reward."""
    await _fault_mid_run(cluster, monkeypatch, tmp_path, cluster.kill, restart=restart)


@pytest.mark.skipif(unavailable() is not None, reason=f"no lazy mount here: {unavailable()}")
@pytest.mark.parametrize("cluster", [True], ids=["lazy-stores"], indirect=True)
async def test_a_node_losing_power_mid_run_loses_nothing(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The work stream's leader loses power (its unsynced writes are dropped) and comes back on what
    its disk kept: every rollout still ends exactly once with its reward, and the node catches up."""
    await _fault_mid_run(cluster, monkeypatch, tmp_path, cluster.power_cut, restart=True, n=60)


async def _fault_mid_run(
    cluster: Cluster,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    fault: Callable[[int], None],
    *,
    restart: bool,
    n: int = 120,
) -> None:
    monkeypatch.setenv("GYMBUS_STREAM_REPLICAS", CONFIGMAP["GYMBUS_STREAM_REPLICAS"])
    limits = dataclasses.replace(topology.Limits.from_env(), ack_wait_s=2.0, max_deliver=20)
    h = Harness(limits=limits)
    h.broker.url = cluster.urls[0]
    h.nc = await connect(cluster.urls[1], name="gymbus-test")
    try:
        await topology.ensure(h.js, limits)
        await h.simulate(MATH_TASKS, accuracy=0.6, latency_ms=50)
        fleet = fs.Fleet(cluster.urls[0], {"simple_agent": 1, "math": 1}, tmp_path / "logs", fs.worker_env(limits))
        fleet.start()
        batch = fs.starts("nodefault", n)
        try:
            await fs.submit(h, batch)
            await fs.wait_results(h, "nodefault", n // 3, timeout=120)
            leader = (await h.js.stream_info(topology.WORK_STREAM)).cluster.leader  # type: ignore[union-attr]
            victim = int(str(leader).removeprefix("n"))
            fault(victim)
            if restart:
                await asyncio.sleep(2.0)
                cluster.start(victim)
            got = await fs.wait_results(h, "nodefault", n, timeout=180)
            a = await _audit(h, "nodefault", fs.sids(batch))
        finally:
            fleet.stop()
        print(f"{fault.__name__} n{victim} (leader of {topology.WORK_STREAM}), restarted={restart}: {got}/{n} results")
        assert a.ok, a.problems()
        assert a.stored == n and a.failures == Counter() and not a.lost and not a.duplicates
        if restart:
            await _caught_up(h, victim)
    finally:
        await h.__aexit__(None, None, None)


async def _audit(h: Harness, run_id: str, expected: set[str], timeout: float = 60.0) -> audit.Audit:
    """The auditor's reading, retried while a stream elects a new leader (reads time out meanwhile)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            return await fs.settle_and_audit(h, run_id, expected, set(), timeout=60)
        except nats.errors.TimeoutError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(1.0)


async def _caught_up(h: Harness, node: int, timeout: float = 60.0) -> None:
    """The restarted node is a current replica of every stream again (a stream still electing its leader
    answers no info request meanwhile: it counts as behind)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        behind = []
        for config in topology.streams():
            try:
                info = await h.js.stream_info(config.name or "")
            except nats.errors.TimeoutError:
                behind.append(config.name)
                continue
            peers = {p.name: p for p in info.cluster.replicas or []}  # type: ignore[union-attr]
            me = peers.get(f"n{node}")
            if info.cluster.leader != f"n{node}" and (me is None or not me.current):  # type: ignore[union-attr]
                behind.append(config.name)
        if not behind:
            return
        assert asyncio.get_running_loop().time() < deadline, f"n{node} is not current on {behind}"
        await asyncio.sleep(0.5)
