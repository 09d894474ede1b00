"""The trainer client: submit a batch (tasks x group size), get Samples back, tell gymbus the policy version.

    client = await TrainerClient.connect("nats://host:4222", agent="simple_agent", env="math")
    batch = await client.submit(rows, group_size=8)           # paced: never more than K versions stale
    async for sample in batch.as_completed(): ...             # as they finish, failures included
    groups = await batch.groups()                             # in submission order, per task, policy applied
    ... train on groups[i].samples / groups[i].advantages() ...
    await client.set_policy_version(step + 1)                 # or (..., endpoints=[new weights' URLs])

Each batch is a run of its own (``<prefix>-<step>``) on the same broker, workers and models bucket as
any run. The policy version lives in the model's ``models`` entry (`ModelEntry.policy_version`): every
model call records the version of the entry it used, so a Sample knows which versions generated it.

Off-policy control: the batch for training step ``i`` is admitted only once the current version is at
least ``i - max_staleness``; versions only advance when the trainer has the batches it trains on, so no
sample is generated more than ``max_staleness`` versions behind the step that trains on it (0 makes the
loop synchronous). Stale work waits at admission; nothing is generated and then discarded.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError

from broker import names, topology
from broker.connect import connect
from broker.publish import publish
from broker.schemas import Options, Result, Start, session_id
from runtime.model.endpoints import ModelEntry, entry_decoder, model_key
from runtime.runs.feed import ResultsFeed
from runtime.sdk import Environment, Function
from runtime.trainer.profiles import TaskProfiles
from runtime.trainer.samples import Group, Sample, task_key

log = logging.getLogger("gymbus.trainer")

OnFailure = Literal["retry", "mask", "drop"]


@dataclass(frozen=True)
class GroupPolicy:
    """What a failed rollout does to its group (a failure is never a reward, so it cannot be trained on)."""

    on_failure: OnFailure = "retry"
    """``retry``: run it again as a new attempt; ``mask``: keep the group, train on none of it; ``drop``: leave
    the group out of the batch."""
    max_retries: int = 2
    """Attempts added per failed rollout before ``then`` applies (``retry`` only)."""
    then: Literal["mask", "drop"] = "mask"
    """What a group whose retries all failed gets."""


class TrainerClient:
    """Submits batches to gymbus and reads their Samples; one per trainer process."""

    def __init__(
        self,
        js: JetStreamContext,
        *,
        agent: str,
        env: str,
        model: str = "policy",
        options: Options | None = None,
        sampling: dict[str, Any] | None = None,
        max_staleness: int = 0,
        group_policy: GroupPolicy | None = None,
        pass_threshold: float = 1.0,
        run_prefix: str | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        self.js = js
        self.agent, self.env, self.model = names.check("agent", agent), names.check("env", env), model
        self.options = options or Options()
        self.sampling = dict(sampling or {})
        self.max_staleness = max_staleness
        self.group_policy = group_policy or GroupPolicy()
        self.pass_threshold = pass_threshold
        self.run_prefix = names.check("run prefix", run_prefix or f"train-{secrets.token_hex(3)}")
        self.tools = tools if tools is not None else _env_tools(env)
        self.profiles = TaskProfiles(js)
        self.version = 0
        self._next_step = 0
        self._changed = asyncio.Condition()
        self._closers: list[Any] = []
        self.harness: Any = None
        """The embedded stack (`embedded` only): broker, workers, and the simulated policy as ``harness.sim``."""

    # ---- opening ---------------------------------------------------------------------------------

    @classmethod
    async def connect(cls, nats_url: str, **settings: Any) -> TrainerClient:
        """A client of a running deployment (workers and model endpoints already serving)."""
        nc: Client = await connect(nats_url, name="gymbus-trainer")
        await topology.ensure(nc.jetstream(), topology.Limits.from_env())
        client = cls(nc.jetstream(), **settings)
        client._closers.append(nc.close)
        await client._read_version()
        return client

    @classmethod
    async def embedded(
        cls,
        *,
        agent: str | Function = "simple_agent",
        env: str | Function = "math",
        answer_key: Sequence[str | Path] = (),
        simulate: dict[str, Any] | None = None,
        model_url: str | None = None,
        model_settings: dict[str, Any] | None = None,
        concurrency: int = 64,
        **settings: Any,
    ) -> TrainerClient:
        """A client with its own stack in this process: an embedded broker, the agent's and environment's
        workers, and either the SIMULATED policy (answering from ``answer_key`` task files) or the model
        at ``model_url``."""
        from runtime.model.endpoints import register
        from runtime.testing import Harness

        store = tempfile.TemporaryDirectory(prefix="gymbus-trainer-", ignore_cleanup_errors=True)
        h = await Harness(Path(store.name) / "broker").__aenter__()
        try:
            if model_url:
                await register(h.js, settings.get("model", "policy"), [model_url], **(model_settings or {}))
            else:
                await h.simulate(*answer_key, model=settings.get("model", "policy"), **(simulate or {}))
            await h.worker(agent, concurrency=concurrency)
            await h.worker(env, concurrency=concurrency)
        except BaseException:
            await h.__aexit__(None, None, None)
            store.cleanup()
            raise
        agent_name = agent if isinstance(agent, str) else agent.name
        env_name = env if isinstance(env, str) else env.name
        if not isinstance(env, str) and "tools" not in settings:
            settings["tools"] = env.tool_specs() if isinstance(env, Environment) else []
        client = cls(h.js, agent=agent_name, env=env_name, **settings)
        client.harness = h
        client._closers += [lambda: h.__aexit__(None, None, None), _sync(store.cleanup)]
        await client._read_version()
        return client

    async def close(self) -> None:
        for close in reversed(self._closers):
            await close()
        self._closers.clear()

    async def __aenter__(self) -> TrainerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- policy versions -------------------------------------------------------------------------

    async def set_policy_version(self, version: int, endpoints: list[str] | None = None) -> None:
        """The policy is now ``version`` (served by ``endpoints`` when given: new weights' replicas).
        Model calls from now on record it; batches waiting for it are admitted."""
        entry = await self._entry()
        settings = msgspec.structs.asdict(entry)
        settings.update(policy_version=version, written_by="gymbus trainer", written_at=time.time())
        if endpoints is not None:
            settings["endpoints"] = [u.rstrip("/") for u in endpoints]
        kv = await self.js.key_value(topology.MODELS)
        await kv.put(model_key(self.model), msgspec.json.encode(msgspec.convert(settings, ModelEntry)))
        async with self._changed:
            self.version = version
            self._changed.notify_all()

    async def _entry(self) -> ModelEntry:
        kv = await self.js.key_value(topology.MODELS)
        try:
            return entry_decoder.decode((await kv.get(model_key(self.model))).value or b"{}")
        except KeyNotFoundError:
            return ModelEntry()

    async def _read_version(self) -> None:
        self.version = (await self._entry()).policy_version

    # ---- batches ---------------------------------------------------------------------------------

    async def submit(self, rows: Sequence[dict[str, Any]], group_size: int = 1, *, step: int | None = None) -> Batch:
        """Submit ``rows`` (NeMo Gym-shaped tasks) x ``group_size`` for training step ``step`` (default:
        the next one); waits while that would be more than ``max_staleness`` versions off-policy."""
        if group_size < 1 or not rows:
            raise ValueError(f"a batch needs tasks and group_size >= 1 (got {len(rows)} tasks x {group_size})")
        step = self._next_step if step is None else step
        self._next_step = max(self._next_step, step + 1)
        async with self._changed:
            if self.version < step - self.max_staleness:
                need = step - self.max_staleness
                log.info("batch of step %d waits for policy version %d (now %d)", step, need, self.version)
            await self._changed.wait_for(lambda: self.version >= step - self.max_staleness)
        batch = Batch(self, f"{self.run_prefix}-{step}", step, list(rows), group_size, admitted_at=self.version)
        await batch.start()
        return batch

    def start_message(self, batch: Batch, task: int, rollout: int, attempt: int = 0) -> Start:
        row = batch.rows[task]
        params = {**self.sampling, **row["responses_create_params"]}
        if self.tools and not params.get("tools"):
            params["tools"] = self.tools
        return Start(
            run_id=batch.run_id,
            task_index=task,
            rollout_index=rollout,
            attempt=attempt,
            agent=self.agent,
            env=self.env,
            model=self.model,
            responses_create_params=params,
            meta={k: v for k, v in row.items() if k != "responses_create_params"},
            options=self.options,
        )


@dataclass
class Batch:
    """One submitted batch: its Samples as they complete, in order, or grouped by task."""

    client: TrainerClient
    run_id: str
    step: int
    rows: list[dict[str, Any]]
    group_size: int
    admitted_at: int = 0
    """The policy version current when the batch was admitted."""
    counts: Counter[str] = field(default_factory=Counter)
    """``failed:<kind>`` per failed attempt, ``retried``, ``masked_groups``, ``dropped_groups``."""
    _feed: ResultsFeed | None = None
    _arrived: asyncio.Queue[Result] = field(default_factory=asyncio.Queue)
    _recorded: set[tuple[str, int]] = field(default_factory=set)

    @property
    def size(self) -> int:
        return len(self.rows) * self.group_size

    async def start(self) -> None:
        self._feed = ResultsFeed(self.client.js, self.run_id)
        self._feed.on_result = lambda r, _new, _latest: self._arrived.put_nowait(r)
        await self._feed.start()
        for task in range(len(self.rows)):
            for rollout in range(self.group_size):
                await self._publish(task, rollout, 0)

    async def _publish(self, task: int, rollout: int, attempt: int) -> None:
        start = self.client.start_message(self, task, rollout, attempt)
        sid = session_id(self.run_id, task, rollout)
        await publish(self.client.js, topology.agent_subject(start.agent), start, f"{sid}:start:{attempt}")

    def sample(self, r: Result) -> Sample:
        return Sample(r.task_index, r.rollout_index, self.step, r, task=task_key(self.rows[r.task_index]))

    async def as_completed(self) -> AsyncIterator[Sample]:
        """Each rollout's Result as it arrives (a retried rollout comes again with its new attempt)."""
        seen = 0
        while seen < self.size or not self._arrived.empty():
            r = await self._arrived.get()
            seen += r.attempt == 0
            sample = self.sample(r)
            await self._record(sample)
            yield sample

    async def results(self, timeout: float | None = None) -> list[Sample]:
        """Every rollout's latest Result, in submission order (task, then member of the group)."""
        feed = self._feed
        assert feed is not None, "not started"
        async with asyncio.timeout(timeout):
            while len(feed.results) < self.size:
                feed.changed.clear()
                if len(feed.results) < self.size:
                    await feed.changed.wait()
        order = [(t, k) for t in range(len(self.rows)) for k in range(self.group_size)]
        samples = [self.sample(feed.results[self._sid(t, k)]) for t, k in order]
        for s in samples:
            await self._record(s)
        return samples

    async def groups(self, timeout: float | None = None) -> list[Group]:
        """The batch per task, in submission order, with the client's `GroupPolicy` applied to failures."""
        policy = self.client.group_policy
        samples = await self.results(timeout)
        for s in samples:
            if s.failed:
                self.counts[f"failed:{s.failure_kind}"] += 1
        if policy.on_failure == "retry":
            samples = await self._retry(samples, policy.max_retries, timeout)
        out = []
        for task in range(len(self.rows)):
            group = Group(task, samples[task * self.group_size : (task + 1) * self.group_size])
            if any(s.failed for s in group.samples):
                if (policy.then if policy.on_failure == "retry" else policy.on_failure) == "drop":
                    self.counts["dropped_groups"] += 1
                    continue
                group.masked = True
                for s in group.samples:
                    s.mask = False
                self.counts["masked_groups"] += 1
            out.append(group)
        return out

    async def _retry(self, samples: list[Sample], rounds: int, timeout: float | None) -> list[Sample]:
        feed = self._feed
        assert feed is not None
        for _ in range(rounds):
            failed = [s for s in samples if s.failed]
            if not failed:
                break
            for s in failed:
                self.counts["retried"] += 1
                await self._publish(s.task_index, s.rollout_index, s.attempt + 1)
            async with asyncio.timeout(timeout):
                for s in failed:
                    sid = self._sid(s.task_index, s.rollout_index)
                    while feed.results[sid].attempt <= s.attempt:
                        feed.changed.clear()
                        if feed.results[sid].attempt <= s.attempt:
                            await feed.changed.wait()
                    if feed.results[sid].failed:
                        self.counts[f"failed:{feed.results[sid].failure_kind}"] += 1
            samples = await self.results(timeout)
        return samples

    async def _record(self, s: Sample) -> None:
        """Add a scored sample to its task's profile (once per attempt)."""
        key = (s.result.session_id, s.attempt)
        if key in self._recorded or s.reward is None:
            self._recorded.add(key)
            return
        self._recorded.add(key)
        version = s.policy_versions[-1] if s.policy_versions else self.client.version
        await self.client.profiles.record(s.task, version, s.reward >= self.client.pass_threshold)

    def _sid(self, task: int, rollout: int) -> str:
        return session_id(self.run_id, task, rollout)

    async def close(self) -> None:
        if self._feed is not None:
            await self._feed.stop()


def _env_tools(env: str) -> list[dict[str, Any]]:
    """The environment's tool specs when it can be loaded here (offered to the model when a task lists
    none, as `gymbus collect` does); none otherwise."""
    from runtime.sdk import load

    try:
        fn = load(env)
    except (LookupError, ImportError):
        return []
    return fn.tool_specs() if isinstance(fn, Environment) else []


def _sync(fn: Any) -> Any:
    async def call() -> None:
        fn()

    return call
