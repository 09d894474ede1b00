"""``Sandbox``: admission (local and fleet-wide), the configured backend, and the spans around both."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

from runtime.errors import GymError, SandboxError
from runtime.sandbox.admission import FleetAdmission
from runtime.sandbox.config import Limits, SandboxConfig
from runtime.sandbox.job import Files, Job, Program, make_job
from runtime.sandbox.outcome import Outcome
from runtime.telemetry import tracing

SPAN_ADMISSION = "sandbox admission"
SPAN_RUN = "sandbox run"


class Backend(Protocol):
    name: str

    async def run(self, job: Job) -> Outcome: ...


def make_backend(config: SandboxConfig) -> Backend:
    """The configured backend; one that cannot work on this host raises SandboxError saying why."""
    if config.backend == "process":
        from runtime.sandbox.process import ProcessBackend

        return ProcessBackend(config)
    if config.backend == "bubblewrap":
        from runtime.sandbox.bubblewrap import BubblewrapBackend

        return BubblewrapBackend(config)
    from runtime.sandbox.container import DockerBackend

    return DockerBackend(config)


class Sandbox:
    """Runs untrusted code. ``run`` returns the candidate's Outcome or raises SandboxError (infrastructure)."""

    def __init__(self, config: SandboxConfig | None = None, admission: FleetAdmission | None = None) -> None:
        self.config = config or SandboxConfig.from_env()
        self.admission = admission
        if admission is None and self.config.fleet_max > 0:
            self.admission = FleetAdmission.from_config(self.config)
        self._backend: Backend | None = None
        self._local: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = make_backend(self.config)
        return self._backend

    async def run(
        self,
        program: Program,
        files: Files | None = None,
        stdin: str | bytes = b"",
        limits: Limits | None = None,
    ) -> Outcome:
        """Run Python source (a str, as ``main.py``) or a command (``["python", "tests.py"]``) confined."""
        job = make_job(program, files, stdin, limits or self.config.limits)
        backend = self.backend
        async with self._admitted():
            return await _traced_run(backend, job)

    @asynccontextmanager
    async def _admitted(self) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a semaphore belongs to one event loop
            self._loop, self._local = loop, asyncio.Semaphore(self.config.max_local)
        assert self._local is not None
        tracer = tracing.TRACER
        started = time.monotonic()
        span = tracer.start_span(SPAN_ADMISSION) if tracer is not None else None
        try:
            async with self._local:
                if self.admission is None:
                    _end(span, started, None)
                    span = None
                    yield
                    return
                async with self.admission.slot() as slot:
                    _end(span, started, slot)
                    span = None
                    yield
        finally:
            if span is not None:  # the wait itself failed or was cancelled
                _end(span, started, None)


def _end(span: Any, started: float, slot: int | None) -> None:
    if span is None:
        return
    if span.is_recording():
        span.set_attribute("gymbus.sandbox.wait_s", time.monotonic() - started)
        if slot is not None:
            span.set_attribute("gymbus.sandbox.slot", slot)
    span.end()


async def _traced_run(backend: Backend, job: Job) -> Outcome:
    tracer = tracing.TRACER
    if tracer is None:
        return await _guarded(backend, job)
    with tracer.start_as_current_span(SPAN_RUN) as span:
        outcome = await _guarded(backend, job)
        if span.is_recording():
            span.set_attributes(
                {
                    "gymbus.sandbox.backend": backend.name,
                    "gymbus.sandbox.verdict": outcome.verdict,
                    "gymbus.sandbox.duration_s": outcome.duration_s,
                }
            )
        return outcome


async def _guarded(backend: Backend, job: Job) -> Outcome:
    """Anything a backend raises that is not a verdict is the infrastructure's failure."""
    try:
        return await backend.run(job)
    except GymError:
        raise
    except (OSError, RuntimeError) as exc:
        raise SandboxError(f"{backend.name} sandbox failed: {type(exc).__name__}: {exc}") from exc
