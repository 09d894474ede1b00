"""A quickstart-sized run through `gymbus collect`: the live profile mid-run, the offline one, the CLI and the report.

One run (the 24 quickstart tasks plus one invalid row, x 4 repeats) serves every test here.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
import yaml
from click.testing import Result
from rich.console import Console
from typer.testing import CliRunner

from broker import inspect, topology
from broker.connect import connect
from broker.schemas import result_decoder
from broker.server import EmbeddedServer
from conftest import MATH_TASKS, ROOT
from runtime.cli import app
from runtime.profiling import profile, runfolder, status
from runtime.profiling.profile import Sample
from runtime.profiling.profiler import Snapshot, read_snapshot

RUN = "live1"
BAD_ROW = {"responses_create_params": {"input": {"role": "user"}}, "expected_answer": "1"}


@dataclass
class LiveRun:
    run_dir: Path
    stdout: str
    mid: Snapshot
    """A live snapshot read from the broker while the run was going."""
    mid_views: str
    """What `gymbus profile --run` and `gymbus status` printed then, finding the broker from the run folder."""


def write_config(tmp: Path) -> Path:
    tasks = tmp / "tasks.jsonl"
    tasks.write_text(MATH_TASKS.read_text() + json.dumps(BAD_ROW) + "\n")
    cfg = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    cfg.update(input=str(tasks), output=str(tmp / "runs"))
    cfg["model"]["simulate"]["latency_ms"] = 150  # long enough to look at it mid-run
    cfg["workers"]["concurrency"] = 4
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


async def collect_watching(config: Path, run_dir: Path) -> LiveRun:
    """Run `gymbus collect` and, while it runs, read the profiler's snapshot from its embedded broker."""
    env = {**os.environ, "CI": "1"}
    cmd = [sys.executable, "-m", "runtime", "collect", str(config), "--run-id", RUN]
    proc = await asyncio.create_subprocess_exec(*cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    mid = None
    try:
        url = await _broker_url(run_dir, proc)
        nc = await connect(url, name="test-watcher")
        try:
            while mid is None and proc.returncode is None:
                snap = await read_snapshot(nc.jetstream(), RUN)
                if snap is not None and 0 < snap.profile.present < (snap.profile.expected or 0):
                    mid = snap
                await asyncio.sleep(0.05)
        finally:
            await nc.close()
        views = io.StringIO()
        console = Console(file=views, width=200)
        await status.live(console, status.live_broker(run_dir.parent, RUN), RUN, as_json=False, watch=False)
        await status.show(console, status.live_broker(run_dir.parent), as_json=False)
    finally:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, stderr.decode()
    assert mid is not None, "no live snapshot while the run was going"
    return LiveRun(run_dir, stdout.decode(), mid, views.getvalue())


async def _broker_url(run_dir: Path, proc: asyncio.subprocess.Process) -> str:
    for _ in range(1200):
        meta = run_dir / "metadata.json"
        if meta.exists():
            return json.loads(meta.read_text())["nats_url"]
        assert proc.returncode is None, "collect exited before it started"
        await asyncio.sleep(0.05)
    raise AssertionError("collect wrote no metadata.json")


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> LiveRun:
    tmp = tmp_path_factory.mktemp("profile-run")
    return asyncio.run(collect_watching(write_config(tmp), tmp / "runs" / RUN))


def offline(run_dir: Path) -> tuple[dict, list[dict]]:
    prof = json.loads((run_dir / "profile.json").read_text())
    tasks = [json.loads(line) for line in (run_dir / "tasks.jsonl").read_text().splitlines()]
    return prof, tasks


def gymbus(*args: str) -> Result:
    """The CLI, run in this process by typer's runner."""
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def test_collect_prints_the_profile_and_writes_the_files(live_run: LiveRun) -> None:
    out = " ".join(live_run.stdout.split())
    assert "profile of run live1 (offline)" in out and "pass@k @1" in out and "latency per rollout" in out
    assert "invalid_input 4" in out and f"report {live_run.run_dir / 'report.html'}" in out
    prof, tasks = offline(live_run.run_dir)
    assert (prof["expected"], prof["present"], prof["tasks"], prof["repeats"]) == (100, 100, 25, 4)
    # the invalid row's 4 rollouts are failures, counted by kind and in no reward statistic
    assert prof["failures"] == {"invalid_input": 4} and prof["failed"] == 4
    assert prof["scored"] == prof["reward"]["count"] == 96
    assert [t["task_index"] for t in tasks] == list(range(25))
    assert (tasks[24]["scored"], tasks[24]["failed"], tasks[24]["pass_at_k"]) == (0, 4, {})
    assert [a["k"] for a in prof["pass_at_k"]] == [1, 2, 4] and [a["k"] for a in prof["majority_at_k"]] == [1, 2, 4]
    assert prof["latency"]["model"]["p50"] > 0.15  # the simulated policy's 150 ms per call
    assert prof["throughput"]["rollouts_per_s"] > 0


def test_live_profile_mid_run_agrees_with_the_results_it_had_seen(live_run: LiveRun) -> None:
    """The snapshot taken mid-run is exactly the offline computation over the stream up to its sequence."""
    mid = live_run.mid.profile
    assert mid.source == "live" and 0 < mid.present < 100

    async def fold_prefix() -> list[Sample]:
        samples: dict[str, Sample] = {}
        with EmbeddedServer(live_run.run_dir / "broker") as server:
            nc = await connect(server.url)
            try:
                subject = topology.result_subject(RUN)
                async for m in inspect.messages(nc.jetstream(), topology.RESULTS_STREAM, subject):
                    if m.seq is not None and m.seq <= mid.last_seq:
                        profile.keep(samples, Sample.of(result_decoder.decode(m.data or b"")))
            finally:
                await nc.close()
        return list(samples.values())

    prefix = asyncio.run(fold_prefix())
    assert len(prefix) == mid.present
    again, tasks = profile.build(runfolder.run_info(live_run.run_dir), prefix, source="offline")
    assert profile.comparable(again) == profile.comparable(mid)
    assert msgspec.to_builtins(tasks) == msgspec.to_builtins(live_run.mid.tasks)


def test_profile_and_status_show_the_run_while_it_goes(live_run: LiveRun) -> None:
    """Both find the embedded broker of the running collect from its run folder."""
    views = live_run.mid_views
    assert "profile of run live1 (live)" in views and "latency per rollout" in views
    assert re.search(r"live1\s+\d+ / 100\s+\d+%", views) and "profiler" in views and "agent-simple_agent" in views


def test_final_live_profile_equals_the_offline_profile(live_run: LiveRun) -> None:
    """What the profiler stored by the end of the run (read back from the broker) equals profile.json."""
    prof, tasks = offline(live_run.run_dir)
    with EmbeddedServer(live_run.run_dir / "broker") as server:
        done = gymbus("profile", "--run", RUN, "--nats", server.url, "--json")
        table = gymbus("profile", "--run", RUN, "--nats", server.url)
        status = gymbus("status", "--nats", server.url, "--json")
        status_table = gymbus("status", "--nats", server.url)
    assert done.exit_code == 0, done.output
    live = json.loads(done.stdout)
    assert live["profile"]["source"] == "live" and live["profile"]["present"] == 100
    for p in (live["profile"], prof):
        for key in ("source", "generated_at", "last_seq"):
            p.pop(key, None)
    assert live["profile"] == prof
    assert live["tasks"] == tasks
    assert "profile of run live1 (live)" in table.stdout
    runs = {r["run_id"]: r for r in json.loads(status.stdout)["runs"]}
    assert runs[RUN]["profile"]["present"] == 100 and runs[RUN]["expected"] == 100
    consumers = {c["name"]: c for c in json.loads(status.stdout)["consumers"]}
    assert consumers["profiler"]["pending"] == 0 and consumers["profiler"]["ack_pending"] == 0
    assert {"agent-simple_agent", "tool-math", "verify-math"} <= consumers.keys()
    assert re.search(r"live1\s+100 / 100\s+100%\s+0\.\d+", status_table.stdout), status_table.stdout


def test_offline_profile_command(live_run: LiveRun, tmp_path: Path) -> None:
    copy = tmp_path / RUN
    shutil.copytree(live_run.run_dir, copy, ignore=shutil.ignore_patterns("broker", "logs"))
    (copy / "report.html").unlink()
    done = gymbus("profile", str(copy), "--pass-threshold", "0.5")
    assert done.exit_code == 0, done.output
    assert "profile of run live1 (offline)" in done.stdout and "reward ≥ 0.5" in done.stdout
    assert json.loads((copy / "profile.json").read_text())["pass_threshold"] == 0.5
    assert (copy / "report.html").stat().st_size > 10_000
    as_json = gymbus("profile", str(copy), "--json", "--no-write")
    assert json.loads(as_json.stdout)["profile"]["present"] == 100
    missing = gymbus("profile", str(tmp_path / "nope"))
    assert missing.exit_code == 2 and "does not exist" in missing.output
    neither = gymbus("profile")
    assert neither.exit_code == 2 and "give a run folder" in neither.output


CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def test_report_opens_in_headless_chromium(live_run: LiveRun, tmp_path: Path) -> None:
    """No console errors, no network, every chart drawn, and a rollout's conversation shown; a screenshot proves it."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra: make install")
    report = live_run.run_dir / "report.html"
    errors: list[str] = []
    requests: list[str] = []
    shot = Path(os.environ.get("GYMBUS_SCREENSHOT_DIR", tmp_path)) / "report.png"
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900}, user_agent="gymbus-test")
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.route(
            "**/*",
            lambda route: (
                route.continue_()
                if route.request.url.startswith("file:")
                else (requests.append(route.request.url), route.abort())
            ),
        )
        page.goto(report.as_uri())
        charts = page.eval_on_selector_all("[data-chart]", "els => els.map(e => e.dataset.chart)")
        assert sorted(charts) == ["difficulty", "failures", "latency", "pass_at_k", "reward"]
        assert page.locator("svg[data-chart=reward] rect").count() >= 2
        page.locator("#rollout-list li", has_text="task 2 · #0").click()  # the simulated policy calls the calculator
        detail = page.inner_text("#rollout-detail")
        assert "tool call · calculator" in detail and "tool output" in detail and "extracted answer" in detail
        assert "assistant" in detail and "user" in detail
        page.select_option("#f-status", "failed")
        assert page.locator("#rollout-list li").count() == 4
        page.locator("#rollout-list li").first.click()
        assert "invalid_input" in page.inner_text("#rollout-detail")
        page.select_option("#f-status", "")
        page.locator("#rollout-list li", has_text="task 2 · #0").click()
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert errors == [] and requests == []
    assert shot.stat().st_size > 50_000


def test_live_views_need_a_running_broker(tmp_path: Path) -> None:
    done = tmp_path / "runs" / "old"
    done.mkdir(parents=True)
    (done / "metadata.json").write_text(json.dumps({"nats_url": "nats://127.0.0.1:1", "finished_at": 1.0}))
    for args in (["status", "-o", str(tmp_path / "runs")], ["profile", "--run", "old", "-o", str(tmp_path / "runs")]):
        result = gymbus(*args)
        assert result.exit_code == 2 and "no broker: give --nats URL" in result.output
    result = gymbus("profile", "--run", "old", "--nats", "nats://127.0.0.1:1")
    assert result.exit_code == 2 and "no NATS broker answers at nats://127.0.0.1:1" in result.output
