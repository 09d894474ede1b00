"""Every process exports its last spans when it stops, in bounded time.

A worker that stops right after its last message still holds spans nobody exported (the batch
processor sends every few seconds). They go out at exit. Two ways that failed are tested with real
worker processes and a real OTLP/HTTP receiver: a supervisor that sends SIGTERM twice (the second
arrived while the worker was exporting, when asyncio had already given SIGTERM back its default
action), and a backend that never answers (the exit must not wait on it).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.requests import Request
from starlette.responses import Response

from conftest import MATH_TASKS, ROOT
from runtime.testing import Harness
from tests.otlp_receiver import OtlpReceiver

MATH_SPANS = {
    "process gym.tool.math",
    "execute_tool calculator",
    "send gym.agent.simple_agent.resume",
    "process gym.verify.math",
    "verify math",
    "send gym.result.flush",
}


KEEP_VERIFY_HOP = {"GYMBUS_VERIFY_INLINE": "0"}
"""The math worker verifies too (not the agent, in its last turn): more of its spans to export."""

REDELIVERY_SPANS = {
    "process gym.tool.math",
    "process gym.verify.math",
    "send gym.agent.simple_agent.resume",
    "send gym.result.flush",
}
"""What a delivered-again message adds: it finds its step applied and re-emits the message after it."""


class RefusingOnce(OtlpReceiver):
    """Answers 503 (retry later) to the first export of each service, and says when it did."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: dict[str, threading.Event] = {}
        self._seen: set[str] = set()

    def refused_event(self, service: str) -> threading.Event:
        return self.refused.setdefault(service, threading.Event())

    async def _export(self, request: Request) -> Response:
        before = len(self.spans)
        reply = await super()._export(request)
        new = self.spans[before:]
        service = new[0].service if new else ""
        if service and service not in self._seen:
            self._seen.add(service)
            del self.spans[before:]  # as if the backend had not stored them
            self.refused_event(service).set()
            return Response(status_code=503)
        return reply


@pytest.fixture
def refusing() -> Iterator[RefusingOnce]:
    with RefusingOnce() as receiver:
        yield receiver


def spawn(function: str, url: str, endpoint: str, **env: str) -> subprocess.Popen[bytes]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYMBUS_TRACES"))}
    base.update({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "600000", **env})
    cmd = [sys.executable, "-m", "runtime", "worker", function, "--nats", url]
    return subprocess.Popen(cmd, cwd=ROOT, env=base, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def one_rollout(harness: Harness, math_rows: list[dict]) -> None:
    from functions.math.env import ENVIRONMENT

    row = math_rows[0]
    row = {**row, "responses_create_params": {**row["responses_create_params"], "tools": ENVIRONMENT.tool_specs()}}
    await harness.submit(harness.start(row, run_id="flush", agent="simple_agent", env="math"))
    [result] = await harness.results("flush", 1, timeout=60)
    assert result.reward == 1.0


def stopped(proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_a_second_sigterm_during_the_last_export_loses_no_span(
    harness: Harness, math_rows: list[dict], refusing: RefusingOnce
) -> None:
    """No span is exported before the stop (schedule delay 10 min): all go out at exit, and the
    backend refuses the first try, so the exporter is retrying when the second SIGTERM comes."""
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    workers = [spawn(f, harness.broker.url, refusing.endpoint, **KEEP_VERIFY_HOP) for f in ("simple_agent", "math")]
    try:
        await one_rollout(harness, math_rows)
        assert refusing.spans == []
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
    agent, math = workers
    assert refusing.refused_event("gymbus-math").wait(30), "the math worker never tried to export"
    math.send_signal(signal.SIGTERM)  # what a supervisor stopping its children one by one does
    assert stopped(math) == 0, math.stderr.read().decode() if math.stderr else ""
    assert stopped(agent) == 0
    names = [s.name for s in refusing.spans if s.service == "gymbus-math"]
    # every span is there; the work (the tool call, the verification) is done once. A message can be
    # delivered again (at least once): that delivery's process span and its re-emit are the only extras
    assert set(names) == MATH_SPANS and names.count("execute_tool calculator") == names.count("verify math") == 1, names
    assert set(Counter(names) - Counter(MATH_SPANS)) <= REDELIVERY_SPANS, names
    agent_names = [s.name for s in refusing.spans if s.service == "gymbus-simple_agent"]
    # both turns' spans are there; a Start handled a second time adds its own process span and model call
    turns = agent_names.count("process gym.agent.simple_agent") + agent_names.count(
        "process gym.agent.simple_agent.resume"
    )
    chats = agent_names.count("chat policy")
    assert turns >= 2 and chats >= 2 and chats <= turns, agent_names


async def test_a_backend_that_never_answers_does_not_hold_the_exit(
    harness: Harness, math_rows: list[dict], tmp_path: Path
) -> None:
    """The exporter would wait 30 s per try (OTEL_EXPORTER_OTLP_TIMEOUT); the exit waits 1 s."""
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        limits = {"GYMBUS_TRACES_FLUSH_S": "1", "OTEL_EXPORTER_OTLP_TIMEOUT": "30"}
        workers = [spawn(f, harness.broker.url, endpoint, **limits) for f in ("simple_agent", "math")]
        try:
            await one_rollout(harness, math_rows)
        finally:
            for w in workers:
                w.send_signal(signal.SIGTERM)
        codes = [stopped(w, timeout=20) for w in workers]
    assert codes == [0, 0]
    warnings = [w.stderr.read().decode() if w.stderr else "" for w in workers]
    assert all("not exported within 1s" in text for text in warnings), warnings
