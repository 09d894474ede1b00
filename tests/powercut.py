"""Power cuts under a `gymbus collect` run, shared by tests/test_powercut.py (CI size) and
scripts/powercut.py (full size, with figures).

One trial: `gymbus collect` runs with its run folder (the embedded broker's store included) on a
lazy mount (tests/lazyfs: file data reaches the disk only when fsynced), under a broker sync
policy. At a random moment the power goes: every process of the run is frozen (SIGSTOP), the
lazy mount dies with every unsynced write, and every process is SIGKILLed. The mount comes back
with what the disk kept and the same command runs again (resume), maybe to be cut again; a last
resume runs to the end. Then:

- the auditor reads every stream of the run: each submitted rollout has exactly one Result (its
  latest attempt), none twice for one attempt, none unexpected, no failed Result with a reward;
- each rollout ended once, as a reward or a typed failure, and every reward was given to a whole
  transcript (each tool call answered, a final reply) that the verifier scores the same again;
- the run folder (``rollouts.jsonl``, ``metadata.json``) agrees with the results stream;
- the Results `collect` had shown before a cut are counted against what the stream holds after
  it: under ``sync: always`` none may be lost or changed.

The checks and the figures are in tests/powercut_checks.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from broker.connect import connect
from broker.schemas import session_id
from broker.server import EmbeddedServer
from runtime.engine import audit
from runtime.runs.stack import gymbus_command
from tests.lazyfs import LazyMount
from tests.powercut_checks import (
    MATH_TASKS,
    Cut,
    Outcome,
    Trial,
    folder_agrees,
    read_rows,
    read_streams,
    summary,
    whole,
)

__all__ = ["TASKS", "PowerCuts", "Trial", "summary"]

ROOT = Path(__file__).resolve().parents[1]
TASKS = sum(1 for line in MATH_TASKS.read_text().splitlines() if line.strip())


@dataclass
class Moment:
    """When to cut: once ``rows`` more Results were shown by the collect, or ``at_s`` after it started."""

    rows: int | None = None
    at_s: float | None = None

    def due(self, elapsed: float, tail: Tail) -> bool:
        if self.at_s is not None:
            return elapsed >= self.at_s
        return self.rows is not None and tail.count() >= self.rows


class Tail:
    """Counts the rows appended to a file since it was made (reading only what is new)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.rows = 0

    def count(self) -> int:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                new = fh.read()
        except FileNotFoundError:
            return self.rows
        self.offset += len(new)
        self.rows += new.count(b"\n")
        return self.rows


def write_config(path: Path, output: Path, repeats: int, rollout_timeout_s: float, latency_ms: float) -> Path:
    path.write_text(
        json.dumps(
            {
                "input": str(MATH_TASKS),
                "repeats": repeats,
                "agent": "simple_agent",
                "env": "math",
                "model": {"name": "policy", "simulate": {"accuracy": 0.75, "latency_ms": latency_ms, "seed": 0}},
                "limits": {"max_steps": 4, "rollout_timeout_s": rollout_timeout_s, "step_timeout_s": 10},
                "workers": {"replicas": 1, "concurrency": 64},
                "output": str(output),
            }
        )
    )
    return path


def child_env(sync: str) -> dict[str, str]:
    return {
        **os.environ,
        "GYMBUS_BROKER_SYNC": sync,
        "GYMBUS_ACK_WAIT_S": "5",
        "GYMBUS_JANITOR_INTERVAL_S": "1",
        "GYMBUS_JANITOR_GRACE_S": "1",
        "OTEL_SDK_DISABLED": "true",  # no traces.jsonl: spans are not what this test is about
        "PYTHONPATH": str(ROOT),
    }


def freeze(proc: psutil.Process) -> list[psutil.Process]:
    """SIGSTOP ``proc`` and every descendant, parents first (a stopped parent forks no more)."""
    stopped: list[psutil.Process] = []
    todo = [proc]
    while todo:
        for p in todo:
            try:
                p.suspend()
                stopped.append(p)
            except psutil.NoSuchProcess:
                pass
        pids = {p.pid for p in stopped}
        todo = []
        for p in list(stopped):
            try:
                todo += [c for c in p.children(recursive=True) if c.pid not in pids]
            except psutil.NoSuchProcess:
                pass
    return stopped


def kill_all(procs: list[psutil.Process]) -> None:
    for p in reversed(procs):  # children first: a SIGTERM on parent death must find none alive
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=15)
    if alive:
        raise RuntimeError(f"processes survived SIGKILL: {[p.pid for p in alive]}")


def shown_rows(path: Path) -> dict[tuple[str, int], Outcome]:
    """What collect had written to rollouts.jsonl, read through the mount (unsynced pages too)."""
    return {
        (row["session_id"], row.get("attempt", 0)): (row.get("reward"), row.get("failure_kind"))
        for row in read_rows(path)
    }


