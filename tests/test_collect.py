"""`gymbus collect` on the embedded default: run folder, resume, bad rows, interruption."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest

from broker import inspect, topology
from broker.server import EmbeddedServer
from conftest import MATH_TASKS, ROOT
from runtime.runs.collect import collect
from runtime.runs.config import load_config


def write_config(tmp_path: Path, **extra: object) -> Path:
    cfg = {
        "input": str(MATH_TASKS),
        "agent": "simple_agent",
        "env": "math",
        "repeats": 2,
        "limit": 6,
        "output": str(tmp_path / "runs"),
        "model": {"simulate": {"accuracy": 0.5, "latency_ms": 5, "seed": 1}},
        "limits": {"max_steps": 4},
        **extra,
    }
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def rows_so_far(run_dir: Path) -> list[str]:
    path = run_dir / "rollouts.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]


async def results_in_stream(run_dir: Path, run_id: str) -> list:
    with EmbeddedServer(run_dir / "broker") as server:
        nc = await nats.connect(server.url)
        try:
            return [m async for m in inspect.messages(nc.jetstream(), topology.RESULTS_STREAM, f"gym.result.{run_id}")]
        finally:
            await nc.close()


async def test_collect_writes_run_folder_and_resumes(tmp_path: Path) -> None:
    cfg = load_config(write_config(tmp_path))
    first = await collect(cfg, run_id="resume1", quiet=True)
    run_dir = tmp_path / "runs" / "resume1"
    assert first.submitted == 12 and len(first.results) == 12
    out = rows(run_dir)
    assert [(r["task_index"], r["rollout_index"]) for r in out] == [(t, k) for t in range(6) for k in range(2)]
    source = [json.loads(line) for line in MATH_TASKS.read_text().splitlines()]
    for r in out:  # NeMo Gym shape: the input row, unchanged, plus response and reward
        assert r["responses_create_params"] == source[r["task_index"]]["responses_create_params"]
        assert r["expected_answer"] == source[r["task_index"]]["expected_answer"]
        assert r["reward"] in (0.0, 1.0) and r["response"]["output"]
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["expected"] == 12 and meta["results"] == 12 and meta["simulated_policy"] is True
    assert meta["config"]["repeats"] == 2

    again = await collect(cfg, run_id="resume1", quiet=True)
    assert again.submitted == 0 and len(again.results) == 12

    # delete half of the Results from the results stream: only those are run again
    with EmbeddedServer(run_dir / "broker") as server:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        stored = [m async for m in inspect.messages(js, topology.RESULTS_STREAM, "gym.result.resume1")]
        for m in stored[::2]:
            await js.delete_msg(topology.RESULTS_STREAM, m.seq)
        await nc.close()
    third = await collect(cfg, run_id="resume1", quiet=True)
    assert third.submitted == 6
    final = rows(run_dir)
    assert len(final) == 12 and len({r["session_id"] for r in final}) == 12
    rerun = [r for r in final if r["attempt"] == 1]
    assert len(rerun) == 6  # re-run as a new attempt of the same rollouts
    assert len(await results_in_stream(run_dir, "resume1")) == 12


async def test_bad_rows_fail_alone_and_the_run_finishes(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    good = MATH_TASKS.read_text().splitlines()[:2]
    tasks.write_text(
        "\n".join(
            [
                good[0],
                "{this is not json",
                json.dumps({"responses_create_params": {"input": {"role": "user"}}, "expected_answer": "1"}),
                json.dumps({"responses_create_params": {"input": "What is 1+1?"}, "expected_answer": {"nested": 1}}),
                good[1],
            ]
        )
        + "\n"
    )
    cfg = load_config(write_config(tmp_path, input=str(tasks), limit=None, repeats=1))
    summary = await collect(cfg, run_id="bad1", quiet=True)
    by_task = {r.task_index: r for r in summary.results.values()}
    assert sorted(by_task) == [0, 1, 2, 3, 4]
    assert by_task[0].failure_kind is None and by_task[4].failure_kind is None
    assert by_task[1].failure_kind == "invalid_input" and "line 2 is not valid JSON" in by_task[1].failure_reason
    assert by_task[2].failure_kind == "invalid_input"
    assert "$.responses_create_params.input" in by_task[2].failure_reason
    assert by_task[3].failure_kind == "invalid_input" and "$.meta.expected_answer" in by_task[3].failure_reason
    out = {r["task_index"]: r for r in rows(tmp_path / "runs" / "bad1")}
    assert out[1]["reward"] is None and out[1]["failure_kind"] == "invalid_input"


def test_interrupted_collect_resumes_without_duplicates(tmp_path: Path) -> None:
    """SIGINT mid-run, then the same command: every rollout ends as exactly one Result."""
    config = write_config(
        tmp_path,
        limit=16,
        repeats=4,
        model={"simulate": {"accuracy": 0.5, "latency_ms": 150, "seed": 1}},
        workers={"concurrency": 1},
        env_tools=False,  # one model call per rollout, one at a time: Results keep coming for ~10 s
    )
    cmd = [sys.executable, "-m", "runtime", "collect", str(config), "--run-id", "int1"]
    env = {**os.environ, "CI": "1"}
    # Ctrl-C reaches a foreground command; a test runner started in the background of a
    # non-interactive shell passes SIGINT on ignored, so the command gets it back as a terminal gives it
    foreground = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=env, preexec_fn=foreground
    )
    run_dir = tmp_path / "runs" / "int1"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(rows_so_far(run_dir)) < 3:
        time.sleep(0.05)  # rows land in rollouts.jsonl as Results arrive
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr.decode()
    partial = rows(run_dir)
    assert 0 < len(partial) < 64

    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert "64 / 64" in done.stdout.decode()
    final = rows(run_dir)
    assert len(final) == 64 and len({r["session_id"] for r in final}) == 64
    assert [(r["session_id"], r.get("failure_reason")) for r in final if r.get("failure_kind")] == []
    assert len(asyncio.run(results_in_stream(run_dir, "int1"))) == 64


@pytest.mark.parametrize(
    "bad,message",
    [
        ({"repeats": 0}, "Expected `int` >= 1 - at `$.repeats`"),
        ({"limits": {"max_step": 3}}, "unknown field `max_step` - at `$.limits`"),
        ({"input": "nope.jsonl"}, "nope.jsonl' does not exist"),
    ],
)
def test_collect_rejects_bad_config_naming_the_key(tmp_path: Path, bad: dict, message: str) -> None:
    config = write_config(tmp_path, **bad)
    done = subprocess.run(
        [sys.executable, "-m", "runtime", "collect", str(config)], cwd=tmp_path, capture_output=True, timeout=60
    )
    assert done.returncode == 2
    assert message in " ".join(done.stderr.decode().split())


async def test_a_run_is_fed_to_the_workers_a_window_at_a_time(tmp_path: Path) -> None:
    """With ``workers.in_flight: 3`` no more than three of the run's rollouts are ever submitted and
    without a Result: a Start is published (its broker timestamp is the rollout's submitted_at) only
    after a Result has freed its slot (which comes after that rollout's finished_at)."""
    cfg = load_config(write_config(tmp_path, workers={"replicas": 1, "concurrency": 8, "in_flight": 3}, limit=8))
    summary = await collect(cfg, run_id="window", quiet=True)
    out = rows(tmp_path / "runs" / "window")
    assert len(summary.results) == len(out) == 16 and not summary.failures
    edges = sorted(
        [(r["timings"]["submitted_at"], 1) for r in out] + [(r["timings"]["finished_at"], -1) for r in out],
        key=lambda e: (e[0], e[1]),  # at equal times an end counts before a start
    )
    open_, most = 0, 0
    for _, step in edges:
        open_ += step
        most = max(most, open_)
    assert most == 3


def test_the_rows_are_rewritten_one_per_rollout_in_order_from_the_file(tmp_path: Path) -> None:
    """Rows appended as Results arrive: a later attempt after an earlier one, rows out of order, a line
    a killed writer left unfinished, a rollout outside the run. The rewrite keeps each rollout's last
    row, in task and repeat order, and drops the rest."""
    from runtime.runs.folder import RunFolder

    folder = RunFolder(tmp_path, "rw")
    folder.path.mkdir(parents=True)

    def row(task: int, repeat: int, attempt: int) -> str:
        return json.dumps({"task_index": task, "rollout_index": repeat, "attempt": attempt, "reward": 1.0}) + "\n"

    folder.rows_path.write_text(row(1, 0, 0) + row(0, 1, 0) + row(0, 0, 0) + '{"task_index": 2, "rollo')
    with folder.appender() as out:  # the unfinished line is ended first: it cannot swallow this row
        out.write(row(1, 0, 1) + row(9, 0, 0) + row(0, 1, 0))
    folder.rewrite_rows(lambda task, repeat: task < 9)
    kept = [json.loads(line) for line in folder.rows_path.read_text().splitlines()]
    assert [(r["task_index"], r["rollout_index"], r["attempt"]) for r in kept] == [(0, 0, 0), (0, 1, 0), (1, 0, 1)]
