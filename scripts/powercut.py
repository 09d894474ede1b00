"""Power cuts under `gymbus collect` runs, at full size, with figures.

    .venv/bin/python scripts/powercut.py                       # sync always and 20ms, 20 runs each
    .venv/bin/python scripts/powercut.py --sync 20ms --trials 5 --cuts 2
    .venv/bin/python scripts/powercut.py --json figures.json --keep /tmp/powercut

Each run (a trial) keeps its run folder, the embedded broker's store included, on a lazy mount
(tests/lazyfs: file data reaches the disk only when fsynced) and loses power up to ``--cuts`` times
at random moments: every unsynced write is dropped and every process SIGKILLed, then the same
`gymbus collect --run-id` resumes it; a last resume runs to the end. Then the auditor and the
checks of tests/powercut.py run. Needs /dev/fuse, fuse3 and mfusepy (`pip install -e '.[dev]'`).
The exit status is 1 if any check failed, 2 if no lazy mount can run here.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.lazyfs import unavailable  # noqa: E402
from tests.powercut import TASKS, PowerCuts, Trial, summary  # noqa: E402


def run_policy(sync: str, args: argparse.Namespace, base: Path) -> list[Trial]:
    rng = random.Random(f"{args.seed}:{sync}")
    trials = []
    with PowerCuts(base, sync=sync, repeats=args.repeats, rollout_timeout_s=args.rollout_timeout) as pc:
        window = pc.window()
        print(f"-- sync {sync}: cuts drawn from {window[0]:.1f}-{window[1]:.1f} s into a collect, or by progress")
        for i in range(args.trials):
            t = pc.trial(f"cut-{i}", rng, cuts=args.cuts, window=window, by_progress=args.by_progress)
            print(f"   {line(t)}", flush=True)
            for p in t.problems:
                print(f"   PROBLEM: {p}", flush=True)
            trials.append(t)
    return trials


def line(t: Trial) -> str:
    cuts = ", ".join(f"{c.at_s:.1f}s/{len(c.shown)} shown" + (" (defs lost)" if c.unloadable else "") for c in t.cuts)
    outcomes = " ".join(f"{k} {v}" for k, v in t.outcomes.most_common())
    reruns = sum(n for a, n in t.attempts.items() if a)
    return (
        f"{t.run_id}: cuts [{cuts}] -> {outcomes}; re-run {reruns}, shown then lost {t.shown_lost}, "
        f"changed {t.shown_changed}, left {t.left}, {t.collects} collects, {t.wall_s:.0f} s"
    )


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "sync",
        "runs",
        "cuts",
        "rollouts",
        "outcomes",
        "re-run",
        "shown before a cut",
        "of them lost",
        "changed",
        "cuts losing stream defs",
        "wall s",
        "ok",
    )
    body = [
        (
            r["sync"],
            str(r["trials"]),
            str(r["cuts"]),
            str(r["rollouts"]),
            ", ".join(f"{k} {v}" for k, v in r["outcomes"].items()),
            str(r["rerun_attempts"]),
            str(r["shown_before_cut"]),
            str(r["shown_lost"]),
            str(r["shown_changed"]),
            str(r["cuts_losing_definitions"]),
            f"{r['wall_s']:.0f}",
            "NO" if r["problems"] else "yes",
        )
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(tuple("-" * w for w in widths)), *map(fmt, body)])


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sync", default="always,20ms", help="comma-separated broker sync policies")
    parser.add_argument("--trials", type=int, default=20, help="runs per policy")
    parser.add_argument("--cuts", type=int, default=3, help="most power cuts per run")
    parser.add_argument("--repeats", type=int, default=8, help=f"rollouts per task ({TASKS} tasks)")
    parser.add_argument("--rollout-timeout", type=float, default=60.0, help="limits.rollout_timeout_s of the runs")
    parser.add_argument("--by-progress", type=float, default=0.5, help="share of cuts placed by Results shown")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", type=Path, help="keep every run's disk and logs under this folder")
    args = parser.parse_args()
    reason = unavailable()
    if reason:
        print(f"no lazy mount here: {reason}", file=sys.stderr)
        return 2
    started = datetime.now(UTC)
    rows = []
    for sync in args.sync.split(","):
        with tempfile.TemporaryDirectory(prefix=f"gymbus-powercut-{sync}-") as tmp:
            base = args.keep / sync if args.keep else Path(tmp)
            base.mkdir(parents=True, exist_ok=True)
            rows.append(summary(run_policy(sync, args, base)))
    print(
        f"\npower cuts, {started:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, {TASKS * args.repeats} rollouts a run\n"
    )
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 1 if any(r["problems"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
