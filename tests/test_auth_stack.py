"""The whole stack under least privilege, and a canary model key that must leak nowhere.

Every process runs as its own identity (broker/auth.py) against a broker with the authorization
block of `gymbus auth init`: the admin provisions (`gymbus init`), the workers, the profiler and the
janitor serve, the submitter runs `gymbus collect --nats`, the operator lists dead letters and the
status. Nothing may be denied. The agent worker is given a canary OPENAI_API_KEY: it must reach the
model as the bearer token (checked at an HTTP proxy in front of the simulated policy) and appear
in no stream, KV value, dead letter, log line, trace attribute or run file (RELIABILITY.md S3).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from broker import credentials, inspect, topology
from broker.auth import client_auth
from broker.connect import connect
from broker.server import EmbeddedServer
from conftest import MATH_TASKS, ROOT
from runtime.model.simulator import InThread, SimConfig, Simulator, load_answer_key

CANARY = "sk-canary-7f3a9c1e-do-not-store"
STREAMS = [
    topology.WORK_STREAM,
    topology.RESULTS_STREAM,
    topology.DEAD_STREAM,
    topology.ADVISORY_STREAM,
    *(f"KV_{b}" for b in (topology.SESSIONS, topology.RUNS, topology.MODELS)),
]


class RecordingProxy:
    """Forwards /v1/* to the simulated policy and keeps the Authorization header of each request."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.authorizations: list[str] = []
        self.server = InThread(Starlette(routes=[Route("/v1/{path:path}", self.forward, methods=["GET", "POST"])]))

    async def forward(self, request: Request) -> Response:
        self.authorizations.append(request.headers.get("authorization", ""))
        headers = {"content-type": request.headers.get("content-type", "application/json")}
        async with aiohttp.ClientSession() as http:
            async with http.request(
                request.method, f"{self.upstream}/v1/{request.path_params['path']}", data=await request.body(),
                headers=headers,
            ) as r:
                return Response(await r.read(), status_code=r.status, media_type=r.content_type)


@pytest.fixture
def policy() -> Iterator[RecordingProxy]:
    sim = Simulator(load_answer_key([MATH_TASKS]), SimConfig(model="policy", accuracy=1.0))
    with InThread(sim.app()) as upstream:
        proxy = RecordingProxy(upstream.url)
        with proxy.server:
            yield proxy


def gymbus(args: list[str], seed: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OPENAI_", "NATS_", "GYMBUS_"))}
    full.update({"NATS_NKEY": str(seed), "GYMBUS_LOG": "info", "OTEL_BSP_SCHEDULE_DELAY": "200", **env})
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "runtime", *args], cwd=ROOT, env=full, stdout=out, stderr=out)


def finished(proc: subprocess.Popen[bytes], timeout: float = 120) -> int:
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def everything_stored(url: str, admin_seed: Path) -> bytes:
    """Every message of every stream and bucket, headers included, as the admin reads them."""
    nc = await connect(url, name="auditor", auth=client_auth({"NATS_NKEY": str(admin_seed)}))
    blobs: list[bytes] = []
    try:
        for stream in STREAMS:
            async for m in inspect.messages(nc.jetstream(), stream, ">"):
                blobs += [m.data or b"", json.dumps(m.headers or {}).encode(), (m.subject or "").encode()]
    finally:
        await nc.close()
    return b"\n".join(blobs)


async def test_every_identity_does_its_job_and_the_model_key_leaks_nowhere(
    tmp_path: Path, policy: RecordingProxy
) -> None:
    auth = credentials.write(tmp_path / "auth", ["simple_agent"], ["math"])
    seeds, logs, traces = auth.seeds, tmp_path / "logs", tmp_path / "traces.jsonl"
    logs.mkdir()
    with EmbeddedServer(tmp_path / "broker", auth_conf=auth.server_conf) as broker:
        url = broker.url
        provision = ["init", "--nats", url, "--agent", "simple_agent", "--env", "math"]
        init = gymbus(provision, seeds["admin"], logs / "init")
        assert finished(init) == 0, (logs / "init").read_text()
        common = {"GYMBUS_TRACES_FILE": str(traces)}
        serving = [
            gymbus(
                ["worker", "simple_agent", "--nats", url],
                seeds["agent-simple_agent"],
                logs / "agent",
                GYMBUS_MODEL_URL=f"{policy.server.url}/v1",
                OPENAI_API_KEY=CANARY,
                **common,
            ),
            gymbus(["worker", "math", "--nats", url], seeds["env-math"], logs / "math", **common),
            gymbus(["profiler", "--nats", url], seeds["profiler"], logs / "profiler", **common),
            gymbus(["janitor", "--nats", url], seeds["janitor"], logs / "janitor", **common),
        ]
        try:
            args = ["collect", "configs/quickstart.yaml", "--nats", url, "--run-id", "least", "-n", "3"]
            args += ["-o", str(tmp_path)]
            collect = gymbus([*args, "--quiet"], seeds["submitter"], logs / "collect", **common)
            assert finished(collect) == 0, (logs / "collect").read_text()
            await poison_a_tool_message(url, seeds["admin"])
            letters = await operator_sees_a_dead_letter(url, seeds["operator"], logs / "operator")
            status = gymbus(["status", "--nats", url, "--json"], seeds["operator"], logs / "status")
            assert finished(status) == 0, (logs / "status").read_text()
        finally:
            for proc in serving:
                proc.send_signal(signal.SIGTERM)
            codes = [finished(proc, 60) for proc in serving]
        stored = await everything_stored(url, seeds["admin"])

    assert codes == [0, 0, 0, 0], {p.name: p.read_text()[-2000:] for p in logs.iterdir()}
    rows = [json.loads(line) for line in (tmp_path / "least" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(r["reward"] == 1.0 for r in rows)
    assert letters and letters[0]["failure_kind"] == "invalid_input" and letters[0]["function"] == "math"
    said = {p.name: p.read_text() for p in logs.iterdir()}
    denied = [
        line
        for text in said.values()
        for line in text.splitlines()
        if "permission denied" in line and "no janitor in this process" not in line  # workers leave it to `janitor`
    ]
    assert not denied, denied

    assert policy.authorizations and set(policy.authorizations) == {f"Bearer {CANARY}"}  # it was sent, and used
    assert CANARY.encode() not in stored, "the model key is in a stream or bucket"
    leaks = {name for name, text in said.items() if CANARY in text}
    assert not leaks, f"the model key is in the logs of {leaks}"
    assert traces.stat().st_size > 0 and CANARY not in traces.read_text(), "the model key is in a span"
    run_files = [p for p in (tmp_path / "least").rglob("*") if p.is_file()]
    assert run_files and not [p for p in run_files if CANARY.encode() in p.read_bytes()], "the model key is in the run"


async def poison_a_tool_message(url: str, admin_seed: Path) -> None:
    """A message that does not decode: the math worker dead-letters it on first sight (invalid_input)."""
    nc = await connect(url, name="poisoner", auth=client_auth({"NATS_NKEY": str(admin_seed)}))
    try:
        await nc.jetstream().publish("gym.tool.math", b'{"kind": "tools", "session_id": "least.9.0", "step": "x"}')
    finally:
        await nc.close()


async def operator_sees_a_dead_letter(url: str, seed: Path, log: Path) -> list[dict]:
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        proc = gymbus(["dead-letters", "--nats", url, "--json"], seed, log)
        assert finished(proc) == 0, log.read_text()
        found = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        if found or asyncio.get_running_loop().time() > deadline:
            return found
        log.write_text("")
        await asyncio.sleep(0.5)
