"""What keeps a run's data from being mixed, lost or overwritten: a run id bound to what it ran, one
writer per run folder, the models bucket written whole, and a run folder that says what it knows."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from broker import topology
from conftest import MATH_TASKS, ROOT
from runtime.errors import InputError
from runtime.model.endpoints import entry_decoder
from runtime.runs.collect import collect
from runtime.runs.config import RunConfig, load_config
from runtime.runs.folder import RunFolder
from runtime.runs.submit import submit
from runtime.testing import Harness


def config(tmp_path: Path, **extra: object) -> RunConfig:
    raw = {
        "input": str(MATH_TASKS),
        "agent": "simple_agent",
        "env": "math",
        "repeats": 2,
        "limit": 3,
        "output": str(tmp_path / "runs"),
        "model": {"simulate": {"accuracy": 1.0, "latency_ms": 1}},
        **extra,
    }
    return msgspec.convert(raw, RunConfig)


def rows(tmp_path: Path, run_id: str) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "runs" / run_id / "rollouts.jsonl").read_text().splitlines()]


async def test_a_resume_with_other_settings_is_refused_and_extend_grows_the_run(tmp_path: Path) -> None:
    first = await collect(config(tmp_path), run_id="bound", quiet=True)
    assert len(first.results) == 6
    other_input = tmp_path / "other.jsonl"
    other_input.write_text(
        '{"responses_create_params": {"input": "What is the capital of France?"}, "expected_answer": "Paris"}\n'
    )
    refused = [
        (config(tmp_path, repeats=1), r"repeats 2 now 1 \(lowering is never allowed\)"),
        (config(tmp_path, input=str(other_input)), r"input .*example\.jsonl \(sha256 \w+\) now .*other\.jsonl"),
        (config(tmp_path, repeats=3), r"repeats 2 now 3.*raise repeats/limit on purpose with --extend"),
        (config(tmp_path, sampling={"temperature": 0.2}), r"sampling \{\} now \{'temperature': 0\.2\}"),
    ]
    for cfg, message in refused:
        with pytest.raises(InputError, match=message):
            await collect(cfg, run_id="bound", quiet=True)
    assert len(rows(tmp_path, "bound")) == 6  # nothing was added, nothing dropped
    grown = await collect(config(tmp_path, repeats=3), run_id="bound", quiet=True, extend=True)
    assert (grown.submitted, len(grown.results)) == (3, 9)
    assert sorted((r["task_index"], r["rollout_index"]) for r in rows(tmp_path, "bound")) == [
        (t, k) for t in range(3) for k in range(3)
    ]
    with pytest.raises(InputError, match="repeats 3 now 2"):  # not even --extend lowers it
        await collect(config(tmp_path), run_id="bound", quiet=True, extend=True)


def test_a_second_collect_of_the_same_run_says_who_holds_it(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    raw = msgspec.to_builtins(config(tmp_path, limit=8, model={"simulate": {"latency_ms": 400}}))
    path.write_text(json.dumps(raw))
    cmd = [sys.executable, "-m", "runtime", "collect", str(path), "--run-id", "busy", "-q"]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        lock = tmp_path / "runs" / "busy" / ".lock"
        deadline = time.monotonic() + 60
        while not (lock.exists() and lock.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stderr
        assert f"run 'busy' is being collected by pid {first.pid}" in " ".join(second.stderr.split())
        assert first.poll() is None  # the first run goes on, undisturbed
    finally:
        os.killpg(first.pid, signal.SIGINT)
        first.wait(60)
    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=120)  # the lock died with its process
    assert resumed.returncode == 0, resumed.stderr
    assert len(rows(tmp_path, "busy")) == 16


async def test_a_second_gatherer_of_a_shared_brokers_run_reads_alongside(harness: Harness, tmp_path: Path) -> None:
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent")
    await harness.worker("math")
    cfg = config(tmp_path, nats=harness.broker.url)
    folder = RunFolder(cfg.output, "shared").create()
    assert folder.lock()  # another gatherer holds the folder
    try:
        summary = await collect(cfg, run_id="shared", quiet=True)
    finally:
        folder.unlock()
    assert len(summary.results) == 6 and not summary.wrote_folder
    assert not folder.rows_path.exists()  # left to the holder


async def test_submit_registers_the_whole_deployment_and_says_who(harness: Harness, tmp_path: Path) -> None:
    await harness.worker("simple_agent")
    await harness.worker("math")
    url = await harness.simulate(MATH_TASKS, accuracy=1.0)
    model = {"base_url": url, "reasoning": "think_tags", "timeout_s": 7, "attempts": 2}
    await submit(config(tmp_path, nats=harness.broker.url, model=model), "deployed")
    kv = await harness.js.key_value(topology.MODELS)
    entry = entry_decoder.decode((await kv.get("policy")).value)
    assert (entry.endpoints, entry.reasoning, entry.timeout_s, entry.attempts) == ([url], "think_tags", 7.0, 2)
    assert entry.written_by.startswith("gymbus submit") and time.time() - entry.written_at < 60


async def test_a_run_gathered_from_a_shared_broker_says_what_it_knows(harness: Harness, tmp_path: Path) -> None:
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent")
    await harness.worker("math")
    await collect(config(tmp_path, nats=harness.broker.url), run_id="remote", quiet=True)
    meta = json.loads((tmp_path / "runs" / "remote" / "metadata.json").read_text())
    assert meta["simulated_policy"] is True  # the registered endpoint says it is the simulator
    assert meta["model_endpoints"] == [harness.model_url]
    assert meta["traces"].startswith("traces.jsonl: collect's own spans only")


def test_a_config_runs_from_any_directory(tmp_path: Path) -> None:
    cfg = load_config(ROOT / "configs" / "quickstart.yaml")
    assert Path(cfg.input).resolve() == MATH_TASKS.resolve()
    os.chdir(tmp_path)
    try:
        assert Path(load_config(ROOT / "configs" / "quickstart.yaml").input).resolve() == MATH_TASKS.resolve()
    finally:
        os.chdir(ROOT)


async def test_a_start_that_fails_leaves_no_run_folder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not serve model 'policy'"):
        sim = Harness(tmp_path / "sim")
        async with sim:
            url = await sim.simulate(MATH_TASKS, model="other")
            await collect(config(tmp_path, model={"base_url": url}), run_id="never", quiet=True)
    assert not (tmp_path / "runs" / "never").exists()


async def test_every_rollout_failing_is_reported_and_exits_non_zero(tmp_path: Path) -> None:
    async with Harness(tmp_path / "sim") as sim:
        url = await sim.simulate(MATH_TASKS, fail_status=404)  # answers its model list, refuses every call
        path = tmp_path / "run.yaml"
        path.write_text(json.dumps(msgspec.to_builtins(config(tmp_path, model={"base_url": url}))))
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "runtime", "collect", str(path), "--run-id", "allfail", "-q"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, done.stderr
    assert "every rollout failed (model_error: 6)" in done.stderr
    failed = rows(tmp_path, "allfail")
    assert all(r["failure_kind"] == "model_error" and r["reward"] is None for r in failed)
    assert all(
        r["failure_reason"] == f"{url}/chat/completions answered HTTP 404: not an OpenAI-compatible model server "
        "(expected POST /chat/completions to answer JSON; check the model's base URL, which usually ends in /v1)"
        for r in failed
    )
    letters = subprocess.run(
        [sys.executable, "-m", "runtime", "dead-letters", "--run-dir", str(tmp_path / "runs" / "allfail"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert letters.returncode == 0 and letters.stdout == ""  # failed at once: no retries, no dead letters
