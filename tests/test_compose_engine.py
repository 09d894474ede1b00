"""`docker compose up` under a real Docker engine: the README's commands, a crash, and the traces.

Builds the images of this checkout, then runs the README's compose commands exactly as written
(the block after `<!-- compose-commands`), with three test-only settings: tests/compose/ci.yaml
(host-network builds, ephemeral published ports, idle stand-ins for the collector and Jaeger
images), the `phoenix` profile as the trace backend, and the broker's published port in place of
4222. Between them it kills an agent container mid-run (nothing may be lost), stops the workers
(their last spans must reach Phoenix) and checks in Phoenix's REST API that every rollout is one
complete trace.

Needs an engine (`eval "$(scripts/docker-engine up)"` makes one on a machine without Docker); skipped
with the reason otherwise. Marked `engine`, so only `pytest -m engine` runs it (.ci/run does).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.auth import client_auth
from broker.connect import connect
from broker.topology import Limits
from conftest import ROOT

pytestmark = pytest.mark.engine

README = ROOT / "README.md"
OVERRIDE = ROOT / "tests" / "compose" / "ci.yaml"
WORKERS = ["simple_agent", "math"]
SERVING = ["simple_agent", "math", "policy", "profiler", "janitor"]


def readme_commands() -> list[str]:
    """The compose section's command block, one command per line, comments dropped."""
    text = README.read_text()
    block = text.split("<!-- compose-commands", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.strip()]


