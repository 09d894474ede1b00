"""The fault scenarios, shared by the CI tests (small N) and scripts/faults.py (full size).

Each scenario runs real parts only: a nats-server on a temp store, workers as subprocesses (so a
SIGKILL is a real crash) or as tasks, the simulated policy over HTTP (behind tests/faulty_policy.py
where the model must fail), and ends with the auditor (runtime/engine/audit.py) reading every stream.
Every loop is bounded in count and time; traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.js.errors import NotFoundError

from broker import inspect, topology
from broker.schemas import Start, session_id
from runtime.engine import audit
from runtime.engine.deadletters import letters, replay
from runtime.model.client import register
from runtime.runs.stack import Process, gymbus_command
from runtime.testing import Harness, start_message, task_rows

ROOT = Path(__file__).resolve().parents[1]
MATH_TASKS = ROOT / "functions" / "math" / "data" / "example.jsonl"
FAULTS_ENV = "tests.fault_env:ENVIRONMENT"

LIMITS = topology.Limits(ack_wait_s=2.0, max_deliver=5)
"""Short ack wait so redeliveries come quickly in a test."""
CHAOS_LIMITS = topology.Limits(ack_wait_s=2.0, max_deliver=20)
"""Kills every second or two: a message may be in flight on several killed workers in a row."""
NETWORK_LIMITS = topology.Limits(ack_wait_s=2.0, max_deliver=10)
"""A 5 s blackhole redelivers every message in flight (heartbeats cannot pass): budget for it."""
POISON_LIMITS = topology.Limits(ack_wait_s=2.0, max_deliver=3)
SLOW_LIMITS = topology.Limits(ack_wait_s=2.0, max_deliver=5)
BACKLOG_LIMITS = topology.Limits(ack_wait_s=5.0, max_deliver=5, max_ack_pending=64)


@dataclass
class Figures:
    """What a scenario prints: the auditor's counts plus the faults it injected."""

    scenario: str
    submitted: int
    results: int = 0
    duplicates: int = 0
    lost: int = 0
    unexpected: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    dead: int = 0
    wall_s: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @classmethod
    def of(cls, scenario: str, a: audit.Audit, wall_s: float, **notes: Any) -> Figures:
        return cls(
            scenario,
            submitted=len(a.expected),
            results=a.stored,
            duplicates=a.duplicates,
            lost=len(a.lost),
            unexpected=len(a.unexpected),
            failures=dict(a.failures),
            dead=sum(a.dead.values()),
            wall_s=wall_s,
            notes=notes,
            problems=a.problems(),
        )


# ---- workers as processes ------------------------------------------------------------------------


class Fleet:
    """Worker processes: ``replicas`` per function, SIGKILLed and restarted at will."""

    def __init__(
        self, url: str, functions: dict[str, int], log_dir: Path, env: dict[str, str], concurrency: int = 64
    ) -> None:
        self.url, self.functions, self.log_dir, self.env = url, functions, log_dir, env
        self.concurrency = concurrency
        self.procs: dict[str, Process] = {}
        self.kills = 0
        self.restarts = 0
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(self) -> Fleet:
        for ref, replicas in self.functions.items():
            for i in range(replicas):
                self._spawn(ref, i)
        return self

    def _spawn(self, ref: str, i: int) -> None:
        name = f"{ref.split(':')[0].rsplit('.', 1)[-1]}-{i}"
        cmd = gymbus_command("worker", ref, "--nats", self.url, "--concurrency", str(self.concurrency))
        self.procs[name] = Process(name, cmd, self.log_dir, self.env)
        self.procs[name].ref = ref  # type: ignore[attr-defined]

    def kill_random(self, rng: random.Random) -> str:
        name = rng.choice(sorted(self.procs))
        self.procs[name].proc.send_signal(signal.SIGKILL)
        self.procs[name].proc.wait()
        self.kills += 1
        return name

    def revive(self) -> None:
        """Restart every worker that is not running (killed, or crashed by its own message)."""
        for name, proc in list(self.procs.items()):
            if not proc.alive():
                proc._log.close()
                self._spawn(proc.ref, int(name.rsplit("-", 1)[1]))  # type: ignore[attr-defined]
                self.restarts += 1

    def set_env(self, **env: str) -> None:
        self.env = {**self.env, **env}

    def restart_all(self) -> None:
        for proc in self.procs.values():
            proc.stop()
        self.procs.clear()
        self.start()

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.signal(signal.SIGTERM)
        for proc in self.procs.values():
            proc.stop()
        self.procs.clear()


