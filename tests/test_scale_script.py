"""scripts/scale.py at a small size: the run ends with one row per rollout and the script reports each
process's memory at every tenth of it (the full size, 1,000,000 rollouts, is a script run by hand)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_the_scale_script_runs_a_collect_and_follows_every_process(tmp_path: Path) -> None:
    figures = tmp_path / "figures.json"
    out = subprocess.run(
        [sys.executable, "scripts/scale.py", "--rollouts", "480", "--keep", str(tmp_path), "--json", str(figures)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(figures.read_text())
    assert got["rows"] == got["expected"] == 480 and got["failures"] == {}
    roles = {name.split(" [")[0] for name in got["peak_rss_mb"]}
    assert {"collect", "broker", "simulate", "worker simple_agent", "worker math"} <= roles, roles
    assert len(got["rss_mb_at"]) == 10 and got["rss_mb_at"][-1][0] == 480
    assert "resident MB per process at each tenth of the run" in out.stdout
