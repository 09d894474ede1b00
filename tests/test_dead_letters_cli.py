"""What a user does with a poisoned run: see the dead letter, fix the verifier, replay it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import MATH_TASKS, ROOT


def gymbus(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", *args],
        cwd=ROOT,
        env={**os.environ, "GYMBUS_MAX_DELIVER": "2", "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_dead_letters_show_the_poison_and_replay_completes_it(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in MATH_TASKS.read_text().splitlines()[:4]]
    rows[2]["fault"] = "verifier"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        json.dumps(
            {
                "input": str(tasks),
                "agent": "simple_agent",
                "env": "faults",
                "env_ref": "tests.fault_env:ENVIRONMENT",
                "output": str(tmp_path / "runs"),
                "model": {"simulate": {"accuracy": 1.0}},
            }
        )
    )
    first = gymbus("collect", str(cfg), "--run-id", "poisoned", "--quiet")
    assert first.returncode == 0, first.stderr
    assert "verifier_error: 1" in first.stdout

    run_dir = tmp_path / "runs" / "poisoned"
    listing = gymbus("dead-letters", "--run-dir", str(run_dir))
    assert listing.returncode == 0, listing.stderr
    assert "verifier_error" in listing.stdout and "ZeroDivisionError" in listing.stdout
    [letter] = [
        json.loads(line) for line in gymbus("dead-letters", "--run-dir", str(run_dir), "--json").stdout.splitlines()
    ]
    assert letter["session_id"] == "poisoned.2.0" and letter["num_delivered"] == 2 and letter["function"] == "faults"

    fixed = gymbus("replay", str(letter["seq"]), "--config", str(cfg), "--run", "poisoned", GYMBUS_FAULTS_FIXED="1")
    assert fixed.returncode == 0, fixed.stderr
    out = {r["task_index"]: r for r in map(json.loads, (run_dir / "rollouts.jsonl").read_text().splitlines())}
    assert out[2]["reward"] == 1.0 and out[2]["attempt"] == 1 and "failure_kind" not in out[2]
    assert all(out[i]["reward"] == 1.0 for i in range(4))


def test_commands_explain_themselves() -> None:
    from typer.testing import CliRunner

    from runtime.cli import app

    runner = CliRunner()
    for command, phrase in (("dead-letters", "gymbus replay"), ("replay", "new attempt"), ("janitor", "worker_lost")):
        result = runner.invoke(app, [command, "--help"], terminal_width=200)
        assert result.exit_code == 0 and phrase in " ".join(result.output.split()), result.output
    refused = runner.invoke(app, ["replay", "--nats", "nats://127.0.0.1:1"])
    assert refused.exit_code == 2 and "name dead letters by seq, or give --all" in refused.output
    no_broker = runner.invoke(app, ["dead-letters"], env={"GYMBUS_NATS_URL": ""})
    assert no_broker.exit_code == 2 and "--run-dir" in no_broker.output
