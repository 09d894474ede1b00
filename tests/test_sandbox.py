"""The sandbox library: verdicts about the candidate vs. errors of the infrastructure, limits, config,
fleet admission over a real broker, and its span. Backend-specific escape checks: test_sandbox_escape.py."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runtime.errors import InvalidInput, SandboxError
from runtime.sandbox import Limits, Sandbox, SandboxConfig
from runtime.sandbox.admission import FleetAdmission
from runtime.sandbox.uids import processes_of
from runtime.telemetry import tracing
from runtime.testing import Harness

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the process backend drops to per-run uids: needs root")

QUICK = Limits(wall_s=3.0, cpu_s=1, memory_mb=256, output_bytes=64 * 1024)


@pytest.fixture
def sandbox() -> Sandbox:
    return Sandbox(SandboxConfig(limits=QUICK))


async def test_runs_code_with_stdin_and_files(sandbox: Sandbox) -> None:
    code = "import data\nprint(int(input()) * data.K, open('notes/a.txt').read())"
    out = await sandbox.run(code, files={"data.py": "K = 2", "notes/a.txt": b"hi"}, stdin="21\n")
    assert (out.verdict, out.stdout, out.exit_code) == ("ok", "42 hi\n", 0), out


async def test_runs_a_command(sandbox: Sandbox) -> None:
    out = await sandbox.run(["python", "t.py", "x"], files={"t.py": "import sys; print(sys.argv[1:])"})
    assert out.stdout == "['x']\n"


@pytest.mark.parametrize(
    "code,verdict,detail",
    [
        ("raise SystemExit(3)", "error", "exit status 3"),
        ("1/0", "error", "exit status 1"),
        ("import time; time.sleep(60)", "timeout", "wall-clock"),
        ("while True: pass", "timeout", ""),  # the CPU limit, or the wall clock first on a busy machine
        ("x = bytearray(1 << 30)", "memory", "out of memory"),
        ("print('y' * 100_000)", "output_capped", "output cap"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "error", "SIGSEGV"),
    ],
)
async def test_candidate_failures_are_verdicts(sandbox: Sandbox, code: str, verdict: str, detail: str) -> None:
    out = await sandbox.run(code)
    assert out.verdict == verdict and detail in out.detail, out
    assert out.duration_s < QUICK.wall_s + 1.5


async def test_the_cpu_limit_ends_a_spin() -> None:
    out = await Sandbox(SandboxConfig(limits=Limits(wall_s=30.0, cpu_s=1))).run("while True: pass")
    assert out.verdict == "timeout" and "over the CPU limit (1 s)" in out.detail, out


async def test_the_environment_is_empty_and_the_uid_is_its_own(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-canary-in-the-worker")
    out = await sandbox.run("import os; print(os.getuid(), sorted(os.environ))")
    uid, names = out.stdout.split(" ", 1)
    assert int(uid) >= SandboxConfig().uid_base and "OPENAI_API_KEY" not in names, out


async def test_no_process_outlives_its_run(sandbox: Sandbox) -> None:
    """A child that leaves the process group (setsid) and sleeps is swept with its run's uid."""
    code = "import os, time\nif os.fork() == 0:\n    os.setsid(); time.sleep(60)\nprint(os.getuid(), os.getcwd())"
    out = await sandbox.run(code)
    uid, scratch = out.stdout.split()
    assert out.verdict == "ok" and Path(scratch).parent == Path(tempfile.gettempdir())
    assert processes_of(int(uid)) == []
    assert not Path(scratch).exists()  # and its scratch directory is gone


async def test_concurrent_runs_each_get_their_own_uid(sandbox: Sandbox) -> None:
    outs = await asyncio.gather(
        *(sandbox.run("import os, time; time.sleep(0.3); print(os.getuid())") for _ in range(6))
    )
    assert len({o.stdout for o in outs}) == 6


async def test_infrastructure_failures_raise_sandbox_error() -> None:
    """A sandbox that cannot start, or a backend this host cannot reach, is never a verdict."""
    with pytest.raises(SandboxError, match="could not start '/nonexistent/python3'"):
        await Sandbox(SandboxConfig(python="/nonexistent/python3")).run("print(1)")
    with pytest.raises(SandboxError, match="docker"):
        await Sandbox(SandboxConfig(backend="docker", docker_url="unix:///nonexistent/docker.sock")).run("print(1)")


async def test_misuse_is_named(sandbox: Sandbox) -> None:
    with pytest.raises(InvalidInput, match=r"'\.\./x'"):
        await sandbox.run("print(1)", files={"../x": "no"})
    with pytest.raises(ValueError, match="GYMBUS_SANDBOX_CPU_S: Expected `int` >= 1"):
        SandboxConfig.from_env({"GYMBUS_SANDBOX_CPU_S": "0"})
    with pytest.raises(ValueError, match="GYMBUS_SANDBOX_BACKEND: Invalid enum value 'vm'"):
        SandboxConfig.from_env({"GYMBUS_SANDBOX_BACKEND": "vm"})
    config = SandboxConfig.from_env({"GYMBUS_SANDBOX_WALL_S": "2.5", "GYMBUS_SANDBOX_FLEET_MAX": "4"})
    assert (config.limits.wall_s, config.fleet_max) == (2.5, 4)