def engine_problem() -> str | None:
    """Why no engine can run the stack here, or None."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH: start an engine with `eval \"$(scripts/docker-engine up)\"`"
    for check in (["docker", "info"], ["docker", "compose", "version"]):
        done = subprocess.run(check, capture_output=True, timeout=60)
        if done.returncode != 0:
            return f"`{' '.join(check)}` failed: {done.stderr.decode().strip()[:300]}"
    return None


@dataclass
class Stack:
    workdir: Path
    env: dict[str, str]
    timings: dict[str, float] = field(default_factory=dict)
    nats_port: int = 0
    phoenix_port: int = 0

    def docker(self, *args: str, timeout: float = 900) -> str:
        done = subprocess.run(["docker", *args], cwd=self.workdir, env=self.env, capture_output=True, timeout=timeout)
        assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr.decode()[-3000:]}"
        return done.stdout.decode()

    def run(self, line: str, timeout: float = 900) -> str:
        """A README line as a user types it: VAR=value prefixes, `gymbus` from this checkout, the broker's port."""
        words = shlex.split(line.replace("localhost:4222", f"127.0.0.1:{self.nats_port}"))
        env = dict(self.env)
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            key, value = words.pop(0).split("=", 1)
            env[key] = value
        if words[0] == "gymbus":
            words = [sys.executable, "-m", "runtime", *words[1:]]
            env.update(self.host_tracing())
        started = time.monotonic()
        done = subprocess.run(words, cwd=self.workdir, env=env, capture_output=True, timeout=timeout)
        self.timings[line] = round(time.monotonic() - started, 1)
        assert done.returncode == 0, f"{line}: {done.stderr.decode()[-3000:]}"
        return done.stdout.decode()

    def host_tracing(self) -> dict[str, str]:
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.phoenix_port}"} if self.phoenix_port else {}

    def port(self, service: str, port: int) -> int:
        return int(self.docker("compose", "port", service, str(port)).strip().rsplit(":", 1)[1])

    def containers(self, service: str) -> list[str]:
        return self.docker("compose", "ps", "-q", service).split()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    problem = engine_problem()
    if problem:
        pytest.skip(f"no Docker engine: {problem}")
    workdir = tmp_path_factory.mktemp("compose-engine")
    for name in ("configs", "functions"):  # what the host commands' relative paths name
        (workdir / name).symlink_to(ROOT / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GYMBUS_", "OTEL_", "NATS_", "COMPOSE_"))}
    env.update(
        {
            "COMPOSE_FILE": f"{ROOT / 'compose.yaml'}{os.pathsep}{OVERRIDE}",
            "COMPOSE_PROJECT_NAME": f"gymbus-test-{secrets.token_hex(3)}",
            "COMPOSE_PROFILES": "phoenix",
            "GYMBUS_OTLP_ENDPOINT": "http://phoenix:6006",
            "DOCKER_BUILDKIT": os.environ.get("DOCKER_BUILDKIT", "0"),
        }
    )
    s = Stack(workdir, env)
    try:
        yield s
    finally:
        subprocess.run(["docker", "compose", "down", "-v", "--remove-orphans"], cwd=workdir, env=env, timeout=300)
        print(f"\ncompose tier timings (s): {json.dumps(s.timings)}")


def test_the_readme_runs_a_crash_loses_nothing_and_every_rollout_is_one_complete_trace(stack: Stack) -> None:
    up, scale, identity, submit, collect, down = readme_commands()
    assert up == "docker compose up -d --wait" and down == "docker compose down -v"
    assert "--scale simple_agent=2 --scale math=2" in scale and identity.startswith("docker compose cp auth:")

    started = time.monotonic()
    stack.docker("compose", "build")  # images of this checkout (`up` would reuse older ones of the same tag)
    stack.timings["docker compose build"] = round(time.monotonic() - started, 1)
    stack.run(up)
    stack.nats_port, stack.phoenix_port = stack.port("nats", 4222), stack.port("phoenix", 6006)
    stack.run(scale)
    assert [len(stack.containers(w)) for w in WORKERS] == [2, 2]
    stack.run(identity)
    assert oct((stack.workdir / "submitter.nk").stat().st_mode & 0o777) == "0o600"

    stack.run(submit)
    stack.run(collect)
    rows = [json.loads(line) for line in (stack.workdir / "runs" / "exp-1" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 96 and len({r["session_id"] for r in rows}) == 96
    assert all(r.get("failure_kind") is None and r["reward"] in (0.0, 1.0) for r in rows)

    started = time.monotonic()
    stack.docker("compose", "stop", *SERVING, timeout=300)  # SIGTERM: drain, then the last spans go out
    stack.timings["stop (drain + span flush)"] = round(time.monotonic() - started, 1)
    for service in SERVING:
        for cid in stack.docker("compose", "ps", "-aq", service).split():
            code = stack.docker("inspect", "-f", "{{.State.ExitCode}}", cid).strip()
            assert code == "0", f"{service} exited with {code}: killed, not stopped"
    check_traces(stack, rows)

    stack.run(scale)  # the stopped services back
    crash_mid_run(stack, submit, collect)

    stack.run(down)


def crash_mid_run(stack: Stack, submit: str, collect: str) -> None:
    """An agent container killed (SIGKILL) while its model calls are in flight: every rollout still ends
    once (its messages come back to the other replica after the ack wait, 30 s)."""
    repeats, total = 32, 24 * 32
    stack.run(submit.replace("exp-1", "crash") + f" --repeats {repeats}")
    done = asyncio.run(results_reach(stack, "crash", 50))  # some finished, hundreds in flight
    stack.docker("kill", busy_replica(stack, "simple_agent"))
    stack.timings["killed an agent container after results"] = float(done)
    stack.run(collect.replace("exp-1", "crash") + f" --repeats {repeats}")
    rows = [json.loads(line) for line in (stack.workdir / "runs" / "crash" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == total and len({r["session_id"] for r in rows}) == total
    assert all(r.get("failure_kind") is None and r["reward"] in (0.0, 1.0) for r in rows), Counter(
        r.get("failure_kind") for r in rows
    )
    # the killed replica's messages came back to the other one after the ack wait: those rollouts took
    # longer than it, which no rollout of this run does otherwise (the run takes ~10 s). A rollout it
    # had finished without publishing its Result yet gets it from collect's nudge (no Result was ever
    # deleted here); were one run again, it would be as attempt 1
    ack_wait = Limits().ack_wait_s
    waited = [r for r in rows if r["timings"]["total_s"] >= ack_wait]
    again = [r for r in rows if r["attempt"] > 0]
    assert waited or again, "no rollout waited for a redelivery or ran again: the killed one had nothing in flight"
    assert all(r["attempt"] == 1 for r in again), Counter(r["attempt"] for r in rows)
    stack.timings["crash run rollouts redelivered"] = float(len(waited))
    stack.timings["crash run rollouts run again"] = float(len(again))
    stack.run(stack_scale_line())  # the killed replica back, as a user would


def busy_replica(stack: Stack, service: str, timeout: float = 60) -> str:
    """A replica of ``service`` handling messages now (its gymbus_in_flight gauge above 0): killing an
    idle one (a replica just restarted may not have pulled yet) would show nothing."""
    probe = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8080/metrics', timeout=5).read().decode())"
    deadline = time.monotonic() + timeout
    while True:
        loads = {}
        for cid in stack.containers(service):
            metrics = stack.docker("exec", cid, "python", "-c", probe)
            found = re.search(r"^gymbus_in_flight\{[^}]*\} (\S+)$", metrics, re.M)
            loads[cid] = float(found.group(1)) if found else 0.0
        busiest = max(loads, key=loads.__getitem__)
        if loads[busiest] > 0:
            return busiest
        assert time.monotonic() < deadline, f"no replica of {service} is handling a message: {loads}"
        time.sleep(0.2)


async def results_reach(stack: Stack, run_id: str, at_least: int, timeout: float = 120) -> int:
    """Wait until the run has ``at_least`` Results (as the submitter); returns how many it had."""
    auth = client_auth({"NATS_NKEY": str(stack.workdir / "submitter.nk")})
    nc = await connect(f"nats://127.0.0.1:{stack.nats_port}", name="engine-test", auth=auth)
    subject = f"gym.result.{run_id}"
    try:
        async with asyncio.timeout(timeout):
            while True:
                info = await nc.jetstream().stream_info("GYM_RESULTS", subjects_filter=subject)
                found = (info.state.subjects or {}).get(subject, 0)
                if found >= at_least:
                    return found
                await asyncio.sleep(0.05)
    finally:
        await nc.close()


def stack_scale_line() -> str:
    return readme_commands()[1]


def phoenix_spans(port: int) -> list[dict]:
    spans: list[dict] = []
    cursor = ""
    while True:
        url = f"http://127.0.0.1:{port}/v1/projects/default/spans?limit=1000" + (f"&cursor={cursor}" if cursor else "")
        with urllib.request.urlopen(url, timeout=30) as reply:
            page = json.load(reply)
        spans += page["data"]
        cursor = page.get("next_cursor") or ""
        if not cursor:
            return spans


def incomplete(spans: list[dict], rows: list[dict]) -> list[str]:
    """Why each rollout of ``rows`` is not one complete trace in ``spans`` (empty: all are)."""
    by_trace: dict[str, list[dict]] = {}
    for span in spans:
        by_trace.setdefault(span["context"]["trace_id"], []).append(span)
    trace_of: dict[str, set[str]] = {}
    for span in spans:
        a = span["attributes"]
        sid = a.get("messaging.message.conversation_id") or a.get("gen_ai.conversation.id")
        if sid:
            trace_of.setdefault(sid, set()).add(span["context"]["trace_id"])
    problems = []
    for row in rows:
        sid, timings = row["session_id"], row["timings"]
        traces = trace_of.get(sid, set())
        if len(traces) != 1:
            problems.append(f"{sid}: in {len(traces)} traces")
            continue
        trace = by_trace[traces.pop()]
        ids = {s["context"]["span_id"] for s in trace}
        roots = [s for s in trace if not s.get("parent_id")]
        orphans = [s["name"] for s in trace if s.get("parent_id") and s["parent_id"] not in ids]
        # collect resumes right after submit: a rollout still in flight gets its Start again (a nudge),
        # one more hop of its trace that its Result does not count (the model call count below shows it
        # called no model)
        nudges = [s for s in trace if s["attributes"].get("gymbus.message.kind") == "nudge"]
        names = Counter(s["name"].split(" ")[0] + " " + s["name"].split(" ")[1].split(".")[1] for s in trace
                        if s["name"].startswith("process ") and s not in nudges)
        hops = sum(names.values())
        chats = sum(1 for s in trace if s["name"].startswith("chat "))
        tools = sum(1 for s in trace if s["name"].startswith("execute_tool "))
        verifies = sum(1 for s in trace if s["name"].startswith("verify "))
        # verification is a hop of its own, or part of the agent's last turn when the agent's image can
        # import math's code (verify_inline): either way one verify span
        expected = {"process agent": 2, "process tool": 1}
        if "process verify" in names:
            expected["process verify"] = 1
        if len(nudges) > 1:
            problems.append(f"{sid}: {len(nudges)} nudges (one collect sends at most one)")
        elif len(roots) != 1 or orphans:
            problems.append(f"{sid}: {len(roots)} roots, spans whose parent is missing: {orphans}")
        elif hops != timings["hops"] or dict(names) != expected:
            problems.append(f"{sid}: hops {dict(names)}, its Result counts {timings['hops']}")
        elif chats != timings["model_calls"] or tools != 1 or verifies != 1:
            calls = f"{chats} model calls (Result: {timings['model_calls']})"
            problems.append(f"{sid}: {calls}, {tools} tool calls, {verifies} verifications")
    return problems


def check_traces(stack: Stack, rows: list[dict]) -> None:
    deadline = time.monotonic() + 120
    while True:
        spans = phoenix_spans(stack.phoenix_port)
        problems = incomplete(spans, rows)
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not problems, f"{len(problems)} of 96 rollouts incomplete in Phoenix, e.g. {problems[:5]}"
    kinds = Counter(s["span_kind"] for s in spans)
    assert kinds["LLM"] >= 192 and kinds["TOOL"] >= 96, kinds  # what a GenAI-aware backend reads
    assert kinds["EVALUATOR"] >= 96 and kinds["CHAIN"] >= 3 * 96, kinds
    stack.timings["phoenix spans"] = float(len(spans))

