"""The model client's per-call bookkeeping, in process: which replica a call goes to (`Pool.pick`,
pinned against the rule as first written, before it hashed each weight once) and how a call holds
it (`Pool.lease`)."""

from __future__ import annotations

import asyncio
import random

import pytest

from runtime.model.endpoints import Endpoint, ModelEntry, Pool, rendezvous


def reference_pick(pool: Pool, session: str, avoid: set[str]) -> Endpoint:
    """Pool.pick as documented: sticky (rendezvous), least in flight past the slack, healthy first."""
    eps = list(pool.by_url.values())
    fresh = [e for e in eps if e.url not in avoid] or eps
    live = [e for e in fresh if e.healthy] or sorted(fresh, key=lambda e: e.down_since or 0.0)[:1]
    preferred = max(live, key=lambda e: rendezvous(session, e.url))
    least = min(live, key=lambda e: (e.in_flight, -rendezvous(session, e.url)))
    return preferred if preferred.in_flight <= least.in_flight + pool.slack else least


def pool_of(n: int, max_in_flight: int = 256) -> Pool:
    pool = Pool("policy")
    pool.update(ModelEntry(endpoints=[f"http://10.0.0.{i}:8000/v1" for i in range(n)], max_in_flight=max_in_flight))
    return pool


@pytest.mark.parametrize("n", [1, 2, 3, 5])
async def test_pick_chooses_as_the_rule_says(n: int) -> None:
    rng = random.Random(n)
    pool = pool_of(n)
    urls = list(pool.by_url)
    for i in range(2000):
        for ep in pool.by_url.values():
            ep.in_flight = rng.randint(0, 6)
            ep.down_since = rng.choice([None, None, None, rng.random()])
        avoid = set(rng.sample(urls, rng.randint(0, n)))
        session = f"run.{i % 50}.{i}"
        assert pool.pick(session, avoid) is reference_pick(pool, session, avoid)


async def test_a_lease_counts_the_call_in_flight_until_it_ends_even_when_it_fails() -> None:
    pool = pool_of(1)
    [ep] = pool.by_url.values()
    async with pool.lease("run.0.0") as held:
        assert held is ep and ep.in_flight == 1 and ep.slots.locked() is False
    assert ep.in_flight == 0
    with pytest.raises(RuntimeError):
        async with pool.lease("run.0.0"):
            assert ep.in_flight == 1
            raise RuntimeError("the attempt failed")
    assert ep.in_flight == 0 and not ep.slots.locked()


async def test_a_lease_waits_for_a_slot_counted_in_flight_and_gives_it_back_when_cancelled() -> None:
    pool = pool_of(1, max_in_flight=1)
    [ep] = pool.by_url.values()
    entered = asyncio.Event()

    async def hold(release: asyncio.Event) -> None:
        async with pool.lease("run.0.0"):
            entered.set()
            await release.wait()

    release = asyncio.Event()
    holder = asyncio.create_task(hold(release))
    await entered.wait()
    waiter = asyncio.create_task(hold(asyncio.Event()))
    await asyncio.sleep(0)
    assert ep.in_flight == 2 and ep.slots.locked()  # the waiter counts, so others are steered away
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert ep.in_flight == 1
    release.set()
    await holder
    assert ep.in_flight == 0 and not ep.slots.locked()