def worker_env(limits: topology.Limits, **extra: str) -> dict[str, str]:
    return {
        "GYMBUS_ACK_WAIT_S": str(limits.ack_wait_s),
        "GYMBUS_MAX_DELIVER": str(limits.max_deliver),
        "GYMBUS_MAX_ACK_PENDING": str(limits.max_ack_pending),
        "GYMBUS_JANITOR_INTERVAL_S": "1",
        **extra,
    }


# ---- tasks -----------------------------------------------------------------------------------------


def starts(
    run_id: str,
    n: int,
    *,
    agent: str = "simple_agent",
    env: str = "math",
    faults: dict[int, str] | None = None,
    **options: Any,
) -> list[Start]:
    """``n`` rollouts over the math examples (task i uses row i mod 24, repeat i div 24), with tools."""
    rows = task_rows(MATH_TASKS)
    from functions.math.env import ENVIRONMENT

    tools = ENVIRONMENT.tool_specs()
    out = []
    for i in range(n):
        row = rows[i % len(rows)]
        meta = {k: v for k, v in row.items() if k != "responses_create_params"}
        if faults and i in faults:
            meta["fault"] = faults[i]
        params = {**row["responses_create_params"], "tools": tools}
        row = {**meta, "responses_create_params": params}
        start = start_message(row, agent=agent, env=env, run_id=run_id, **options)
        out.append(_with(start, task_index=i, rollout_index=i // len(rows)))
    return out


def _with(start: Start, **changes: Any) -> Start:
    import msgspec

    return msgspec.structs.replace(start, **changes)


def sids(batch: list[Start]) -> set[str]:
    return {session_id(s.run_id, s.task_index, s.rollout_index) for s in batch}


async def submit(h: Harness, batch: list[Start], twice: bool = False) -> None:
    """Publish every Start (``twice``: again under another message id, as a careless client would)."""
    sem = asyncio.Semaphore(128)

    async def one(s: Start) -> None:
        async with sem:
            await h.submit(s)
            if twice:
                await h.submit(s, msg_id=f"again:{s.run_id}.{s.task_index}.{s.rollout_index}")

    await asyncio.gather(*(one(s) for s in batch))


async def count(h: Harness, run_id: str) -> int:
    try:
        return await inspect.count(h.js, topology.RESULTS_STREAM, topology.result_subject(run_id))
    except Exception:  # broker away for a moment
        return -1


async def wait_results(h: Harness, run_id: str, n: int, timeout: float, tick: Any = None) -> int:
    """Poll until the run has ``n`` Results (or ``timeout``); ``tick()`` is awaited between polls."""
    deadline = time.monotonic() + timeout
    got = 0
    while time.monotonic() < deadline:
        got = max(got, await count(h, run_id))
        if got >= n:
            break
        if tick is not None:
            await tick()
        await asyncio.sleep(0.2)
    return got


async def settle_and_audit(
    h: Harness, run_id: str, expected: set[str], expected_dead: set[str] | None = None, timeout: float = 60.0
) -> audit.Audit:
    """Audit once nothing is in flight (`Harness.settled`: every message acknowledged, terminated or
    dead-lettered), so every Result that will ever come, a late duplicate included, is counted. If the
    work never settles, the audit is taken anyway: it names the work left behind."""
    try:
        await h.settled(timeout)
    except TimeoutError as exc:
        print(f"{run_id}: {exc}")
    return await audit.audit(h.js, run_id, expected, expected_dead)


async def rewards(h: Harness, run_id: str) -> dict[tuple[int, int], float | None]:
    a = await audit.audit(h.js, run_id, set())
    return {(r.task_index, r.rollout_index): r.reward for r in a.latest.values()}


# ---- scenarios -------------------------------------------------------------------------------------


async def chaos(
    h: Harness,
    n: int,
    log_dir: Path,
    *,
    replicas: int = 2,
    kill_every: float = 2.0,
    seed: int = 0,
    latency_ms: float = 300,
    concurrency: int = 16,
) -> Figures:
    """R1 + duplicate window: workers SIGKILLed at random and restarted, every Start published twice.

    A fault-free reference run of the same rollouts comes first; the chaos run's rewards must equal it."""
    await h.simulate(MATH_TASKS, accuracy=0.6, latency_ms=latency_ms, seed=seed)
    functions = {"simple_agent": replicas, "math": replicas}
    fleet = Fleet(h.broker.url, functions, log_dir, worker_env(h.limits), concurrency).start()
    rng = random.Random(seed)
    try:
        ref = starts("reference", n)
        await submit(h, ref)
        await wait_results(h, "reference", n, timeout=60 + n / 5)
        batch = starts("chaos", n)
        t0 = time.monotonic()
        await submit(h, batch, twice=True)
        next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * kill_every

        async def tick() -> None:
            nonlocal next_kill
            fleet.revive()
            if time.monotonic() >= next_kill:
                fleet.kill_random(rng)
                fleet.revive()
                next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * kill_every

        await wait_results(h, "chaos", n, timeout=120 + n / 4, tick=tick)
        wall = time.monotonic() - t0
        a = await settle_and_audit(h, "chaos", sids(batch), set())
    finally:
        fleet.stop()
    want, got = await rewards(h, "reference"), await rewards(h, "chaos")
    mismatched = sum(1 for k, v in want.items() if got.get(k) != v)
    f = Figures.of("chaos (R1, duplicate Starts)", a, wall, kills=fleet.kills, restarts=fleet.restarts)
    f.notes["reward_mismatches_vs_fault_free"] = mismatched
    f.notes["starts_published"] = 2 * n
    if mismatched:
        f.problems.append(f"{mismatched} reward(s) differ from the fault-free run")
    if fleet.kills == 0:
        f.problems.append("no worker was killed")
    return f


async def broker_restart(h: Harness, n: int, log_dir: Path, *, at: tuple[float, ...] = (0.3, 0.7)) -> Figures:
    """R2: the broker SIGKILLed mid-run and started again on the same store (each time at ``at`` of N)."""
    await h.simulate(MATH_TASKS, accuracy=0.6, latency_ms=30)
    fleet = Fleet(h.broker.url, {"simple_agent": 1, "math": 1}, log_dir, worker_env(h.limits)).start()
    batch = starts("restart", n)
    t0 = time.monotonic()
    restarts = 0
    try:
        await submit(h, batch)
        for frac in at:
            await wait_results(h, "restart", int(n * frac), timeout=120 + n / 4)
            await asyncio.to_thread(h.broker.kill)
            await asyncio.sleep(1.0)  # the fault: the broker stays down a second (not a wait for anything)
            await asyncio.to_thread(h.broker.start)
            restarts += 1
        await wait_results(h, "restart", n, timeout=120 + n / 4, tick=_async(fleet.revive))
        wall = time.monotonic() - t0
        a = await settle_and_audit(h, "restart", sids(batch), set())
    finally:
        fleet.stop()
    return Figures.of("broker kill -9 + restart (R2)", a, wall, broker_restarts=restarts)


def _async(fn: Any) -> Any:
    async def call() -> None:
        fn()

    return call


async def model_faults(
    h: Harness,
    n: int,
    *,
    fail: float = 0.2,
    hang: float = 0.05,
    step_timeout_s: float = 3.0,
    retry: list[str] | None = None,
) -> Figures:
    """The policy fails 20% of calls with 500 and hangs on 5%: the run completes; failures are only
    model_error (retry budget spent) or timeout (a hang past the step deadline). ``retry`` is the
    run's retry policy (e.g. adding model_error and timeout redelivers those steps)."""
    from tests.faulty_policy import FaultyPolicy

    upstream = await h.simulate(MATH_TASKS, accuracy=0.6)
    proxy = FaultyPolicy(upstream, fail=fail, hang=hang, hang_s=max(10.0, 3 * step_timeout_s), seed=1)
    await register(h.js, "policy", [await proxy.start()])
    await h.worker("simple_agent")
    await h.worker("math")
    batch = starts("model", n, step_timeout_s=step_timeout_s, retry=retry)
    t0 = time.monotonic()
    try:
        await submit(h, batch)
        await wait_results(h, "model", n, timeout=120 + n / 2)
        wall = time.monotonic() - t0
        a = await settle_and_audit(h, "model", sids(batch), set())
    finally:
        await h.stop_workers()
        await proxy.stop()
    name = "model endpoint 20% 500 / 5% hang" + (", retry policy +model_error +timeout" if retry else "")
    f = Figures.of(name, a, wall, **{f"calls_{k}": v for k, v in proxy.counts.items()})
    other = set(a.failures) - {"model_error", "timeout"}
    if other:
        f.problems.append(f"unexpected failure kinds {sorted(other)}")
    return f


async def poison(h: Harness, n: int, log_dir: Path) -> Figures:
    """A poison verifier (one task) and a task that kills its worker on every delivery: those two are
    dead-lettered (verifier_error, worker_lost), the rest succeed; after fixing the verifier, replay
    completes the poisoned rollout."""
    await h.simulate(MATH_TASKS, accuracy=1.0)
    fleet = Fleet(
        h.broker.url, {"simple_agent": 1, FAULTS_ENV: 2}, log_dir, worker_env(h.limits, GYMBUS_FAULTS_FIXED="0")
    ).start()
    batch = starts("poison", n, env="faults", faults={0: "verifier"})
    crash = starts("poison", n + 1, env="faults", faults={n: "crash"})[n:]
    poisoned, crashed = sids(batch[:1]), sids(crash)
    t0 = time.monotonic()
    try:
        await submit(h, batch)
        await wait_results(h, "poison", n, timeout=120 + n / 4, tick=_async(fleet.revive))
        await submit(h, crash)  # alone, so its crashes take no other rollout's deliveries
        await wait_results(h, "poison", n + 1, timeout=120, tick=_async(fleet.revive))
        wall = time.monotonic() - t0
        a = await settle_and_audit(h, "poison", sids(batch) | crashed, poisoned | crashed)
        f = Figures.of("poison verifier + crashing tool", a, wall, worker_restarts=fleet.restarts)
        if a.failures != {"verifier_error": 1, "worker_lost": 1}:
            f.problems.append(f"expected one verifier_error and one worker_lost, got {a.failures}")
        fleet.set_env(GYMBUS_FAULTS_FIXED="1")  # "fix the verifier": redeploy the workers
        fleet.restart_all()
        chosen = [x for x in await letters(h.js, run_id="poison") if x.letter.session_id in poisoned]
        done = await replay(h.js, chosen)
        await wait_results(h, "poison", n + 2, timeout=60)
        after = await settle_and_audit(h, "poison", sids(batch) | crashed, poisoned | crashed)
        [fixed] = [after.latest[s] for s in poisoned]
        f.notes["replayed"] = [d.note for d in done]
        f.notes["replayed_reward"] = fixed.reward
        if fixed.reward != 1.0 or fixed.attempt != 1:
            f.problems.append(f"replay did not complete the poisoned rollout: {fixed}")
    finally:
        fleet.stop()
    return f


async def pause(h: Harness, n: int, log_dir: Path) -> Figures:
    """R3: the broker SIGSTOPped for 2.5 x the ack wait mid-run, then SIGCONT."""
    await h.simulate(MATH_TASKS, accuracy=0.6, latency_ms=30)
    fleet = Fleet(h.broker.url, {"simple_agent": 1, "math": 1}, log_dir, worker_env(h.limits)).start()
    batch = starts("pause", n)
    t0 = time.monotonic()
    try:
        await submit(h, batch)
        await wait_results(h, "pause", n // 3, timeout=120)
        h.broker.pause()
        await asyncio.sleep(2.5 * h.limits.ack_wait_s)  # the fault's length: past the ack wait (not a wait)
        h.broker.resume()
        await wait_results(h, "pause", n, timeout=120 + n / 4)
        wall = time.monotonic() - t0
        alive = sum(p.alive() for p in fleet.procs.values())
        a = await settle_and_audit(h, "pause", sids(batch), set())
    finally:
        fleet.stop()
    f = Figures.of("broker paused past the ack wait (R3)", a, wall, paused_s=2.5 * h.limits.ack_wait_s)
    f.notes["workers_alive_after"] = f"{alive}/2"
    if alive != 2:
        f.problems.append("a worker exited during the pause")
    return f


async def network(h: Harness, n: int) -> Figures:
    """R4: workers reach the broker through a TCP fault proxy: blackhole, reset every connection, delay."""
    from tests.faultproxy import FaultProxy

    await h.simulate(MATH_TASKS, accuracy=0.6, latency_ms=30)
    proxy = await FaultProxy(h.broker.port).start()
    agent = await h.worker("simple_agent", nats_url=proxy.url)
    env = await h.worker("math", nats_url=proxy.url)
    batch = starts("network", n)
    t0 = time.monotonic()
    try:
        await submit(h, batch)
        await wait_results(h, "network", n // 4, timeout=120)
        proxy.set("blackhole")
        await asyncio.sleep(2.5 * h.limits.ack_wait_s)  # the fault's length: past the ack wait (not a wait)
        proxy.set("pass")
        proxy.reset()
        await wait_results(h, "network", n // 2, timeout=120)
        proxy.set("delay", 0.05)
        through_delay = await wait_results(h, "network", 3 * n // 4, timeout=120)  # rollouts complete through it
        proxy.set("pass")
        await wait_results(h, "network", n, timeout=120 + n / 4)
        wall = time.monotonic() - t0
        a = await settle_and_audit(h, "network", sids(batch), set())
    finally:
        await h.stop_workers()
        await proxy.stop()
    f = Figures.of("network blackhole / reset / delay (R4)", a, wall, proxy_connections=proxy.connections)
    f.notes["redelivered"] = agent.stats["redelivered"] + env.stats["redelivered"]
    if proxy.connections <= 2:
        f.problems.append("the clients never reconnected after the reset")
    if through_delay < 3 * n // 4:
        f.problems.append(f"only {through_delay} of {3 * n // 4} results while the network was slow")
    return f


async def slow_handler(h: Harness, n: int, *, heartbeat: bool, replicas: int = 1) -> Figures:
    """R5/R6: a tool 3x slower than the ack wait. With in-progress acks: no redelivery. Without:
    redelivered to another replica while the first still runs (the stale-ack race), yet one Result."""
    import os

    os.environ["GYMBUS_FAULTS_SLOW_S"] = str(3 * h.limits.ack_wait_s)
    await h.simulate(MATH_TASKS, accuracy=1.0)
    await h.worker("simple_agent")
    envs = [await h.worker(FAULTS_ENV, heartbeat=heartbeat) for _ in range(replicas)]
    run = f"slow-{'beat' if heartbeat else 'nobeat'}"
    batch = starts(run, n, env="faults", faults=dict.fromkeys(range(n), "slow"))
    beats = [0]

    async def seen(m: Any) -> None:  # every ack a client sends goes to a $JS.ACK subject
        beats[0] += m.data == b"+WPI"

    assert h.nc is not None
    watch = await h.nc.subscribe("$JS.ACK.>", cb=seen)
    t0 = time.monotonic()
    try:
        await submit(h, batch)
        await wait_results(h, run, n, timeout=60 + 10 * n * h.limits.ack_wait_s)
        wall = time.monotonic() - t0
        a = await settle_and_audit(h, run, sids(batch), set())
    finally:
        await h.stop_workers()
        await watch.unsubscribe()
    redelivered = sum(w.stats["redelivered"] for w in envs)
    name = "slow handler, in-progress acks (R5)" if heartbeat else "slow handler, no in-progress acks (R5/R6)"
    return Figures.of(name, a, wall, redelivered=redelivered, in_progress_acks=beats[0])


async def backlog(h: Harness, n: int, log_dir: Path) -> Figures:
    """R13: ``n`` tiny rollouts queued at once for one worker whose consumer allows few unacked messages."""
    await h.simulate(MATH_TASKS, accuracy=0.6)
    fleet = Fleet(h.broker.url, {"simple_agent": 1, "math": 1}, log_dir, worker_env(h.limits)).start()
    batch = [
        _with(s, responses_create_params={"input": s.responses_create_params["input"]}) for s in starts("backlog", n)
    ]
    most_pending = 0

    async def sample() -> None:
        nonlocal most_pending
        for role, name in (("agent", "simple_agent"), ("verify", "math")):
            try:
                info = await h.js.consumer_info(topology.WORK_STREAM, topology.durable(role, name))  # type: ignore[arg-type]
            except NotFoundError:
                continue
            most_pending = max(most_pending, info.num_ack_pending)

    t0 = time.monotonic()
    try:
        await submit(h, batch)
        await wait_results(h, "backlog", n, timeout=120 + n / 20, tick=sample)
        wall = time.monotonic() - t0
        rss = {name: _rss_mib(p.proc.pid) for name, p in fleet.procs.items()}
        a = await settle_and_audit(h, "backlog", sids(batch), set())
    finally:
        fleet.stop()
    slow = sum("slow consumer" in p.read_text().lower() for p in log_dir.glob("*.log"))
    f = Figures.of(f"{n} queued at once, max_ack_pending {h.limits.max_ack_pending} (R13)", a, wall)
    f.notes.update(most_unacked=most_pending, worker_rss_mib=rss, slow_consumer_logs=slow)
    if most_pending > h.limits.max_ack_pending:
        f.problems.append(f"{most_pending} unacked > max_ack_pending {h.limits.max_ack_pending}")
    return f


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


def failures_line(f: Figures) -> str:
    return ", ".join(f"{k}: {v}" for k, v in Counter(f.failures).most_common()) or "0"
