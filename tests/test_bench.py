"""The benchmark's CI twin: the real stack at tiny size; its output is well-formed and nothing is lost.

No figure is asserted (timings on a shared 2-core machine are not a test); only that every
configuration ran, every rollout came back as a stored successful Result, and the numbers exist.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.bench import flame
from runtime.bench.report import pct

FIELDS = {
    "rollouts_per_s": float,
    "agent_steps_per_s": float,
    "e2e_ms_p50": float,
    "e2e_ms_p99": float,
    "overhead_per_hop_ms_p50": float,
    "overhead_per_hop_ms_p99": float,
    "cpu_s_per_rollout": float,
    "peak_rss_mb": dict,
    "worker_kb_per_inflight": float,
}


@pytest.mark.slow  # ~30 s: four configurations of the real stack
@pytest.mark.timeout(120)
def test_quick_bench_completes_every_rollout(tmp_path: Path) -> None:
    """`python -m runtime.bench --quick`: one JSON line per configuration, every rollout stored and scored."""
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.bench", "--quick", "--rollouts", "8", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert {(r["workload"], r["concurrency"]) for r in rows} == {("answer", 1), ("answer", 4), ("tool", 1), ("tool", 4)}
    for r in rows:
        assert "error" not in r, r
        assert r["submitted"] == r["completed"] == r["stored"] == 8 and r["failed"] == r["lost"] == 0, r
        for key, kind in FIELDS.items():
            assert isinstance(r[key], kind | int if kind is float else kind), (key, r[key])
        assert set(r["peak_rss_mb"]) >= {"broker", "policy", "worker-simple_agent-0", "worker-math-0"}
    assert "rollouts/s" in proc.stderr  # the readable table
    assert (tmp_path / "results.jsonl").read_text().count("\n") == 4


def test_percentile_interpolates_as_every_other_figure_does() -> None:
    values = [float(x) for x in range(1, 101)]
    assert (pct(values, 50), pct(values, 99), pct([], 50), pct([3.0], 99)) == (50.5, 99.01, 0.0, 3.0)


def test_flame_summary_groups_collapsed_stacks(tmp_path: Path) -> None:
    """py-spy's raw format summed by category and by leaf frame."""
    raw = tmp_path / "worker-math-0.txt"
    raw.write_text(
        "_run_once (asyncio/base_events.py:1);verify (functions/math/env.py:9);parse (math_verify/parser.py:3) 3\n"
        "_run_once (asyncio/base_events.py:1);publish_raw (broker/publish.py:2) 1\n"
    )
    stacks = flame.load(raw)
    assert flame.by_category(stacks)["math-verify (verifier)"] == 0.75
    assert flame.self_time(stacks)[0] == ("parse (math_verify/parser.py:3)", 0.75)
    assert "4 samples" in flame.summary(raw)


async def test_pull_bench_measures_every_case() -> None:
    """`python -m runtime.bench.pull` at tiny size: every measurement ran and has its figures (none asserted)."""
    from runtime.bench import pull

    rows = await pull.main(rounds=3, handled=64)
    assert [r["measurement"].split(",")[0] for r in rows] == ["late message"] + ["closed loop"] * 3
    assert rows[0]["fetches"] == 3 and all(r["handled"] >= 64 for r in rows[1:])
    assert all(isinstance(r["fetch_ms_p99"], float) and r["fetch_ms_max"] >= r["fetch_ms_p50"] for r in rows)
    assert "p99 ms" in str(pull.table(rows).columns[3].header)
