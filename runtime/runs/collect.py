"""``gymbus collect``: submit a run's rollouts, gather their Results, write the run folder.

A run is tasks x repeats. Each rollout's session id is derived from (run, task, repeat), so the
same command run again resumes: rollouts that already have a Result on the results stream (or a
row in ``rollouts.jsonl``) are not submitted again, rollouts still in flight are nudged (see
`runtime.runs.rollouts`), and only the missing ones are (re)submitted. A run id is bound to what
it ran (`runs.identity`), and a run folder has one writer at a time (`runs.folder`).

    prepare()        check the run id, read the tasks, load the functions, check the model: no side effects
    Collector.run()  lock the folder, start the local stack (or join --nats), record the manifest,
                     submit what is missing, gather until every rollout has its Result, write the folder
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext

from broker import topology
from broker.connect import connect
from broker.manifests import Manifest
from broker.schemas import Result
from runtime.profiling.profile import Profile
from runtime.rows import output_row
from runtime.runs import identity as identities
from runtime.runs import rollouts
from runtime.runs.config import RunConfig
from runtime.runs.feed import DoneTable, ResultsFeed
from runtime.runs.folder import RunFolder, versions
from runtime.runs.keys import Grid, Key, KeySet
from runtime.runs.models import (
    describe_endpoints,
    register_model,
    register_named_models,
    registered_entry,
    urls_of,
    writer,
)
from runtime.runs.plan import Plan, check_served, prepare
from runtime.runs.progress import RunProgress
from runtime.runs.stack import LocalStack
from runtime.runs.tasks import run_defaults
from runtime.telemetry import tracing
from runtime.telemetry.spans import RolloutSpans

log = logging.getLogger("gymbus.collect")



@dataclass
class Summary:
    run_id: str
    run_dir: Path
    expected: int
    submitted: int
    results: DoneTable = field(default_factory=lambda: DoneTable(""))
    """Each rollout's latest Result, as much of it as the summary needs (the rows are in the folder)."""
    wall_s: float = 0.0
    profile: Profile | None = None
    """The run's reward profile, written with the run folder (None if profiling it failed)."""
    wrote_folder: bool = True
    """False when another process holds the run folder (a second gatherer of a shared broker's run)."""

    @property
    def failures(self) -> Counter[str]:
        return self.results.failures()

    @property
    def mean_reward(self) -> float | None:
        n, total = 0, 0.0
        for reward in self.results.rewards():
            n, total = n + 1, total + reward
        return total / n if n else None

    @property
    def all_failed(self) -> bool:
        """Every rollout of the run ended, and none with a reward."""
        return len(self.results) == self.expected > 0 and self.mean_reward is None


async def collect(
    cfg: RunConfig,
    *,
    run_id: str | None = None,
    quiet: bool = False,
    console: Any = None,
    replay: list[int] | None = None,
    extend: bool = False,
    check_model: bool = True,
) -> Summary:
    """Run (or resume) a collection and write its folder; returns what was gathered.

    ``replay`` (dead-letter sequences; empty: all of this run's) re-runs those rollouts as a new
    attempt and waits for them (see runtime/engine/deadletters.py). ``extend`` lets a resume raise
    ``repeats`` or ``limit``."""
    plan = await prepare(cfg, run_id, check_model=check_model)
    return await Collector(plan, quiet=quiet, console=console, replay=replay, extend=extend).run()


