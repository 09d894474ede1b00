"""``gymbus submit``: publish a run's rollouts to a running broker, without waiting for their Results.

It is the first half of ``gymbus collect --nats URL``, made of the same pieces: the run's identity
is recorded (or checked, on a resubmission), rollouts that already have a Result or are still in
flight are not published again, and every Start carries its deterministic message id, so
submitting twice publishes nothing twice. Gather the Results later with ``gymbus collect CONFIG
--nats URL --run-id RUN``, or read ``gym.result.<run>`` from any NATS client.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from broker import topology
from broker.connect import connect
from broker.manifests import Manifest
from runtime.errors import InputError
from runtime.runs import identity as identities
from runtime.runs import rollouts
from runtime.runs.config import RunConfig
from runtime.runs.feed import stored_results
from runtime.runs.keys import Key, KeySet
from runtime.runs.models import register_model, urls_of, writer
from runtime.runs.plan import check_served, prepare
from runtime.runs.tasks import run_defaults


@dataclass(frozen=True)
class Submission:
    """What one ``gymbus submit`` did."""

    run_id: str
    expected: int
    """Rollouts in the run: tasks x repeats."""
    finished: int
    """Rollouts that already had a Result (not published again)."""
    submitted: int
    """Starts published now (the rest are finished, or still in flight and nudged)."""


async def submit(
    cfg: RunConfig, run_id: str | None = None, *, extend: bool = False, check_model: bool = True
) -> Submission:
    """Publish the run's missing rollouts to the broker at ``cfg.nats``; returns the counts."""
    if not cfg.nats:
        raise InputError("no broker: give --nats URL or set GYMBUS_NATS_URL (submit never starts one)")
    plan = await prepare(cfg, run_id, check_model=check_model)
    expected = plan.expected
    nc = await connect(cfg.nats, name=f"gymbus-submit-{plan.run_id}")
    try:
        js = nc.jetstream()
        await topology.ensure(js, topology.Limits.from_env())
        await check_served(js, cfg, plan.functions)
        if urls := urls_of(cfg.model.base_url):
            await register_model(js, cfg.model, urls, writer("submit"))
        manifest = Manifest(
            run_id=plan.run_id,
            expected=len(expected),
            tasks=len(plan.tasks),
            repeats=cfg.repeats,
            pass_threshold=cfg.profile.pass_threshold,
            identity=plan.identity,
            defaults=run_defaults(cfg),
        )
        fresh = await identities.open_manifest(js, manifest, extend=extend, folder=None)
        results = await stored_results(js, plan.run_id)
        finished = KeySet(expected, (k for r in results if (k := (r.task_index, r.rollout_index)) in expected))
        missing = (k for k in expected if k not in finished)

        async def finished_since(keys: list[Key]) -> set[Key]:
            done = {(r.task_index, r.rollout_index) for r in await stored_results(js, plan.run_id)}
            return {k for k in keys if k in done}

        attempts = await rollouts.plan(js, expected, missing, plan.run_id, fresh, time.time(), finished_since)
        submitted = await rollouts.publish_starts(
            js, cfg, plan.run_id, {t.index: t for t in plan.tasks}, attempts
        )
    finally:
        await nc.close()
    return Submission(plan.run_id, len(expected), len(finished), submitted)
