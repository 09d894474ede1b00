"""The escape suite (RELIABILITY S1) against every backend this host can run.

Each attempt ends as a candidate verdict within its limit, reaches nothing of the host, leaks no
secret, and leaves no process, directory or container behind. A backend the host cannot run is
skipped with the reason. The process backend runs in the default suite; bubblewrap and docker are
the ``sandbox`` tier (``pytest -m sandbox``; .ci/run installs bwrap and starts a Docker engine).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pytest

from runtime.errors import SandboxError
from runtime.sandbox.config import BACKENDS, SandboxConfig
from runtime.sandbox.core import make_backend
from runtime.sandbox.escape import ATTEMPTS, LIMITS, Host, Row, run_suite
from runtime.sandbox.uids import processes_of

TIERS = {"process": [], "bubblewrap": [pytest.mark.sandbox], "docker": [pytest.mark.sandbox]}


def _unavailable(backend: str) -> str | None:
    if backend != "docker" and os.geteuid() != 0:
        return "needs root (each run drops to a uid of its own)"
    try:
        make_backend(SandboxConfig(backend=backend))  # type: ignore[arg-type]
    except SandboxError as exc:
        return exc.reason
    return None


_SUITES: dict[str, tuple[Host, list[Row]]] = {}


def _suite(backend: str) -> tuple[Host, list[Row]]:
    """The suite runs once per backend (about 10 s); the tests below read its rows."""
    if backend not in _SUITES:
        reason = _unavailable(backend)
        if reason:
            pytest.skip(f"{backend} backend cannot run here: {reason}")
        host = Host()
        saved = os.environ.get("OPENAI_API_KEY")
        try:
            _SUITES[backend] = (host, asyncio.run(run_suite(backend, host)))
        finally:
            if saved is None:
                os.environ.pop("OPENAI_API_KEY", None)
            else:
                os.environ["OPENAI_API_KEY"] = saved
    return _SUITES[backend]


PARAMS = [pytest.param(b, a.name, marks=TIERS[b], id=f"{b}-{a.name}") for b in BACKENDS for a in ATTEMPTS]


@pytest.mark.parametrize("backend,attempt", PARAMS)
def test_attempt_is_contained(backend: str, attempt: str) -> None:
    host, rows = _suite(backend)
    [row] = [r for r in rows if r.attempt == attempt]
    assert row.outcome is not None, f"a sandbox error instead of a verdict: {row.error}"
    assert row.contained, row.outcome
    assert row.outcome.duration_s < LIMITS.wall_s + 1.5, row.outcome  # killed within its limit
    text = row.outcome.stdout + row.outcome.stderr
    assert host.secret not in text and host.canary not in text


EXPECTED = {
    "connects to the broker's port": ("error",),
    "fork-bombs": ("timeout", "ok", "error"),
    "allocates 4 GiB": ("memory",),
    "spins the CPU": ("timeout",),
    "writes 1 GB": ("output_capped", "error"),
    "prints 100 MB": ("output_capped",),
    "sleeps forever": ("timeout",),
}


@pytest.mark.parametrize("backend", [pytest.param(b, marks=TIERS[b]) for b in BACKENDS])
def test_verdicts_and_the_host_after_the_suite(backend: str) -> None:
    host, rows = _suite(backend)
    for row in rows:
        if row.attempt in EXPECTED:
            assert row.outcome is not None and row.outcome.verdict in EXPECTED[row.attempt], row
    assert host.connections == 0  # the broker's port never saw the sandbox
    config = SandboxConfig()
    uids = range(config.uid_base, config.uid_base + config.uid_count)
    assert not [p for uid in _uids_running(uids) for p in processes_of(uid)]
    leftovers = [p for p in Path(tempfile.gettempdir()).glob("gymbus-sandbox-*") if p.stat().st_uid in uids]
    assert not leftovers, leftovers
    if backend == "docker":
        import docker

        assert docker.from_env().containers.list(all=True, filters={"label": "gymbus.sandbox"}) == []


def _uids_running(uids: range) -> set[int]:
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                uid = os.stat(f"/proc/{name}").st_uid
            except FileNotFoundError:
                continue
            if uid in uids:
                found.add(uid)
    return found