class PowerCuts:
    """Runs trials in ``base`` (a lazy mount on base/disk at base/runs, the run folders under it)."""

    def __init__(
        self, base: Path, *, sync: str, repeats: int, rollout_timeout_s: float = 60.0, latency_ms: float = 100.0
    ) -> None:
        self.base = base
        self.sync = sync
        self.repeats = repeats
        self.rollout_timeout_s = rollout_timeout_s
        self.mount = LazyMount(base / "disk", base / "runs", log=base / "lazyfs.log")
        self.config = write_config(base / "run.json", self.mount.mountpoint, repeats, rollout_timeout_s, latency_ms)
        self.logs = base / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> PowerCuts:
        self.mount.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.mount.close()

    def calibrate(self, run_id: str = "calibration") -> tuple[float, float, float]:
        """Run once with no cut: seconds from collect's start to its first Result shown, to its last,
        and to its exit (so cuts can be drawn over a run's life)."""
        cmd = gymbus_command("collect", str(self.config), "--run-id", run_id, "--quiet")
        rows = self.mount.mountpoint / run_id / "rollouts.jsonl"
        want = TASKS * self.repeats
        first = last = None
        with open(self.logs / f"{run_id}.collect.log", "wb") as log:
            t0 = time.monotonic()
            proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(self.sync), stdout=log, stderr=subprocess.STDOUT)
            while proc.poll() is None:
                shown = len(shown_rows(rows)) if last is None else want
                if first is None and shown:
                    first = time.monotonic() - t0
                if last is None and shown >= want:
                    last = time.monotonic() - t0
                time.sleep(0.05)
        if proc.returncode != 0:
            raise RuntimeError(f"the calibration run failed; see {log.name}")
        end = time.monotonic() - t0
        return (first or end, last or end, end)

    def window(self) -> tuple[float, float]:
        """Moments to cut at: from just before the first Result of a run to its last (calibrated)."""
        first, last, _ = self.calibrate()
        return (0.8 * first, last)

    def trial(
        self,
        run_id: str,
        rng: random.Random,
        *,
        cuts: int,
        window: tuple[float, float] | None = None,
        by_progress: float = 0.5,
    ) -> Trial:
        """Run ``run_id`` with up to ``cuts`` power cuts, then resume it to the end and check it.

        Each cut's moment is drawn either (with probability ``by_progress``, always without a
        ``window``) as a number of Results the collect shows before it (1 to what is left), or as a
        time in ``window`` (seconds after its collect started: start-up, submission, the run, the
        writing of the run folder)."""
        t = Trial(self.sync, run_id, rollouts=TASKS * self.repeats)
        t0 = time.monotonic()
        while len(t.cuts) < cuts:
            left = max(1, t.rollouts - sum(len(c.shown) for c in t.cuts))
            if window is None or rng.random() < by_progress:
                moment = Moment(rows=rng.randint(1, left))
            else:
                moment = Moment(at_s=rng.uniform(*window))
            if self._collect(t, moment):
                break
        if not self._collect(t, None):
            t.problems.append("the last resume did not finish")
        t.wall_s = time.monotonic() - t0
        asyncio.run(self.check(t))
        return t

    def _collect(self, t: Trial, moment: Moment | None) -> bool:
        """One `gymbus collect --run-id`, cut at ``moment``; True if it finished first."""
        t.collects += 1
        log = self.logs / f"{t.run_id}.collect-{t.collects}.log"
        cmd = gymbus_command("collect", str(self.config), "--run-id", t.run_id, "--quiet")
        rows = Tail(self.mount.mountpoint / t.run_id / "rollouts.jsonl")
        started = time.monotonic()
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(self.sync), stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            elapsed = time.monotonic() - started
            if moment is not None and moment.due(elapsed, rows):
                self.cut(t, proc, elapsed)
                return False
            if moment is None and elapsed > 4 * self.rollout_timeout_s + 120:
                kill_all(freeze(psutil.Process(proc.pid)))
                return False
            time.sleep(0.02)
        if proc.returncode != 0:
            t.problems.append(f"collect #{t.collects} exited with {proc.returncode}; see {log}")
        elif moment is not None:
            t.finished_uncut += 1
        return True

    def cut(self, t: Trial, proc: subprocess.Popen[bytes], at_s: float) -> None:
        frozen = freeze(psutil.Process(proc.pid))
        run_dir = self.mount.mountpoint / t.run_id
        shown = shown_rows(run_dir / "rollouts.jsonl")
        lost = self.mount.report()["unsynced"]
        prefix = f"/{t.run_id}/broker/"
        store = {path.removeprefix(prefix): n for path, n in lost.items() if path.startswith(prefix)}
        self.mount.cut()
        kill_all(frozen)
        proc.wait()
        cut = Cut(round(at_s, 2), shown, store, sum(lost.values()) - sum(store.values()))
        cut.unloadable = sum(
            1 for p in (self.mount.backing / t.run_id / "broker").rglob("meta.inf") if not p.stat().st_size
        )
        t.cuts.append(cut)
        self.mount.start()

    async def check(self, t: Trial) -> None:
        """Audit the streams, then hold the run folder and the Results collect showed against them."""
        run_dir = self.mount.mountpoint / t.run_id
        expected = {session_id(t.run_id, i, k) for i in range(TASKS) for k in range(self.repeats)}
        broker = EmbeddedServer(run_dir / "broker", log_file=self.logs / f"{t.run_id}.audit-broker.log")
        await asyncio.to_thread(broker.start)
        try:
            nc = await connect(broker.url, name="powercut-audit")
            try:
                a = await audit.audit(nc.jetstream(), t.run_id, expected)
                stored, left = await read_streams(nc.jetstream(), t.run_id)
            finally:
                await nc.close()
        finally:
            await asyncio.to_thread(broker.stop)
        t.left = a.left
        t.problems += [p for p in a.problems() if "left in the work stream" not in p]
        t.problems += [
            f"a work message of {sid} is left, and that rollout has no Result" for sid in left - set(a.latest)
        ]
        for r in a.latest.values():
            t.outcomes[r.failure_kind or "reward"] += 1
            t.attempts[r.attempt] += 1
            t.problems += await whole(r)
        t.problems += folder_agrees(run_dir, a.latest)
        for cut in t.cuts:
            for key, outcome in cut.shown.items():
                if key not in stored:
                    t.shown_lost += 1
                elif stored[key] != outcome:
                    t.shown_changed += 1
        if t.sync == "always" and (t.shown_lost or t.shown_changed):
            t.problems.append(
                f"sync always, yet {t.shown_lost} Result(s) shown before a cut were lost and {t.shown_changed} changed"
            )
