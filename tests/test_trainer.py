"""The trainer client on an embedded stack (real broker, real workers, the simulated policy over HTTP):
samples as completed, in order, grouped; version-stamped; the staleness bound under a slow and a fast
policy version; each group failure policy; per-task profiles; the Ray actor; gymbus reverify."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from broker.schemas import Options
from conftest import MATH_TASKS
from functions.math.env import ENVIRONMENT as MATH
from runtime.cli import app
from runtime.errors import VerifierError
from runtime.model.serving import InThread
from runtime.model.simulator import SimConfig, Simulator, load_answer_key
from runtime.runs.collect import collect
from runtime.runs.config import load_config
from runtime.sdk import Environment, Rollout, Task
from runtime.testing import task_rows
from runtime.trainer.client import GroupPolicy, TrainerClient
from runtime.trainer.ray_actor import GymbusActor

ROWS = task_rows(MATH_TASKS)


async def embedded(**settings: Any) -> TrainerClient:
    settings.setdefault("simulate", {"accuracy": 0.5})
    return await TrainerClient.embedded(answer_key=[MATH_TASKS], **settings)


async def test_samples_as_completed_in_order_grouped_and_version_stamped() -> None:
    """4 tasks x 4: every sample arrives once as it completes; results() is in submission order;
    groups() is per task with GRPO advantages; each model call is stamped with the policy version
    that served it, and a version change mid-rollout shows as a sample spanning versions."""
    client = await embedded(options=Options(return_token_ids=True), max_staleness=2)
    try:
        batch = await client.submit(ROWS[:4], group_size=4)
        arrived = [(s.task_index, s.rollout_index) async for s in batch.as_completed()]
        assert sorted(arrived) == [(t, k) for t in range(4) for k in range(4)]
        samples = await batch.results()
        assert [(s.task_index, s.rollout_index) for s in samples] == sorted(arrived)
        assert all(s.policy_versions == [0, 0] and not s.spans_versions and s.staleness == 0 for s in samples)
        ids, mask, lps = samples[0].tokens()
        generated = sum(len(t.generation_token_ids) for t in samples[0].turns)
        assert len(ids) == len(mask) == len(lps) and sum(mask) == generated
        groups = await batch.groups()
        assert [g.task_index for g in groups] == [0, 1, 2, 3] and all(len(g.samples) == 4 for g in groups)
        for g in groups:
            adv = g.advantages()
            assert abs(sum(adv)) < 1e-6 and (len(set(g.rewards)) > 1) == any(adv)

        client.harness.sim.config.latency_ms = 300  # the first turns run while the version changes
        calls = client.harness.sim.calls
        spanning = await client.submit(ROWS[4:8], group_size=2)
        while client.harness.sim.calls < calls + 8:
            await asyncio.sleep(0.01)
        await client.set_policy_version(1)
        later = await spanning.results()
        assert all(s.policy_versions == [0, 1] and s.spans_versions for s in later), [s.policy_versions for s in later]
        client.harness.sim.config.latency_ms = 0
        after = await (await client.submit(ROWS[:2], group_size=2)).results()
        assert all(s.policy_versions == [1, 1] for s in after)
    finally:
        await client.close()


@pytest.mark.parametrize("k", [0, 1])
async def test_staleness_bound_holds_with_a_slow_and_a_fast_version(k: int) -> None:
    """A loop that trains on batch i, then publishes version i+1, alternately served by a slow (200 ms a
    call) and a fast replica; the next batches are submitted as early as the client admits them. No
    sample is generated more than K versions behind the step that trains on it, admission waits for the
    version (paced), and every sample comes back (nothing discarded)."""
    key = load_answer_key([MATH_TASKS])
    slow, fast = (Simulator(key, SimConfig(accuracy=1.0, latency_ms=ms)) for ms in (200, 5))
    with InThread(slow.app()) as s, InThread(fast.app()) as f:
        urls = [f"{s.url}/v1", f"{f.url}/v1"]
        client = await TrainerClient.embedded(model_url=urls[0], max_staleness=k)
        try:
            admitted: dict[int, tuple[int, float]] = {}
            batches: asyncio.Queue[Any] = asyncio.Queue()

            async def produce() -> None:
                for step in range(4):
                    batch = await client.submit(ROWS[step * 2 : step * 2 + 2], group_size=2, step=step)
                    admitted[step] = (client.version, time.monotonic())
                    await batches.put(batch)

            producer = asyncio.create_task(produce())
            published: dict[int, float] = {0: time.monotonic()}
            for step in range(4):
                batch = await batches.get()
                groups = await batch.groups(timeout=60)
                samples = [x for g in groups for x in g.samples]
                assert len(samples) == 4 and all(x.reward == 1.0 for x in samples)
                assert all(x.staleness <= k for x in samples), [x.policy_versions for x in samples]
                await client.set_policy_version(step + 1, endpoints=[urls[(step + 1) % 2]])
                published[step + 1] = time.monotonic()
            await producer
        finally:
            await client.close()
    for step, (version, at) in admitted.items():
        assert version >= step - k  # paced: admitted only once the version was close enough
        if step - k > 0:
            assert at >= published[step - k]
    assert slow.calls > 0 and fast.calls > 0


def flaky_env(seen: set[tuple[int, int]]) -> Environment:
    """math's calculator; a task marked ``flaky`` fails verification the first time each of its rollouts
    is verified (a fresh attempt then passes)."""

    async def verify(task: Task[Any], rollout: Rollout) -> float:
        if task.meta.get("flaky") and (task.index, task.rollout_index) not in seen:
            seen.add((task.index, task.rollout_index))
            raise VerifierError("flaky on first sight")
        return 1.0 if "\\boxed" in rollout.text else 0.0

    return Environment(name="flaky", verify=verify, tools=MATH.tools)


@pytest.mark.parametrize(
    ("policy", "kept", "masked", "counts"),
    [
        (GroupPolicy("retry", max_retries=2, then="mask"), [0, 1, 2], [2], {"retried": 6, "masked_groups": 1}),
        (GroupPolicy("retry", max_retries=1, then="drop"), [0, 1], [], {"retried": 4, "dropped_groups": 1}),
        (GroupPolicy("mask"), [0, 1, 2], [1, 2], {"masked_groups": 2}),
        (GroupPolicy("drop"), [0], [], {"dropped_groups": 2}),
    ],
)
async def test_group_failure_policies(policy: GroupPolicy, kept: list[int], masked: list[int], counts: dict) -> None:
    """Task 1 fails once per rollout (a retry fixes it), task 2 always (invalid input): each policy keeps,
    masks or drops groups as it says, and counts what it did; failures are never rewards."""
    rows = [ROWS[0], {**ROWS[1], "flaky": True}, {**ROWS[2], "responses_create_params": {"input": 5}}]
    client = await embedded(env=flaky_env(set()), options=Options(retry=[]), group_policy=policy)
    try:
        batch = await client.submit(rows, group_size=2)
        groups = await batch.groups(timeout=60)
    finally:
        await client.close()
    assert [g.task_index for g in groups] == kept
    assert [g.task_index for g in groups if g.masked] == masked
    for g in groups:
        assert g.masked == any(s.failed for s in g.samples)
        assert all(s.reward is None for s in g.samples if s.failed)
        if g.masked:
            assert g.advantages() == [0.0, 0.0] and not any(s.mask for s in g.samples)
    assert {k: v for k, v in batch.counts.items() if not k.startswith("failed:")} == counts
    assert batch.counts["failed:invalid_input"] >= 2 and batch.counts["failed:verifier_error"] == 2


async def test_task_profiles_filter_tasks_always_or_never_solved() -> None:
    """Pass rates per task per policy version are kept across batches (and runs); a curriculum keeps
    the tasks that are neither always nor never solved."""
    rows = [ROWS[0], ROWS[1], {**ROWS[2], "responses_create_params": {"input": "unknown to the key"}}]
    client = await embedded(simulate={"accuracy": 1.0})
    try:
        for step in range(2):  # synchronous (max_staleness 0): each step waits for the version before it
            await (await client.submit(rows, group_size=2)).results()
            await client.set_policy_version(step + 1)
        from runtime.trainer.samples import task_key

        keys = [task_key(r) for r in rows]
        profile = await client.profiles.get(keys[0])
        assert profile.by_version == {0: (2, 2), 1: (2, 2)} and profile.pass_rate(1) == 1.0
        assert (await client.profiles.get(keys[2])).pass_rate() == 0.0
        assert await client.profiles.keep(keys, min_scored=4) == [False, False, False]
        assert await client.profiles.keep(keys, min_scored=5) == [True, True, True]
    finally:
        await client.close()


def test_ray_actor_runs_rollouts_in_order() -> None:
    """GymbusActor as a Ray actor (local cluster): run_rollouts returns one dict per rollout, in order,
    with token ids, mask, logprobs and reward."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        embedded_cfg = {"answer_key": [str(MATH_TASKS)], "simulate": {"accuracy": 1.0}}
        actor = ray.remote(GymbusActor).remote(embedded=embedded_cfg, options=Options(return_token_ids=True))
        out = ray.get(actor.run_rollouts.remote(ROWS[:3], 2), timeout=180)
        ray.get(actor.shutdown.remote(), timeout=60)
    finally:
        ray.shutdown()
    assert [(o["task_index"], o["rollout_index"]) for o in out] == [(t, k) for t in range(3) for k in range(2)]
    for o in out:
        assert o["reward"] == 1.0 and o["policy_versions"] == [0, 0] and not o["token_exact"]
        assert len(o["token_ids"]) == len(o["loss_mask"]) == len(o["generation_logprobs"]) and sum(o["loss_mask"])


