"""Test harness for gymbus and for function authors: a real broker, real workers, a simulated policy.

    async with Harness() as h:                       # fresh nats-server on a temp store
        await h.simulate("functions/math/data/example.jsonl", accuracy=1.0)
        await h.worker("simple_agent"); await h.worker("math")
        await h.submit(h.start(task_row, run_id="t1"))  # to the agent and environment served above
        [result] = await h.results("t1", 1)             # fails the test if it does not arrive
        await h.settled()                               # nothing in flight: no more Results can come

Everything between the simulated policy (a real HTTP server) and the broker is the production path.
Every wait has a deadline and fails the test when it passes, saying what it waited for and what it
saw: a helper never hands back less than was asked for.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext

from broker import inspect, topology
from broker.connect import connect
from broker.publish import publish, publish_raw
from broker.schemas import Msg, Options, Result, Session, Start, result_decoder, session_id
from broker.server import EmbeddedServer
from broker.sessions import SessionStore
from runtime.engine.worker import Worker
from runtime.errors import UsageError
from runtime.model.client import register
from runtime.model.policy import AnswerBook
from runtime.model.serving import InThread
from runtime.model.simulator import SimConfig, Simulator, load_answer_key
from runtime.sdk import Agent, Environment, Function, load

_ids = itertools.count()
T = TypeVar("T")
POLL_S = 0.05


async def wait_until(check: Callable[[], Awaitable[T]], what: str, timeout: float = 30.0) -> T:
    """Poll ``check`` until it returns something truthy, and return that; after ``timeout`` seconds fail
    with a TimeoutError naming ``what`` was awaited and the last value seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what} (last seen: {value!r})")
        await asyncio.sleep(POLL_S)


def start_message(
    row: dict[str, Any],
    *,
    agent: str,
    env: str,
    run_id: str = "test",
    task_index: int = 0,
    rollout_index: int = 0,
    attempt: int = 0,
    **options: Any,
) -> Start:
    """A Start for a NeMo Gym-shaped task row, addressed to ``agent`` and ``env``."""
    return Start(
        run_id=run_id,
        task_index=task_index,
        rollout_index=rollout_index,
        attempt=attempt,
        agent=agent,
        env=env,
        responses_create_params=row["responses_create_params"],
        meta={k: v for k, v in row.items() if k != "responses_create_params"},
        options=Options(**options),
    )


