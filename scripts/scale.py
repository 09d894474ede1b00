"""One `gymbus collect` of many rollouts, with every process's memory followed as the run grows.

    .venv/bin/python scripts/scale.py --rollouts 1000000
    .venv/bin/python scripts/scale.py --rollouts 100000 --sync 20ms --keep /tmp/scale

The run is the quickstart's (simple_agent and math, the simulated policy answering at once) with
as many repeats of its 24 tasks as make ``--rollouts``, on an embedded broker, traces sampled at
``--trace-ratio`` (every rollout's trace is ~12 KB of traces.jsonl). Each process's resident memory
is read every second; the table gives it at each tenth of the run (counted from rollouts.jsonl,
which collect appends as Results arrive) and its peak (the kernel's high-water mark), so a process
whose memory grows with the run shows it. Exits 1 if the run did not end with one row per rollout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "functions" / "math" / "data" / "example.jsonl"


def role(p: psutil.Process) -> str:
    argv = p.cmdline()
    if argv and argv[0].endswith("nats-server"):
        return "broker"
    if "runtime" in argv and argv.index("runtime") + 1 < len(argv):
        rest = argv[argv.index("runtime") + 1 :]
        return " ".join(rest[:2]) if rest[0] == "worker" else rest[0]
    return "collect" if "collect" in argv else " ".join(argv[:2])


def hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024
    return 0.0


class Watch(threading.Thread):
    """Samples the RSS of every process under ``root`` each second, and its peak."""

    def __init__(self, root: int, rows: Path, expected: int) -> None:
        super().__init__(daemon=True)
        self.root, self.rows, self.expected = psutil.Process(root), rows, expected
        self.peaks: dict[str, float] = {}
        self.at: list[tuple[int, dict[str, float]]] = []
        self.highest: dict[str, tuple[float, int, float]] = {}
        """Per process, its highest sampled RSS, the rollouts done then and the seconds since the start:
        where in the run a peak came (VmHWM also counts what lasted less than a sample)."""
        self.started = time.time()
        self.stop = threading.Event()
        self._counted, self._offset = 0, 0

    def done(self) -> int:
        if self.rows.exists():
            with self.rows.open("rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
            self._counted += chunk.count(b"\n")
            self._offset += len(chunk)
        return self._counted

    def run(self) -> None:
        tenth = 1
        while not self.stop.wait(1.0):
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            now: dict[str, float] = {}
            for p in procs:
                try:
                    name = f"{role(p)} [{p.pid}]"
                    now[name] = p.memory_info().rss / 2**20
                    self.peaks[name] = max(self.peaks.get(name, 0.0), hwm_mb(p.pid))
                except (psutil.Error, OSError):
                    continue
            done = self.done()
            for name, mb in now.items():
                if mb > self.highest.get(name, (0.0, 0, 0.0))[0]:
                    self.highest[name] = (mb, done, time.time() - self.started)
            while tenth <= 10 and done >= self.expected * tenth / 10:
                self.at.append((done, now))
                tenth += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=1_000_000)
    ap.add_argument("--sync", default="always", help="the broker's fsync policy (GYMBUS_BROKER_SYNC): always | 20ms")
    ap.add_argument("--trace-ratio", type=float, default=0.001, help="share of rollouts traced")
    ap.add_argument("--concurrency", type=int, default=256, help="messages each worker handles at once")
    ap.add_argument("--keep", type=Path, help="run folder parent to keep (default: a temporary one, deleted)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    tasks = sum(1 for line in TASKS.read_text().splitlines() if line.strip())
    repeats = math.ceil(args.rollouts / tasks)
    expected = tasks * repeats
    base = args.keep or Path(tempfile.mkdtemp(prefix="gymbus-scale-"))
    base.mkdir(parents=True, exist_ok=True)
    config = base / "scale.yaml"
    config.write_text(
        json.dumps(
            {
                "input": str(TASKS),
                "repeats": repeats,
                "agent": "simple_agent",
                "env": "math",
                "model": {"name": "policy", "simulate": {"accuracy": 0.75, "latency_ms": 0, "seed": 0}},
                "limits": {"max_steps": 4, "rollout_timeout_s": 600, "step_timeout_s": 120},
                "workers": {"replicas": 1, "concurrency": args.concurrency},
                "output": str(base / "runs"),
            }
        )
    )
    run_id = f"scale-{expected}"
    env = {
        **os.environ,
        "GYMBUS_BROKER_SYNC": args.sync,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": str(args.trace_ratio),
    }
    gymbus = Path(sys.executable).with_name("gymbus")
    print(f"{expected:,} rollouts ({tasks} tasks x {repeats}), broker sync {args.sync}, traces {args.trace_ratio:g}")
    t0 = time.time()
    proc = subprocess.Popen([str(gymbus), "collect", str(config), "-q", "--run-id", run_id], env=env, cwd=ROOT)
    watch = Watch(proc.pid, base / "runs" / run_id / "rollouts.jsonl", expected)
    watch.start()
    code = proc.wait()
    watch.stop.set()
    watch.join()
    wall = time.time() - t0
    run_dir = base / "runs" / run_id
    rows = sum(1 for _ in (run_dir / "rollouts.jsonl").open("rb")) if (run_dir / "rollouts.jsonl").exists() else 0
    meta = json.loads((run_dir / "metadata.json").read_text()) if (run_dir / "metadata.json").exists() else {}
    names = sorted(watch.peaks, key=lambda n: -watch.peaks[n])
    rate = rows / wall
    print(f"\nexit {code} · {rows:,} rows for {expected:,} rollouts · wall {wall:,.0f} s · {rate:,.0f} rollouts/s")
    print(f"failures {meta.get('failures')} · mean reward {meta.get('mean_reward')}")
    for f in ("rollouts.jsonl", "traces.jsonl", "report.html"):
        if (run_dir / f).exists():
            print(f"{f}: {(run_dir / f).stat().st_size / 2**20:,.0f} MB")
    print("\nresident MB per process at each tenth of the run, and its peak (VmHWM)")
    print(f"{'process':<28}" + "".join(f"{done:>9,}" for done, _ in watch.at) + f"{'peak':>9}")
    for n in names:
        print(f"{n:<28}" + "".join(f"{now.get(n, 0):>9.0f}" for _, now in watch.at) + f"{watch.peaks[n]:>9.0f}")
    print("\nhighest resident MB sampled (each second), with the rollouts done and the time then")
    for n in names:
        mb, done, at = watch.highest.get(n, (0.0, 0, 0.0))
        print(f"{n:<28}{mb:>9.0f} MB at {done:>9,} rollouts, {at:>7,.0f} s")
    if args.json:
        figures = {"expected": expected, "rows": rows, "exit": code, "wall_s": wall, "sync": args.sync}
        figures |= {"peak_rss_mb": watch.peaks, "rss_mb_at": watch.at, "failures": meta.get("failures")}
        figures |= {"highest_sampled": watch.highest}
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    if not args.keep:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    return 0 if code == 0 and rows == expected else 1


if __name__ == "__main__":
    sys.exit(main())