def test_reverify_rescores_a_run_into_a_new_subject(tmp_path: Path) -> None:
    """A collected run, re-scored by another verifier without generating: the new Results are on
    gym.result.<run>-rv, the diff is printed and kept next to the run."""
    config = tmp_path / "run.yaml"
    config.write_text(
        json.dumps(
            {
                "input": str(MATH_TASKS),
                "limit": 4,
                "repeats": 2,
                "agent": "simple_agent",
                "env": "math",
                "output": str(tmp_path),
                "model": {"simulate": {"accuracy": 0.5}},
            }
        )
    )
    summary = asyncio.run(collect(load_config(config), run_id="rv", quiet=True))
    before = [r.reward for r in summary.results.values()]
    runner = CliRunner()
    result = runner.invoke(app, ["reverify", str(tmp_path / "rv"), "--env", "tests.test_trainer:LENIENT"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in (tmp_path / "rv" / "reverify-rv-rv.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(r["reward"] == 1.0 and r["run_id"] == "rv-rv" for r in rows)
    changed = sum(1 for b in before if b != 1.0)
    assert f"changed     {changed}" in result.output and "-> 1.000" in result.output


async def _lenient(task: Task[Any], rollout: Rollout) -> float:
    return 1.0 if "\\boxed" in rollout.text else 0.0


LENIENT = Environment(name="math", verify=_lenient, tools=MATH.tools)
"""A verifier that takes any boxed answer (for reverify)."""
