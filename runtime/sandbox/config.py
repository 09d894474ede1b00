"""What a sandbox may use (``Limits``) and how sandboxes are run on this host (``SandboxConfig``).

Both are plain msgspec structs with defaults; ``SandboxConfig.from_env()`` overrides any field from
``GYMBUS_SANDBOX_<FIELD>`` (limits as ``GYMBUS_SANDBOX_WALL_S``, ...), the way ``broker.topology.Limits``
reads ``GYMBUS_<FIELD>``. A bad value is one line naming the variable, the value and what it takes.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

Backend = Literal["process", "bubblewrap", "docker"]
BACKENDS: tuple[Backend, ...] = ("process", "bubblewrap", "docker")


class Limits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Per-run limits; a run that crosses one gets a candidate verdict, never an infrastructure error."""

    wall_s: Annotated[float, Meta(gt=0)] = 10.0
    """Wall-clock limit: the whole process group (and every process of the run's uid) is killed then."""
    cpu_s: Annotated[int, Meta(ge=1)] = 5
    """CPU seconds per process (RLIMIT_CPU)."""
    memory_mb: Annotated[int, Meta(ge=16)] = 512
    """Address space per process (RLIMIT_AS), or the container's memory limit."""
    processes: Annotated[int, Meta(ge=1)] = 64
    """Processes of the run (RLIMIT_NPROC under its own uid, or the container's pids limit)."""
    output_bytes: Annotated[int, Meta(ge=1024)] = 10 * 1024 * 1024
    """stdout and stderr together; past this the run is killed and reported ``output_capped``."""
    file_mb: Annotated[int, Meta(ge=1)] = 64
    """Largest file the run may write (RLIMIT_FSIZE), and the size of its scratch tmpfs where it has one."""
    open_files: Annotated[int, Meta(ge=16)] = 256
    """Open file descriptors per process (RLIMIT_NOFILE)."""


class SandboxConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How this host runs sandboxes. Every replica of a function should be given the same values."""

    backend: Backend = "process"
    limits: Limits = msgspec.field(default_factory=Limits)
    """Default limits; a call to ``run`` may pass its own."""
    python: str = ""
    """Interpreter for Python programs ("" = /usr/bin/python3 if present, else this interpreter)."""
    max_local: Annotated[int, Meta(ge=1)] = 16
    """Sandboxes running at once in this process; more wait (the admission span shows the wait)."""
    fleet_max: Annotated[int, Meta(ge=0)] = 0
    """Sandboxes running at once across every replica (a semaphore in the KV store); 0 = no fleet limit."""
    fleet_pool: str = "default"
    """Name of the fleet semaphore; pools with different ``fleet_max`` need different names."""
    lease_s: Annotated[float, Meta(ge=3)] = 30.0
    """A fleet slot whose holder died is free again after this long (renewed every lease_s / 3)."""
    admission_timeout_s: Annotated[float, Meta(gt=0)] = 60.0
    """Longest wait for a slot; past it the run fails with ``sandbox_error`` (retried per policy)."""
    nats_url: str = ""
    """Broker of the fleet semaphore ("" = GYMBUS_NATS_URL)."""
    uid_base: Annotated[int, Meta(ge=1)] = 0x70000000
    """First uid of the pool each run takes its own uid from (process and bubblewrap backends, as root)."""
    uid_count: Annotated[int, Meta(ge=1)] = 4096
    scratch_root: str = ""
    """Where per-run scratch directories are made ("" = the system temp directory)."""
    allow_same_uid: bool = False
    """Without root, run as the worker's own uid (weaker: no per-run process limit or uid sweep)."""
    docker_image: str = "python:3.11-slim"
    docker_python: str = "python3"
    docker_url: str = ""
    """Docker engine URL ("" = DOCKER_HOST or the default socket)."""

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> SandboxConfig:
        """Defaults, then ``GYMBUS_SANDBOX_*`` variables, then ``overrides``; a bad value names its variable."""
        env = os.environ if environ is None else environ
        raw: dict[str, Any] = {}
        limits: dict[str, Any] = {}
        for name in cls.__struct_fields__:
            if name != "limits" and f"GYMBUS_SANDBOX_{name.upper()}" in env:
                raw[name] = env[f"GYMBUS_SANDBOX_{name.upper()}"]
        for name in Limits.__struct_fields__:
            if f"GYMBUS_SANDBOX_{name.upper()}" in env:
                limits[name] = env[f"GYMBUS_SANDBOX_{name.upper()}"]
        try:
            config = msgspec.convert({**raw, "limits": limits}, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise ValueError(_env_error(str(exc))) from None
        return msgspec.structs.replace(config, **overrides) if overrides else config

    def interpreter(self) -> str:
        if self.python:
            return self.python
        return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def _env_error(message: str) -> str:
    """``Expected `int` >= 1 - at `$.limits.cpu_s``` -> the variable's name first."""
    path = message.rpartition("`$.")[2].rstrip("`")
    variable = f"GYMBUS_SANDBOX_{path.rpartition('.')[2].upper()}" if path else "GYMBUS_SANDBOX_*"
    return f"{variable}: {message.partition(' - at ')[0]} (see runtime/sandbox/config.py)"


def bwrap_path() -> str | None:
    return shutil.which("bwrap")