class Collector:
    """One `gymbus collect` of a prepared run."""

    def __init__(
        self, plan: Plan, *, quiet: bool, console: Any, replay: list[int] | None, extend: bool
    ) -> None:
        self.plan, self.cfg = plan, plan.cfg
        self.quiet, self.console, self.replay, self.extend = quiet, console, replay, extend
        self.folder = RunFolder(self.cfg.output, plan.run_id)
        self.summary = Summary(plan.run_id, self.folder.path, expected=len(plan.expected), submitted=0)
        self.stack: LocalStack | None = None
        self.feed: ResultsFeed | None = None
        self.rows_out: IO[str] | None = None
        self.progress: RunProgress | None = None
        self.window = rollouts.Window(self.cfg.workers.window())
        self.wanted: dict[Key, int] = {}
        """The attempt each rollout submitted again (or replayed) must reach to be done."""
        self.pending = KeySet(Grid((), 0))
        """The run's rollouts not done yet (filled once submitting starts)."""
        self.roots = RolloutSpans()
        self.submitting = False
        """Set once the first rollout may have been published: from then on the folder is the run's."""
        self.t_start = time.time()

    async def run(self) -> Summary:
        self._lock()
        nc: Client | None = None
        try:
            child_env = tracing.configure_run(self.folder.path) if self.summary.wrote_folder else {}
            nats_url = self.cfg.nats or self._start_broker(child_env)
            nc = await connect(nats_url, name=f"gymbus-collect-{self.plan.run_id}")
            js = nc.jetstream()
            await topology.ensure(js, topology.Limits.from_env())
            await self._start_functions(js, child_env)
            await self._gather(js, nats_url)
        finally:
            await self._shutdown(nc)
        return self.summary

    def _lock(self) -> None:
        self.folder.create()
        if self.folder.lock():
            return
        if not self.cfg.nats:
            raise self.folder.busy()
        self.summary.wrote_folder = False
        log.warning(
            "%s also gathers run %s; this process gathers its Results too and leaves %s to it",
            self.folder.holder(),
            self.plan.run_id,
            self.folder.path,
        )

    def _start_broker(self, child_env: dict[str, str]) -> str:
        self.stack = LocalStack(self.folder.path, env=child_env)
        return self.stack.start_broker()

    async def _start_functions(self, js: JetStreamContext, child_env: dict[str, str]) -> None:
        """The local stack's policy, workers and profiler; with --nats, check that workers serve the run."""
        cfg, urls = self.cfg, urls_of(self.cfg.model.base_url)
        if self.stack is None:
            await check_served(js, cfg, self.plan.functions)
            registered = await registered_entry(js, cfg.model.name)
            if registered["endpoints"] and not self.plan.model:
                registered.update(await describe_endpoints(registered["endpoints"], cfg.model.name))
            self.plan.model = {**registered, **self.plan.model}
        else:
            if not urls:
                sim = cfg.model.simulate
                urls = [
                    self.stack.start_simulator(
                        str(Path(cfg.input).resolve()),
                        accuracy=sim.accuracy,
                        latency_ms=sim.latency_ms,
                        seed=sim.seed,
                        model=cfg.model.name,
                        env=cfg.env,
                        plays={m.name: m.role for m in self.plan.agent_models if m.role != "judge"},
                    )
                ]
                self.plan.model = {"endpoints": urls, "simulated_policy": True}
            for ref in self.plan.worker_refs():
                for replica in range(cfg.workers.replicas):
                    self.stack.start_worker(ref, replica, concurrency=cfg.workers.concurrency)
            self.stack.start_profiler()
        if urls:
            await register_model(js, cfg.model, urls, writer("collect"))
            simulated = self.stack is not None and not cfg.model.base_url
            models = [m for e in self.plan.envs.values() for m in e.models] + self.plan.agent_models
            await register_named_models(js, cfg, urls, simulated, models)
        if self.stack is not None:  # once the models are registered: a resumed run's leftovers run at once
            pairs = self.plan.functions
            await self.stack.wait_registered(js, {a for a, _ in pairs}, {e for _, e in pairs}, since=self.t_start)

    async def _gather(self, js: JetStreamContext, nats_url: str) -> None:
        plan = self.plan
        manifest = Manifest(
            run_id=plan.run_id,
            expected=len(plan.expected),
            tasks=len(plan.tasks),
            repeats=self.cfg.repeats,
            pass_threshold=self.cfg.profile.pass_threshold,
            identity=plan.identity,
            defaults=run_defaults(self.cfg),
        )
        folder_identity = self.folder.identity() if self.summary.wrote_folder else None
        fresh = await identities.open_manifest(js, manifest, extend=self.extend, folder=folder_identity)
        # every Result is written to the folder as it is read and only its Done is kept, and Starts go
        # out as Results come back (`rollouts.Window`): a run of any size is gathered in bounded memory
        self.rows_out = self.folder.appender() if self.summary.wrote_folder else None
        feed = self.feed = ResultsFeed(js, plan.run_id, keep=False)
        feed.on_result = self._on_result
        await feed.start()
        await feed.catch_up()
        if not feed.done and self.summary.wrote_folder:  # a new broker (store deleted, another cluster)
            for r in self.folder.results(plan.run_id):
                feed.add(r)
        missing = (k for k in plan.expected if feed.done.attempt(*k) is None)  # no Result yet
        attempts = await rollouts.plan(js, plan.expected, missing, plan.run_id, fresh, time.time(), self._finished)
        wanted = await rollouts.replay(js, plan.run_id, self.replay) if self.replay is not None else {}
        # a rollout submitted again is done with a Result of that attempt (an older one's may still
        # arrive, re-emitted from its session's record, and would be superseded)
        self.wanted = {**attempts.again, **wanted}  # an attempt not there is 0
        self.submitting = True
        if self.summary.wrote_folder:
            self._write_metadata(nats_url)
        progress = RunProgress(total=len(plan.expected), run_id=plan.run_id, quiet=self.quiet, console=self.console)
        for d in feed.done.values():
            if (d.task_index, d.rollout_index) in plan.expected:
                progress.add(d, resumed=True)
        self.progress = progress
        self.pending = KeySet(plan.expected, (k for k in plan.expected if not self._done(k)))
        with progress:
            tasks = {t.index: t for t in plan.tasks}
            publishing = asyncio.create_task(
                rollouts.publish_starts(js, self.cfg, plan.run_id, tasks, attempts, self.roots, self.window)
            )
            try:
                await self._wait(publishing)
            finally:
                if not publishing.done():
                    publishing.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await publishing
                self.summary.submitted = len(wanted) + self.window.entered

    async def _finished(self, keys: list[Key]) -> set[Key]:
        """Which of ``keys`` have a Result now (`rollouts.plan`'s second look): every Result stored by
        now is read first."""
        assert self.feed is not None
        await self.feed.settle()
        return {k for k in keys if self.feed.done.attempt(*k) is not None}

    def _done(self, key: Key) -> bool:
        assert self.feed is not None
        attempt = self.feed.done.attempt(*key)
        return attempt is not None and attempt >= self.wanted.get(key, 0)

    def _on_result(self, r: Result, new: bool, latest: bool) -> None:
        self.roots.finish(r)
        key = (r.task_index, r.rollout_index)
        if key not in self.plan.expected:
            return
        if latest and self.rows_out is not None:
            self.rows_out.write(json.dumps(output_row(self.plan.rows.get(r.task_index), r)) + "\n")
            self.rows_out.flush()
        self.window.leave(key, r.attempt)
        if self.progress is not None:  # submitting: the Results read before are counted as resumed
            if new:
                self.progress.add(r)
            if r.attempt >= self.wanted.get(key, 0):
                self.pending.discard(key)

    async def _wait(self, publishing: asyncio.Task[int]) -> None:
        """Until every rollout has a Result of at least the attempt ``wanted`` says (submitted again, or
        replayed), while ``publishing`` submits what is missing."""
        assert self.feed is not None and self.progress is not None
        while self.pending:
            if publishing.done() and not publishing.cancelled() and publishing.exception() is not None:
                await publishing  # raises its error
            self.feed.changed.clear()
            try:
                async with asyncio.timeout(2.0):
                    await self.feed.changed.wait()
            except TimeoutError:
                pass
            if self.stack is not None:
                self.stack.restart_exited_workers(self.cfg.workers.concurrency)
            self.progress.refresh()
        await publishing

    async def _shutdown(self, nc: Client | None) -> None:
        """Stop the local stack and write what was gathered (also when interrupted); a start that failed
        before any rollout was submitted leaves no new run folder behind."""
        feed, summary = self.feed, self.summary
        summary.wall_s = time.time() - self.t_start
        if feed is not None:
            await self._last_results(feed, nc)
            summary.results = feed.done.only(lambda d: (d.task_index, d.rollout_index) in self.plan.expected)
        if self.rows_out is not None:
            self.rows_out.close()
        if nc is not None:
            await nc.close()
        self.roots.abandon()
        if self.stack is not None:
            self.stack.stop()
        tracing.end_run()
        if not summary.wrote_folder:
            return
        if not self.submitting:
            self.folder.discard_if_new()
            return
        if feed is not None:
            self.folder.rewrite_rows(lambda task, repeat: (task, repeat) in self.plan.expected)
            self._finish_metadata()
            summary.profile = _write_profile(self.folder.path)
        self.folder.unlock()

    async def _last_results(self, feed: ResultsFeed, nc: Client | None) -> None:
        """Stop reading Results; with a local stack, once its workers have drained, so that what they
        published while stopping (a newer attempt of a rollout, say) is in the run folder as in the stream."""
        try:
            if self.stack is not None and self.submitting and nc is not None and nc.is_connected:
                await asyncio.to_thread(self.stack.stop_workers)
                await feed.settle()
            await feed.stop()
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning("the run's last Results could not all be read: %s", exc)

    def _write_metadata(self, nats_url: str) -> None:
        """metadata.json at the start of the run (a replay keeps the run's own, updating its end only)."""
        if self.replay is not None and self.folder.metadata():
            return
        cfg, local = self.cfg, self.stack is not None
        self.folder.update_metadata(
            run_id=self.plan.run_id,
            config=msgspec.to_builtins(cfg),
            identity=msgspec.to_builtins(self.plan.identity),
            input=str(Path(cfg.input).resolve()),
            tasks=len(self.plan.tasks),
            repeats=cfg.repeats,
            expected=len(self.plan.expected),
            broker="embedded" if local else nats_url,
            nats_url=nats_url,
            model=self.plan.model,
            model_endpoints=self.plan.model.get("endpoints", []),
            simulated_policy=self.plan.model.get("simulated_policy"),
            traces=_traces_note(self.folder.path, local),
            started_at=self.t_start,
            versions=versions(),
            argv=sys.argv,
        )

    def _finish_metadata(self) -> None:
        s = self.summary
        self.folder.update_metadata(
            finished_at=time.time(),
            wall_s=round(s.wall_s, 3),
            results=len(s.results),
            submitted_this_time=s.submitted,
            failures=dict(s.failures),
            mean_reward=s.mean_reward,
        )


def _traces_note(run_dir: Path, local: bool) -> str:
    if tracing.otlp_configured():
        return "sent over OTLP (OTEL_EXPORTER_OTLP_ENDPOINT)"
    if not tracing.enabled():
        return "off"
    if local:
        return "traces.jsonl: collect, every worker and the simulated policy"
    return "traces.jsonl: collect's own spans only (the workers of a shared broker export theirs)"


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
