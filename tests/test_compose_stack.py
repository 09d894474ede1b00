"""`docker compose up`, without Docker: compose.yaml's services run as local processes.

Each service runs its own command line with its own environment and config files (see compose_local):
the broker from configs/nats-server.conf, the init job, the simulated policy, the workers (math scaled
to two replicas, as `--scale math=2` would), and an OTLP receiver where the collector listens. Tasks go
in through the `submit` service, Results come back through `gymbus collect --nats`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compose_local import LocalStack
from tests.compose_spec import ROOT, services
from tests.otlp_receiver import OtlpReceiver

WORKERS = ["simple_agent", "math"]
DEFAULT = [name for name, svc in services().items() if not svc.profiles]
"""The services `docker compose up` starts."""
STANDINS = {"otel-collector", "jaeger"}
"""Third-party images, stood in for by the test's OTLP receiver."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, OtlpReceiver]]:
    workdir = tmp_path_factory.mktemp("compose")
    local = LocalStack(workdir, services(), scale={"math": 2}, provided=STANDINS)
    with OtlpReceiver(port=local.net.port("otel-collector", 4318)) as receiver:
        try:
            local.up([name for name in DEFAULT if name not in STANDINS])
            yield local, receiver
        finally:
            local.down()


def test_default_services_start_and_stay_up(stack: tuple[LocalStack, OtlpReceiver]) -> None:
    local, _ = stack
    assert set(DEFAULT) == {
        *("auth", "nats", "init", "policy", "simple_agent", "math", "profiler", "janitor", "otel-collector", "jaeger")
    }
    assert [p.popen.returncode for p in local.procs["auth"]] == [0] == [p.popen.returncode for p in local.procs["init"]]
    assert len(local.procs["math"]) == 2
    for name in ["nats", "policy", *WORKERS]:
        assert all(p.alive() for p in local.procs[name]), name
    deadline = time.monotonic() + 60  # as `docker compose up --wait`: nothing depends on the policy's health
    for name in ["nats", "policy"]:
        local.wait_healthy(name, deadline)  # raises naming the service if it exits or never gets healthy
        assert local.check(name).returncode == 0


def test_submitted_tasks_end_as_verified_results(stack: tuple[LocalStack, OtlpReceiver], tmp_path: Path) -> None:
    local, _ = stack
    submit = local.services["submit"].argv  # `docker compose run --rm submit` (tools profile)
    run_id = submit[submit.index("--run-id") + 1]
    out = local.run("submit")
    assert f"run {run_id}: submitted 96 of 96 rollouts" in " ".join(out.split())

    # gather as a user on the host would, through the published client port
    nats_url = f"nats://127.0.0.1:{local.net.port('nats', 4222)}"
    cmd = ["collect", "configs/quickstart.yaml", "--nats", nats_url, "--run-id", run_id, "-o", str(tmp_path), "-q"]
    done = _gymbus(local, cmd)
    assert "96 / 96 (0 submitted this time)" in done, done

    rows = [json.loads(line) for line in (tmp_path / run_id / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 96 and len({r["session_id"] for r in rows}) == 96
    assert all(r.get("failure_kind") is None and r["reward"] in (0.0, 1.0) for r in rows)
    assert all(r["verifier"].get("extracted_answer") for r in rows)  # scored by the math verifier
    assert all(r["response"]["output"][0]["type"] == "function_call" for r in rows)  # tools ran in `math`
    assert 0.5 < sum(r["reward"] for r in rows) / 96 < 0.95  # the policy's accuracy is 0.75


@pytest.mark.parametrize("name", WORKERS)
def test_worker_health_checks_pass(stack: tuple[LocalStack, OtlpReceiver], name: str) -> None:
    local, _ = stack
    for replica in range(len(local.procs[name])):
        check = local.check(name, replica)
        assert check.returncode == 0, check.stderr.decode()


def test_every_worker_sends_traces_to_the_collector(stack: tuple[LocalStack, OtlpReceiver]) -> None:
    local, receiver = stack
    for name in WORKERS:  # SIGTERM drains, and flushes the span exporter
        for proc in local.procs[name]:
            proc.stop()
    expected = {local.services[name].env["OTEL_SERVICE_NAME"] for name in WORKERS}
    deadline = time.monotonic() + 10
    while not expected <= receiver.services() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert expected <= receiver.services(), receiver.services()


def _gymbus(local: LocalStack, args: list[str]) -> str:
    import subprocess

    from runtime.runs.stack import gymbus_command

    env = {k: v for k, v in local.env("submit").items() if not k.startswith(("GYMBUS_", "OTEL_"))}
    done = subprocess.run(gymbus_command(*args), cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return " ".join(done.stdout.decode().split())
