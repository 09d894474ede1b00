"""Run the fault suite at full size and print its figures.

    .venv/bin/python scripts/faults.py                 # every scenario, full size (about 15 minutes)
    .venv/bin/python scripts/faults.py --only chaos    # one scenario
    .venv/bin/python scripts/faults.py --scale 0.1     # everything at a tenth of the size

Real parts only: a nats-server per scenario on a temporary store, workers as subprocesses or tasks,
the simulated policy over HTTP (behind a fault-injecting proxy where the model must fail). Each
scenario ends with the auditor reading every stream. Every loop is bounded in count and time, and
all traffic stays on 127.0.0.1. The exit status is 1 if any scenario found a problem.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker.topology import Limits  # noqa: E402
from runtime.engine.retry import DEFAULT_RETRY  # noqa: E402
from runtime.testing import Harness  # noqa: E402
from tests import fault_suite as fs  # noqa: E402

Scenario = Callable[[Harness, Path, float], Awaitable[fs.Figures]]


def n(base: int, scale: float) -> int:
    return max(4, int(base * scale))


SCENARIOS: dict[str, tuple[Limits, Scenario]] = {
    "chaos": (
        fs.CHAOS_LIMITS,
        lambda h, d, k: fs.chaos(h, n(1000, k), d, replicas=3, kill_every=2.5, latency_ms=500, concurrency=16),
    ),
    "restart": (fs.LIMITS, lambda h, d, k: fs.broker_restart(h, n(1000, k), d)),
    "model": (fs.LIMITS, lambda h, d, k: fs.model_faults(h, n(1000, k), step_timeout_s=5.0)),
    "model-retry": (
        fs.LIMITS,
        lambda h, d, k: fs.model_faults(
            h, n(1000, k), step_timeout_s=5.0, retry=[*DEFAULT_RETRY, "model_error", "timeout"]
        ),
    ),
    "poison": (fs.POISON_LIMITS, lambda h, d, k: fs.poison(h, n(1000, k), d)),
    "pause": (fs.LIMITS, lambda h, d, k: fs.pause(h, n(1000, k), d)),
    "network": (fs.NETWORK_LIMITS, lambda h, d, k: fs.network(h, n(1000, k))),
    "slow": (fs.SLOW_LIMITS, lambda h, d, k: fs.slow_handler(h, n(20, k), heartbeat=True, replicas=2)),
    "stale-ack": (fs.SLOW_LIMITS, lambda h, d, k: fs.slow_handler(h, n(20, k), heartbeat=False, replicas=2)),
    "backlog": (fs.BACKLOG_LIMITS, lambda h, d, k: fs.backlog(h, n(10_000, k), d)),
}


async def run(name: str, scale: float, keep: Path | None) -> fs.Figures:
    limits, scenario = SCENARIOS[name]
    with tempfile.TemporaryDirectory(prefix=f"gymbus-faults-{name}-") as tmp:
        base = keep / name if keep else Path(tmp)
        async with Harness(base / "broker", limits=limits) as h:
            return await scenario(h, base / "logs", scale)


def fuzz(scale: float) -> fs.Figures:
    """S4 through pytest (hypothesis generates the messages); passes iff every one was accounted for."""
    examples = n(1000, scale)
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", str(ROOT / "tests" / "test_fuzz.py")],
        cwd=ROOT,
        env={**os.environ, "GYMBUS_FUZZ_EXAMPLES": str(examples)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    f = fs.Figures("fuzzed messages (S4)", submitted=examples + 10, wall_s=time.monotonic() - t0)
    lines = done.stdout.strip().splitlines()
    f.notes["pytest"] = lines[-1] if lines else done.stderr[-300:]
    if done.returncode:
        f.problems.append(done.stdout[-2000:])
    return f


def table(figures: list[fs.Figures]) -> str:
    head = ("scenario", "submitted", "results", "dupes", "lost", "failures by kind", "dead", "wall s", "ok")
    rows = [
        (
            f.scenario,
            str(f.submitted),
            str(f.results) if f.results else "-",
            str(f.duplicates),
            str(f.lost),
            fs.failures_line(f),
            str(f.dead),
            f"{f.wall_s:.1f}",
            "yes" if f.ok else "NO",
        )
        for f in figures
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(r: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()

    return "\n".join([line(head), line(tuple("-" * w for w in widths)), *map(line, rows)])


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--only", help=f"comma-separated: {', '.join([*SCENARIOS, 'fuzz'])}")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every N by this (default 1: full size)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", type=Path, help="keep each scenario's store and worker logs under this folder")
    args = parser.parse_args()
    chosen = args.only.split(",") if args.only else [*SCENARIOS, "fuzz"]
    unknown = set(chosen) - {*SCENARIOS, "fuzz"}
    if unknown:
        parser.error(f"unknown scenario(s) {sorted(unknown)}")
    started = datetime.now(UTC)
    figures = []
    for name in chosen:
        print(f"-- {name} ...", flush=True)
        f = fuzz(args.scale) if name == "fuzz" else asyncio.run(run(name, args.scale, args.keep))
        print(f"   {f.results}/{f.submitted} results, {f.duplicates} dupes, {f.lost} lost, ", end="")
        print(f"failures {fs.failures_line(f)}, {f.wall_s:.1f} s, {f.notes}", flush=True)
        for p in f.problems:
            print(f"   PROBLEM: {p}", flush=True)
        figures.append(f)
    print(f"\nfault suite, {started:%Y-%m-%d %H:%M} UTC, scale {args.scale:g}, {os.cpu_count()} cores\n")
    print(table(figures))
    if args.json:
        args.json.write_text(json.dumps([f.__dict__ | {"ok": f.ok} for f in figures], indent=2, default=str) + "\n")
    return 0 if all(f.ok for f in figures) else 1


if __name__ == "__main__":
    sys.exit(main())