class Harness:
    def __init__(self, store_dir: str | Path | None = None, limits: topology.Limits | None = None) -> None:
        self.broker = EmbeddedServer(store_dir)
        self.limits = limits or topology.Limits(ack_wait_s=5.0, max_deliver=3)
        self.nc: Client | None = None
        self.sim: Simulator | None = None
        self._sim_server: InThread | None = None
        self.model_url: str | None = None
        self._workers: list[tuple[Worker, asyncio.Task[None]]] = []
        self.cleanups: list[Callable[[], Awaitable[None]]] = []
        """Awaited (last first) when the harness exits, before the workers stop: a test's own servers."""
        self._served: dict[str, Function] = {}
        """Every function a worker of this harness has served, by name (`start` addresses them)."""

    @property
    def js(self) -> JetStreamContext:
        assert self.nc is not None
        return self.nc.jetstream()

    @property
    def store(self) -> SessionStore:
        return SessionStore(self.js)

    async def __aenter__(self) -> Harness:
        await asyncio.to_thread(self.broker.start)
        self.nc = await connect(self.broker.url, name="gymbus-test")
        await topology.ensure(self.js, self.limits)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for cleanup in reversed(self.cleanups):
            await cleanup()
        await self.stop_workers()
        if self.nc is not None:
            await self.nc.close()
        if self._sim_server is not None:
            self._sim_server.__exit__()
        await asyncio.to_thread(self.broker.close)

    async def simulate(
        self,
        *task_files: str | Path,
        model: str = "policy",
        env: str | Environment | None = None,
        plays: dict[str, str] | None = None,
        **config: Any,
    ) -> str:
        """Start the simulated policy in a thread and register it as ``model``; returns its base URL.
        ``env`` is the environment of rows that name none: its reference is what the policy plays.
        ``plays`` (model name -> role) are the agent's other models it plays too, registered here."""
        known = env if isinstance(env, Environment) else None
        name = env.name if isinstance(env, Environment) else env
        book = AnswerBook.from_files(task_files, env=name, seed=config.get("seed", 0), known=known)
        book.plays = dict(plays or {})
        self.sim = Simulator(load_answer_key(task_files), SimConfig(model=model, **config), book=book)
        self._sim_server = InThread(self.sim.app()).__enter__()
        self.model_url = f"{self._sim_server.url}/v1"
        for name in [model, *book.plays]:
            await register(self.js, name, [self.model_url])
        return self.model_url

    async def worker(self, function: str | Function, **options: Any) -> Worker:
        """Run a worker for ``function`` as a task of this event loop, until the harness exits."""
        fn = load(function) if isinstance(function, str) else function
        options.setdefault("limits", self.limits)
        options.setdefault("nats_url", self.broker.url)
        w = Worker(fn, **options)
        task = asyncio.create_task(w.run())
        self._workers.append((w, task))
        self._served.setdefault(fn.name, fn)
        await asyncio.wait({task, asyncio.create_task(w.ready.wait())}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()
        return w

    async def stop_workers(self) -> None:
        for w, _ in self._workers:
            w.stop()
        if self._workers:
            await asyncio.gather(*(t for _, t in self._workers), return_exceptions=True)
        self._workers.clear()

    def start(self, row: dict[str, Any], *, agent: str | None = None, env: str | None = None, **fields: Any) -> Start:
        """A Start for a NeMo Gym-shaped task row (``fields``: run_id, task_index, rollout_index, attempt,
        and any `Options`). It goes to the agent and the environment this harness runs workers for, unless
        ``agent`` or ``env`` names another; when the harness serves none or several, the name is required."""
        agent = agent or self._served_name(Agent, "agent")
        env = env or self._served_name(Environment, "env")
        return start_message(row, agent=agent, env=env, **fields)

    def _served_name(self, kind: type, argument: str) -> str:
        names = sorted(name for name, fn in self._served.items() if isinstance(fn, kind))
        if len(names) == 1:
            return names[0]
        served = f"{len(names)} ({', '.join(names)})" if names else "none"
        raise UsageError(
            f"Harness.start: {argument}= not given, and the harness runs workers for {served} of that kind;"
            f" pass {argument}='NAME' (the function under test)"
        )

    async def submit(self, msg: Start | bytes, subject: str | None = None, msg_id: str | None = None) -> None:
        """Publish a Start (or raw bytes, to test bad input: to ``subject``, by default the served agent's)
        as a client would."""
        if isinstance(msg, Start):
            sid = session_id(msg.run_id, msg.task_index, msg.rollout_index)
            await publish(
                self.js, subject or topology.agent_subject(msg.agent), msg, msg_id or f"{sid}:start:{msg.attempt}"
            )
        else:
            await publish_raw(
                self.js,
                subject or topology.agent_subject(self._served_name(Agent, "agent")),
                msg,
                {"Nats-Msg-Id": msg_id or f"raw-{next(_ids)}"},
            )

    async def send(self, subject: str, msg: Msg, msg_id: str) -> None:
        await publish(self.js, subject, msg, msg_id)

    async def results(self, run_id: str, n: int, timeout: float = 30.0) -> list[Result]:
        """Wait until the run's result subject holds ``n`` messages; returns them all (duplicates included).
        Fails (TimeoutError) if fewer than ``n`` arrived within ``timeout`` seconds, saying how many did
        and what is still in the work stream."""
        subject = topology.result_subject(run_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (count := await inspect.count(self.js, topology.RESULTS_STREAM, subject)) < n:
            if loop.time() > deadline:
                raise TimeoutError(
                    f"{count} of {n} results arrived on {subject} within {timeout:g} s; {await self.backlog()}"
                )
            await asyncio.sleep(POLL_S)
        return await self.read(subject, count)

    async def backlog(self) -> str:
        """What is still waiting, for a failure message: work messages by subject, and dead letters."""
        work = await self.js.stream_info(topology.WORK_STREAM, subjects_filter=">")
        dead = await self.js.stream_info(topology.DEAD_STREAM)
        waiting = ", ".join(f"{k}: {v}" for k, v in sorted((work.state.subjects or {}).items())) or "nothing"
        return f"in the work stream: {waiting}; dead letters: {dead.state.messages}"

    async def settled(self, timeout: float = 30.0) -> None:
        """Wait until nothing submitted is in flight, so a count taken next is final (no Result can follow).

        Settled means: the work stream is empty (every message acknowledged, terminated or moved to the
        dead letters: work-queue retention removes it only then, and a handler publishes its successor
        before it acknowledges), so is the advisory stream (every max-deliveries advisory handled by a
        janitor), no worker of this harness has a handler running, and two reads in a row saw the same
        last sequences (nothing was published in between). Not covered: workers in other processes that
        still run a handler on a message already acknowledged elsewhere, and the janitor's deadline sweep."""

        async def quiet() -> tuple[int, int] | None:
            work = await self.js.stream_info(topology.WORK_STREAM)
            advisories = await self.js.stream_info(topology.ADVISORY_STREAM)
            busy = sum(w.stats["in_flight"] for w, _ in self._workers)
            if work.state.messages or advisories.state.messages or busy:
                return None
            return work.state.last_seq, advisories.state.last_seq

        async def twice() -> bool:
            first = await quiet()
            return first is not None and first == await quiet()

        try:
            await wait_until(twice, "the work to settle", timeout)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; {await self.backlog()}") from None

    async def final_results(self, run_id: str, timeout: float = 30.0) -> list[Result]:
        """Every Result of the run once the work has `settled`: the whole set, duplicates included."""
        await self.settled(timeout)
        return await self.read(topology.result_subject(run_id))

    async def read(self, subject: str, count: int | None = None, stream: str = topology.RESULTS_STREAM) -> list[Any]:
        """Messages on ``subject`` without consuming them (Results decoded; raw messages otherwise)."""
        out: list[Any] = []
        async for m in inspect.messages(self.js, stream, subject):
            out.append(result_decoder.decode(m.data or b"") if stream == topology.RESULTS_STREAM else m)
            if count is not None and len(out) >= count:
                break
        return out

    async def session(self, sid: str) -> Session | None:
        loaded = await self.store.get(sid)
        return loaded[0] if loaded else None

    async def pending(self, subject: str) -> int:
        """Messages waiting on a work subject."""
        return await inspect.count(self.js, topology.WORK_STREAM, subject)


def task_rows(path: str | Path) -> list[dict[str, Any]]:
    return [msgspec.json.decode(line) for line in Path(path).read_bytes().splitlines() if line.strip()]


async def collect_rows(
    folder: Path,
    rows: list[dict[str, Any]],
    *,
    env: str,
    agent: str = "simple_agent",
    accuracy: float = 1.0,
    repeats: int = 1,
    **config: Any,
) -> tuple[Any, list[dict[str, Any]]]:
    """``gymbus collect`` of ``rows`` (written as they are to a JSONL file) on the local stack with the
    simulated policy; returns the run's Summary and its ``rollouts.jsonl`` rows."""
    import json

    from runtime.runs.collect import collect
    from runtime.runs.config import load_config

    folder.mkdir(parents=True, exist_ok=True)
    tasks = folder / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg: dict[str, Any] = {
        "input": str(tasks),
        "agent": agent,
        "env": env,
        "repeats": repeats,
        "output": str(folder / "runs"),
        "model": {"simulate": {"accuracy": accuracy}},
        "workers": {"concurrency": 16},
        **config,
    }
    (folder / "run.yaml").write_text(json.dumps(cfg))
    summary = await collect(load_config(folder / "run.yaml"), quiet=True)
    out = [json.loads(line) for line in (summary.run_dir / "rollouts.jsonl").read_text().splitlines()]
    return summary, out
