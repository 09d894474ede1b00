"""A 3-node NATS cluster, as deploy/k8s runs one: streams and buckets replicated, rollouts served.

Three real nats-server processes with routes between them, on loopback. The settings are the ones the
Kubernetes example gives every pod (GYMBUS_STREAM_REPLICAS from its ConfigMap).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
import yaml

from broker import topology
from broker.server import binary
from conftest import MATH_TASKS
from runtime.testing import Harness, task_rows
from tests.compose_local import free_port
from tests.compose_spec import ROOT

CONFIGMAP = yaml.safe_load((ROOT / "deploy" / "k8s" / "gymbus" / "10-config.yaml").read_text())["data"]
REPLICAS = int(CONFIGMAP["GYMBUS_STREAM_REPLICAS"])


def node_config(i: int, store: Path, client: int, routes: list[int]) -> str:
    return "\n".join(
        [
            f"server_name: n{i}",
            f"listen: 127.0.0.1:{client}",
            f"jetstream {{ store_dir: {json.dumps(str(store / f'n{i}'))} }}",
            f"cluster {{ name: gymbus, listen: 127.0.0.1:{routes[i]}, routes: [",
            *[f"  nats-route://127.0.0.1:{r}" for r in routes],
            "] }",
        ]
    )


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[list[str]]:
    clients, routes = [free_port() for _ in range(REPLICAS)], [free_port() for _ in range(REPLICAS)]
    procs = []
    for i in range(REPLICAS):
        conf = tmp_path / f"n{i}.conf"
        conf.write_text(node_config(i, tmp_path, clients[i], routes))
        log = open(tmp_path / f"n{i}.log", "wb")
        procs.append(subprocess.Popen([binary(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT))
    urls = [f"nats://127.0.0.1:{port}" for port in clients]
    try:
        await _meta_leader(urls[0])
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


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


async def test_replicated_topology_serves_rollouts(cluster: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert REPLICAS == 3
    monkeypatch.setenv("GYMBUS_STREAM_REPLICAS", CONFIGMAP["GYMBUS_STREAM_REPLICAS"])
    limits = topology.Limits.from_env()
    harness = Harness(limits=limits)  # its own server is never started: the cluster stands in
    harness.broker.url = cluster[0]  # workers connect to one node...
    harness.nc = await nats.connect(cluster[1])  # ...the client to another
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
