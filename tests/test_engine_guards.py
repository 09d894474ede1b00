"""The engine under misuse and contention: a failure always commits, a redelivered Start pays for no
second model call, a stopping worker never waits on busy slots or on a broker it never reached; and
the rules written once (names, session ids, percentiles, pulls) are not written again."""

from __future__ import annotations

import ast
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from nats.js import JetStreamContext

from broker.schemas import Resume, Session, session_id
from broker.sessions import SessionStore, StateConflict
from conftest import MATH_TASKS, ROOT
from runtime.bench.report import pct
from runtime.engine.agents import handle_agent
from runtime.engine.failures import fail
from runtime.engine.records import new_session
from runtime.engine.transitions import Delivery, Runtime
from runtime.model.client import ModelOutput
from runtime.profiling.breakdown import percentile as breakdown_percentile
from runtime.profiling.estimators import percentile, spread
from runtime.sdk import Environment, Rollout, Task, load, tool
from runtime.testing import Harness, task_rows

ROW = task_rows(MATH_TASKS)[0]


class Contended(SessionStore):
    """A real store that lands a real competing write just before each of the first ``n`` writes that
    end the rollout, so each of them loses its compare-and-set: the race a busy rollout can give fail(),
    made certain (a concurrent writer makes it likely only, and fail() may win at once)."""

    def __init__(self, js: JetStreamContext, rival: Session, n: int) -> None:
        super().__init__(js)
        self.rival, self.left, self.lost = rival, n, 0

    async def update(
        self, session: Session, *, last: int, ttl_s: float | None = None, record: bytes | None = None
    ) -> int:
        if session.phase == "done" and self.left > 0:
            self.left -= 1
            await super().update(self.rival, last=last)  # another worker's step lands first
            try:
                return await super().update(session, last=last, ttl_s=ttl_s, record=record)
            except StateConflict:
                self.lost += 1
                raise
        return await super().update(session, last=last, ttl_s=ttl_s, record=record)


async def test_a_failure_commits_however_long_others_keep_writing(harness: Harness) -> None:
    """fail() loses compare-and-set races to other writers of the session, more than the 5 it used to
    give up after, and still ends the rollout with its kind."""
    start = harness.start(ROW, run_id="race", agent="simple_agent", env="math")
    d = Delivery(published_at=time.time())
    s = new_session(start, 0, d)
    s.phase, s.step = "model", 1
    store = Contended(harness.js, s, n=7)
    await store.create(s)
    await asyncio.wait_for(
        fail(Runtime(harness.js, store), Resume(session_id=s.session_id, step=1), "tool_error", "the tool broke", d),
        60,
    )
    assert store.lost == 7
    [result] = await harness.results("race", 1)
    assert (result.failure_kind, result.failure_reason, result.reward) == ("tool_error", "the tool broke", None)


async def test_a_redelivered_start_reads_its_session_before_calling_the_model(harness: Harness) -> None:
    calls = 0

    async def respond(items: list, params: dict, s: Session) -> ModelOutput:  # type: ignore[type-arg]
        nonlocal calls
        calls += 1
        out = [{"type": "message", "role": "assistant", "content": "\\boxed{1}"}]
        return ModelOutput(out, s.usage, {})

    rt = Runtime(harness.js, harness.store, respond=respond)
    agent = load("simple_agent")
    start = harness.start(ROW, run_id="redo", agent="simple_agent", env="math")
    await handle_agent(rt, agent, start, Delivery(published_at=time.time()))
    assert calls == 1
    await handle_agent(rt, agent, start, Delivery(published_at=time.time(), num_delivered=2))
    assert calls == 1  # the session was there: its transition re-emitted, no second model call
    loaded = await harness.store.get(session_id("redo", 0, 0))
    assert loaded is not None and loaded[0].step == 1


async def test_a_stopping_worker_drains_within_its_timeout_with_every_slot_busy(harness: Harness) -> None:
    started = asyncio.Event()

    @tool
    async def hang() -> str:
        """Never returns."""
        started.set()
        await asyncio.Event().wait()
        return ""

    async def verify(task: Task, rollout: Rollout) -> float:  # type: ignore[type-arg]
        return 1.0

    env = Environment(name="hangs", tools=[hang], verify=verify)
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent")
    worker = await harness.worker(env, concurrency=1, drain_timeout_s=1.0)
    row = {**ROW, "responses_create_params": {**ROW["responses_create_params"], "tools": [hang.spec()]}}
    await harness.submit(harness.start(row, run_id="busy", agent="simple_agent", env="hangs"))
    await asyncio.wait_for(started.wait(), 30)
    worker.stop()
    task = next(t for w, t in harness._workers if w is worker)
    try:  # drain_timeout_s (1 s) ends it; a drain that waited on the busy slot would take the step timeout (120 s)
        await asyncio.wait_for(task, 60)
    except TimeoutError:
        raise AssertionError("the worker was still draining 60 s after stop(), with drain_timeout_s=1") from None


def test_sigterm_ends_a_worker_that_never_reached_its_broker() -> None:
    env = {**os.environ, "GYMBUS_CONNECT_TIMEOUT_S": "600"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime", "worker", "math", "--nats", "nats://127.0.0.1:1", "--verbose"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # it is in its connect loop (which would go on for 600 s) once it logs a try
            if "Connect call failed" in line:
                break
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 0


def test_percentiles_are_computed_one_way_everywhere() -> None:
    values = [0.9, 0.1, 0.5, 0.3, 0.7, 2.0, 1.1]
    inclusive = statistics.quantiles(values, n=100, method="inclusive")
    for q in (50, 90, 99):
        assert percentile(values, q) == breakdown_percentile(values, q) == pct(values, q)
        assert abs(percentile(values, q) - inclusive[q - 1]) < 1e-12
    s = spread(values)
    assert (s.p50, s.p90, s.p99) == (percentile(values, 50), percentile(values, 90), percentile(values, 99))


def sources() -> list[tuple[Path, ast.Module]]:
    files = [p for d in ("broker", "runtime", "functions") for p in (ROOT / d).rglob("*.py") if "tests" not in p.parts]
    return [(p, ast.parse(p.read_text())) for p in files]


def test_rules_written_once_are_not_written_again() -> None:
    """The name rule lives in broker/names.py, session ids are parsed by broker.schemas.parse_session_id,
    and every consumer pulls with the engine's one-shot requests (never PullSubscription.fetch(n))."""
    for path, tree in sources():
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "A-Za-z0-9_-" in node.value:
                assert rel == "broker/names.py", f"{rel}:{node.lineno}: the name rule again (use broker.names)"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "rsplit" and node.args and getattr(node.args[0], "value", None) == ".":
                    depth = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else 0
                    assert depth != 2 or rel == "broker/schemas.py", f"{rel}:{node.lineno}: parse_session_id"
                if node.func.attr in ("pull_subscribe", "pull_subscribe_bind") and rel.startswith("runtime"):
                    raise AssertionError(f"{rel}:{node.lineno}: pull with runtime.engine.pull.Puller")


def test_modules_and_functions_stay_small() -> None:
    """No module over 400 lines, no function body over 50 lines (typer command signatures aside)."""
    for path, tree in sources():
        rel = path.relative_to(ROOT).as_posix()
        assert len(path.read_text().splitlines()) <= 400, f"{rel} has grown past 400 lines: split it"
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body[1:] if ast.get_docstring(node) else node.body
                lines = (node.end_lineno or 0) - body[0].lineno + 1
                assert lines <= 50 or rel.startswith("runtime/cli/"), f"{rel}:{node.lineno} {node.name}: {lines} lines"
