"""``gymbus submit``: publish a run's rollouts to a running broker, without waiting for their Results.

It is the first half of ``gymbus collect --nats URL``, made of the same pieces: rollouts that
already have a Result, or are still in flight, are not published again, and every Start carries
its deterministic message id, so submitting twice publishes nothing twice. Gather the Results
later with ``gymbus collect CONFIG --nats URL --run-id RUN``, or read ``gym.result.<run>`` from any
NATS client.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from nats.js import JetStreamContext

from broker import topology
from broker.connect import connect
from broker.schemas import Result
from runtime.model.client import register
from runtime.runs.collect import (
    InputError,
    ResultsFeed,
    _check_functions,
    _load_env,
    _manifest,
    _plan_resubmission,
    _submit,
    by_index_of,
    new_run_id,
    read_tasks,
    topology_name_ok,
)
from runtime.runs.config import RunConfig
from runtime.sdk import Environment

log = logging.getLogger("gymbus.submit")


@dataclass(frozen=True)
class Submission:
    """What one ``gymbus submit`` did."""

    run_id: str
    expected: int
    """Rollouts in the run: tasks x repeats."""
    finished: int
    """Rollouts that already had a Result (not published again)."""
    submitted: int
    """Starts published now (the rest are finished or still in flight)."""


async def submit(cfg: RunConfig, run_id: str | None = None) -> Submission:
    """Publish the run's missing rollouts to the broker at ``cfg.nats``; returns the counts."""
    run_id = run_id or new_run_id()
    if not topology_name_ok(run_id):
        raise InputError(f"run id {run_id!r} must be 1-64 letters, digits, '-' or '_'")
    if not cfg.nats:
        raise InputError("no broker: give --nats URL or set GYMBUS_NATS_URL (submit never starts one)")
    tasks = read_tasks(cfg.input, cfg.limit)
    expected = {(t.index, k) for t in tasks for k in range(cfg.repeats)}
    env = _environment(cfg)
    nc = await connect(cfg.nats, name=f"gymbus-submit-{run_id}")
    try:
        js = nc.jetstream()
        await topology.ensure(js, topology.Limits.from_env())
        await _check_functions(js, cfg)
        if cfg.model.base_url:
            await register(js, cfg.model.name, [u.strip() for u in cfg.model.base_url.split(",")], cfg.model.api)
        fresh = await _manifest(await js.key_value(topology.RUNS), run_id, len(expected)) is None
        finished = expected & {(r.task_index, r.rollout_index) for r in await _results(js, run_id)}
        attempts = await _plan_resubmission(js, sorted(expected - finished), run_id, fresh, time.time())
        submitted = await _submit(js, cfg, run_id, by_index_of(tasks), attempts, env)
    finally:
        await nc.close()
    return Submission(run_id, len(expected), len(finished), submitted)


def _environment(cfg: RunConfig) -> Environment | None:
    """The environment, for its tool specs; without it tasks keep only their own tools."""
    try:
        return _load_env(cfg)
    except (LookupError, ImportError, InputError) as exc:
        log.warning("environment %r is not importable here (%s); tasks keep their own tools", cfg.env, exc)
        return None


async def _results(js: JetStreamContext, run_id: str) -> list[Result]:
    """The run's Results stored so far (replayed, not waited for)."""
    feed = ResultsFeed(js, run_id)
    await feed.start()
    try:
        async with asyncio.timeout(60):
            await feed.caught_up.wait()
    finally:
        await feed.stop()
    return list(feed.results.values())