async def test_fleet_admission_bounds_runs_across_replicas(harness: Harness) -> None:
    """Two 'replicas' (two Sandboxes, one fleet semaphore of 2): never more than 2 running at once."""
    replicas = [Sandbox(SandboxConfig(limits=QUICK), FleetAdmission(2, js=harness.js, lease_s=5)) for _ in range(2)]
    code = "import time; t = time.time(); time.sleep(0.4); print(t, time.time())"
    outs = await asyncio.gather(*(replicas[i % 2].run(code) for i in range(6)))
    spans = sorted(tuple(map(float, o.stdout.split())) for o in outs)
    overlap = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert overlap == 2, spans
    assert await replicas[0].admission.holders() == {}  # type: ignore[union-attr]


async def test_a_dead_holders_slot_expires(harness: Harness) -> None:
    """A holder that died (took a slot, never renewed nor released) blocks the slot for its lease only."""
    dead = FleetAdmission(1, js=harness.js, lease_s=1.0)
    await dead._bucket()
    await dead._acquire(await dead._bucket())  # taken, and nobody will renew or release it
    alive = FleetAdmission(1, js=harness.js, lease_s=1.0, timeout_s=10)
    started = time.monotonic()
    async with alive.slot() as slot:
        waited = time.monotonic() - started
        assert slot == 0 and (await alive.holders())[0] == alive.holder
    assert 0.5 < waited < 5, waited


async def test_no_slot_in_time_is_a_sandbox_error(harness: Harness) -> None:
    holder = FleetAdmission(1, js=harness.js, lease_s=10)
    waiter = FleetAdmission(1, js=harness.js, lease_s=10, timeout_s=0.3)
    async with holder.slot():
        with pytest.raises(SandboxError, match=r"no sandbox slot free within 0.3 s \(fleet limit 1"):
            async with waiter.slot():
                pass


async def test_no_broker_is_a_sandbox_error() -> None:
    admission = FleetAdmission(1, nats_url="nats://127.0.0.1:1")
    with pytest.raises(SandboxError, match="cannot reach the broker"):
        async with admission.slot():
            pass


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    saved = tracing.TRACER
    tracing.TRACER = provider.get_tracer("gymbus")
    yield memory
    tracing.TRACER = saved


async def test_admission_wait_and_run_are_spans(harness: Harness, spans: InMemorySpanExporter) -> None:
    sandbox = Sandbox(SandboxConfig(limits=QUICK), FleetAdmission(1, js=harness.js, lease_s=5))
    await asyncio.gather(*(sandbox.run("import time; time.sleep(0.3)") for _ in range(2)))
    finished = spans.get_finished_spans()
    waits = sorted(s.attributes["gymbus.sandbox.wait_s"] for s in finished if s.name == "sandbox admission")
    runs = [s for s in finished if s.name == "sandbox run"]
    assert len(waits) == 2 and waits[1] > 0.25, waits  # the second waited for the first's slot
    assert [s.attributes["gymbus.sandbox.verdict"] for s in runs] == ["ok", "ok"]


@pytest.mark.sandbox
@pytest.mark.parametrize("backend", ["bubblewrap", "docker"])
async def test_backend_basics(backend: str) -> None:
    """The other backends give the same verdicts as the process backend (skipped with the reason when absent)."""
    try:
        sandbox = Sandbox(SandboxConfig(backend=backend, limits=QUICK))  # type: ignore[arg-type]
        sandbox.backend  # noqa: B018
    except SandboxError as exc:
        pytest.skip(f"{backend} backend cannot run here: {exc.reason}")
    out = await sandbox.run("import data\nprint(int(input()) * data.K)", files={"data.py": "K = 2"}, stdin="21\n")
    assert (out.verdict, out.stdout) == ("ok", "42\n"), out
    assert (await sandbox.run(["python", "-c", "raise SystemExit(3)"])).detail == "exit status 3"
    verdicts = await asyncio.gather(
        *(sandbox.run(c) for c in ("import time; time.sleep(60)", "x = bytearray(1 << 30)"))
    )
    assert [o.verdict for o in verdicts] == ["timeout", "memory"], verdicts


@pytest.mark.sandbox
def test_fleet_admission_across_worker_processes(tmp_path: Path) -> None:
    """`gymbus collect` with two code_gen worker processes and GYMBUS_SANDBOX_FLEET_MAX=2: never more
    than 2 sandboxes at once, both slots used, and every run's admission wait in the traces."""
    config = tmp_path / "fleet.yaml"
    configs = Path(__file__).parents[1] / "configs"
    text = (configs / "code_gen.yaml").read_text().replace("input: ../", f"input: {configs.parent}/")
    config.write_text(text.replace("repeats: 4", "repeats: 2").replace("replicas: 1", "replicas: 2"))
    env = {**os.environ, "GYMBUS_SANDBOX_FLEET_MAX": "2", "GYMBUS_SANDBOX_WALL_S": "5"}
    cmd = [sys.executable, "-m", "runtime", "collect", str(config), "--output", str(tmp_path / "runs"), "--quiet"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    [run] = list((tmp_path / "runs").iterdir())
    spans = [json.loads(line) for line in (run / "traces.jsonl").read_text().splitlines()]
    runs = [s for s in spans if s["name"] == "sandbox run"]
    admitted = [s for s in spans if s["name"] == "sandbox admission"]
    edges = sorted([(s["start_ns"], 1) for s in runs] + [(s["end_ns"], -1) for s in runs])
    running = [sum(d for _, d in edges[: i + 1]) for i in range(len(edges))]
    assert len(runs) == len(admitted) >= 24 and max(running) <= 2
    assert {s["attributes"]["gymbus.sandbox.slot"] for s in admitted} == {0, 1}
