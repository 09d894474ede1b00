"""Verifier work off the loop: bounded in time, a timeout is a verifier_error, and it stalls nothing else."""

from __future__ import annotations

import asyncio
import time

import pytest

from runtime.offload import OffLoop, VerifierTimeout
from runtime.testing import Harness
from tests import offload_env


async def test_a_call_past_its_bound_is_a_verifier_timeout_and_the_loop_keeps_running() -> None:
    pool = OffLoop(workers=1)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        assert await pool.run(offload_env.burn, 0.01, timeout_s=30) == 1.0  # warm: the pool is spawned
        ticks, t0 = 0, time.monotonic()
        with pytest.raises(VerifierTimeout, match=r"burn ran past its bound of 0.5 s \(timeout\)"):
            await pool.run(offload_env.burn, 30.0, timeout_s=0.5)
        assert time.monotonic() - t0 < 5
        assert ticks >= 20  # the loop ran all along (a burn on the loop would have frozen it)
        assert await pool.run(offload_env.burn, 0.01, timeout_s=30) == 1.0  # a fresh pool after the kill
    finally:
        ticker.cancel()
        pool.close()


async def test_a_slow_verifier_fails_alone_as_verifier_error(harness: Harness, tmp_path: object) -> None:
    await harness.simulate(env=offload_env.ENVIRONMENT)
    await harness.worker("simple_agent")
    await harness.worker(offload_env.ENVIRONMENT)
    row = {"responses_create_params": {"input": [{"role": "user", "content": "go"}]}}
    await harness.submit(harness.start({**row, "busy_s": 30.0}, run_id="off", task_index=0, env="offload"))
    for i in range(1, 6):
        await harness.submit(harness.start({**row, "busy_s": 0.01}, run_id="off", task_index=i, env="offload"))
    results = {r.task_index: r for r in await harness.results("off", 6, timeout=60)}
    assert results[0].failure_kind == "verifier_error" and "timeout" in (results[0].failure_reason or "")
    why = [(r.failure_kind, r.failure_reason) for r in results.values()]
    assert all(results[i].reward == 1.0 for i in range(1, 6)), why
