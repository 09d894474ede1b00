"""openenv_bridge: an OpenEnv environment built from openenv-core's server (guess_env.py), run as a
process and as a container under the real Docker engine; episodes pinned to their session host, and
the instance killed mid-rollout."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openenv.core", reason="openenv-core is not installed (pip install -e '.[openenv]')")

from broker.schemas import session_id
from broker.topology import Limits
from functions.openenv_bridge import envs
from runtime.checking import check
from runtime.instances import free_port
from runtime.testing import Harness, collect_rows

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from guess_env import secret_of  # noqa: E402

PROMPT = "Guess my number from 1 to 20 with the step tool; you have 3 guesses."


def rows(n: int, env: str | None = None, start: int = 0) -> list[dict[str, Any]]:
    """Rows whose right play takes two steps (a miss, then the secret): the episode must keep its state."""
    out = []
    for seed in range(start, start + n):
        secret = secret_of(seed)
        miss = 1 if secret != 1 else 2
        others = [g for g in range(1, 21) if g != secret][:3]
        spec: dict[str, Any] = {"reset": {"seed": seed}, "right": [{"guess": miss}, {"guess": secret}]}
        spec["wrong"] = [{"guess": g} for g in others]
        if env:
            spec["env"] = env
        out.append({"responses_create_params": {"input": f"{PROMPT} (game {seed})"}, "openenv": spec})
    return out


def serve_process(port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "uvicorn", "guess_env:app", "--host", "127.0.0.1", "--port", str(port)]
    return subprocess.Popen(cmd, cwd=HERE, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def wait_http(url: str, timeout_s: float = 120.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the OpenEnv server at {url} never answered /health")


def configure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **urls: str) -> None:
    path = tmp_path / "envs.yaml"
    lines = [f"log_dir: {tmp_path / 'hosts'}", "environments:"]
    lines += [f"  {key}: {{url: '{url}', hosts: 2}}" for key, url in urls.items()]
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("GYMBUS_OPENENV_ENVS", str(path))


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The OpenEnv server as a process, configured as the only environment."""
    port = free_port()
    proc = serve_process(port, tmp_path / "server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url)
        configure(tmp_path, monkeypatch, guess=url)
        yield url, proc
    finally:
        proc.kill()
        proc.wait()
        envs.close()


def write_rows(path: Path, items: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in items))
    return path


async def test_check_passes_both_ways(server: tuple[str, Any], tmp_path: Path) -> None:
    report = await check("openenv_bridge", write_rows(tmp_path / "rows.jsonl", rows(8)))
    assert report.ok, [t.problems for t in report.tasks]
    right = report.right(0)
    assert {k: right.verifier[k] for k in ("done", "steps", "openenv")} == {
        "done": True,
        "steps": 2,
        "openenv": "guess",
    }
    assert right.verifier["step_rewards"] == [0.0, 1.0]  # the miss, then the secret: one episode kept its state
    assert report.wrong(0).verifier["steps"] == 3


async def test_rows_through_collect(server: tuple[str, Any], tmp_path: Path) -> None:
    _, out = await collect_rows(tmp_path, rows(6), env="openenv_bridge", repeats=2)
    assert [r["reward"] for r in out] == [1.0] * 12, [r.get("failure_reason") for r in out]
    assert all(r["verifier"]["step_rewards"] == [0.0, 1.0] for r in out)


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    async with Harness(limits=Limits(ack_wait_s=10, max_deliver=3)) as h:

        async def stop_hosts() -> None:
            envs.close()

        h.cleanups.append(stop_hosts)
        yield h


async def _start(h: Harness, tasks: list[dict[str, Any]], tmp_path: Path) -> None:
    await h.simulate(write_rows(tmp_path / "sim.jsonl", tasks), env="openenv_bridge", accuracy=1.0, latency_ms=400)
    await h.worker("simple_agent")
    await h.worker("openenv_bridge")


async def _opened(h: Harness, sids: list[str], timeout_s: float = 120.0) -> dict[str, dict[str, Any]]:
    """Every rollout's episode once all are open."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sessions = [await h.session(sid) for sid in sids]
        episodes = {s.session_id: s.env_state.get("openenv") for s in sessions if s is not None}
        if len(episodes) == len(sids) and all(episodes.values()):
            return {sid: e for sid, e in episodes.items() if e}
        await asyncio.sleep(0.05)
    raise AssertionError(f"not every episode opened within {timeout_s:g} s: {await h.backlog()}")


async def _submit(h: Harness, run_id: str, tasks: list[dict[str, Any]]) -> list[str]:
    for k, row in enumerate(tasks):
        await h.submit(h.start(row, run_id=run_id, task_index=k, seed=True))
    return [session_id(run_id, k, 0) for k in range(len(tasks))]


async def _still_open(h: Harness, sids: list[str]) -> set[str]:
    return {sid for sid in sids if (s := await h.session(sid)) is not None and s.phase != "done"}


def _ended_once(results: list[Any], n: int) -> None:
    assert len(results) == n and set(Counter(r.session_id for r in results).values()) == {1}


@pytest.mark.bridges
async def test_a_server_killed_mid_rollout_ends_its_episodes_as_env_lost(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two OpenEnv servers; one is killed once every episode is open: its rollouts end as env_lost."""
    ports, procs = [free_port(), free_port()], []
    for key, port in zip("ab", ports, strict=True):
        procs.append(serve_process(port, tmp_path / f"{key}.log"))
    try:
        for port in ports:
            wait_http(f"http://127.0.0.1:{port}")
        configure(tmp_path, monkeypatch, a=f"http://127.0.0.1:{ports[0]}", b=f"http://127.0.0.1:{ports[1]}")
        tasks = rows(6, "a") + rows(6, "b", start=6)
        await _start(harness, tasks, tmp_path)
        sids = await _submit(harness, "killed", tasks)
        episodes = await _opened(harness, sids)
        procs[0].kill()
        procs[0].wait()
        lost = {sid for sid in await _still_open(harness, sids) if episodes[sid]["env"] == "a"}
        results = await harness.final_results("killed", timeout=120)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    _ended_once(results, 12)
    assert lost, "the kill came after every rollout of server a had ended"
    for r in results:
        if r.session_id in lost:
            assert (r.failure_kind, r.reward) == ("env_lost", None), r
        elif episodes[r.session_id]["env"] == "b":
            assert r.reward == 1.0, r


@pytest.mark.bridges
async def test_a_session_host_killed_mid_rollout_ends_its_episodes_as_env_lost(
    harness: Harness, server: tuple[str, Any], tmp_path: Path
) -> None:
    """Two session hosts in front of one server; one is killed: the episodes it held end as env_lost."""
    tasks = rows(12)
    await _start(harness, tasks, tmp_path)
    sids = await _submit(harness, "host", tasks)
    episodes = await _opened(harness, sids)
    victim = envs.pools()["guess"].children[0]
    victim.proc.kill()
    victim.proc.wait()
    lost = {sid for sid in await _still_open(harness, sids) if episodes[sid]["instance"] == victim.name}
    results = await harness.final_results("host", timeout=120)
    _ended_once(results, 12)
    assert 0 < len(lost) < 12
    for r in results:
        expected = ("env_lost", None) if r.session_id in lost else (None, 1.0)
        assert (r.failure_kind, r.reward) == expected, r


def _docker() -> str:
    docker = shutil.which("docker")
    if docker is None or not os.environ.get("DOCKER_HOST"):
        pytest.skip('no Docker engine here: eval "$(scripts/docker-engine up)" first')
    probe = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"the Docker engine does not answer: {probe.stderr.strip()[-200:]}")
    return docker


@pytest.fixture
def container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The same OpenEnv server in a container (python:3.11-slim, with gymbus's own site-packages
    mounted), on a network of its own with its port published on loopback."""
    docker = _docker()
    import openenv

    site = Path(openenv.__file__).resolve().parent.parent
    port, name = free_port(), f"gymbus-openenv-test-{os.getpid()}-{free_port()}"
    subprocess.run([docker, "network", "create", name], check=True, capture_output=True)
    cmd = [docker, "run", "-d", "--rm", "--name", name, "--network", name, "-p", f"127.0.0.1:{port}:8000"]
    cmd += ["-v", f"{site}:/deps:ro", "-v", f"{HERE}:/app:ro", "-w", "/app", "-e", "PYTHONPATH=/deps"]
    cmd += ["python:3.11-slim", "python", "-m", "uvicorn", "guess_env:app", "--host", "0.0.0.0", "--port", "8000"]
    url = f"http://127.0.0.1:{port}"
    try:
        subprocess.run(cmd, check=True, capture_output=True)
        wait_http(url)
        configure(tmp_path, monkeypatch, guess=url)
        yield name
    finally:
        subprocess.run([docker, "rm", "-f", name], capture_output=True)
        subprocess.run([docker, "network", "rm", name], capture_output=True)
        envs.close()


@pytest.mark.bridges
async def test_in_a_container_then_the_container_killed_mid_rollout(
    container: str, harness: Harness, tmp_path: Path
) -> None:
    report = await check("openenv_bridge", write_rows(tmp_path / "rows.jsonl", rows(4)))
    assert report.ok, [t.problems for t in report.tasks]
    tasks = rows(8, start=20)
    await _start(harness, tasks, tmp_path)
    sids = await _submit(harness, "docker", tasks)
    await _opened(harness, sids)
    subprocess.run([_docker(), "kill", container], check=True, capture_output=True)
    lost = await _still_open(harness, sids)
    results = await harness.final_results("docker", timeout=120)
    _ended_once(results, 8)
    assert lost
    for r in results:
        expected = ("env_lost", None) if r.session_id in lost else (None, 1.0)
        assert (r.failure_kind, r.reward) == expected, r
