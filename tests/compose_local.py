"""compose.yaml's services run as local processes: `docker compose up` without an engine.

Each service (as compose_spec reads it) runs its own command line as a plain process, with its own
config files and environment: service hostnames mapped to 127.0.0.1, container ports to free local
ports, and container paths to the repository's files (the images' WORKDIR holds the repository's
layout, so the working directory is the repository root).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from broker.server import binary, die_with_parent
from runtime.runs.stack import gymbus_command
from tests.compose_spec import ROOT, Service

# ---- local processes ---------------------------------------------------------------------------

EXECUTABLES: dict[str, list[str]] = {
    "gymbus": gymbus_command(),
    "python": [sys.executable],
    "python3": [sys.executable],
    "nats-server": [binary()],
    "wget": ["wget"],
}
"""How a container's executable is run here."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Loopback:
    """The compose network on 127.0.0.1: every (service, replica, container port) gets a free local port."""

    def __init__(self, all_services: Mapping[str, Service]) -> None:
        self.services = all_services
        self._ports: dict[tuple[str, int, int], int] = {}
        names = sorted(all_services, key=len, reverse=True)
        self._peer = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, names)) + r"):(\d+)")

    def port(self, service: str, port: int, replica: int = 0) -> int:
        return self._ports.setdefault((service, replica, port), free_port())

    def text(self, text: str, service: str, replica: int = 0) -> str:
        """Addresses in ``text`` as seen from ``service``: peers by name, itself by loopback or any address."""
        text = self._peer.sub(lambda m: f"127.0.0.1:{self.port(m.group(1), int(m.group(2)))}", text)
        own = self.services[service].ports
        if own:
            mine = r"\b(?:localhost|127\.0\.0\.1|0\.0\.0\.0):(" + "|".join(map(str, own)) + r")\b"
            text = re.sub(mine, lambda m: f"127.0.0.1:{self.port(service, int(m.group(1)), replica)}", text)
        return text.replace("0.0.0.0", "127.0.0.1")

    def token(self, value: str, service: str, replica: int = 0) -> str:
        """A whole argument or variable value: a port of the service's own is mapped, else as ``text``."""
        if value.isdigit() and int(value) in self.services[service].ports:
            return str(self.port(service, int(value), replica))
        return self.text(value, service, replica)

    def file(self, text: str, service: str, paths: Mapping[str, Path]) -> str:
        """A mounted config file: own ports (as words), peers' addresses and container paths mapped."""
        for port in self.services[service].ports:
            text = re.sub(rf"\b{port}\b", str(self.port(service, port)), text)
        for container, host in paths.items():
            text = re.sub(rf"(?<![\w/]){re.escape(container)}(?![\w])", str(host), text)
        return self.text(text, service)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        if self.alive():
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        self.log.close()


class LocalStack:
    """Runs compose services as local processes, in depends_on order, honouring their conditions.

    ``provided`` names services that something else in the test stands in for (they count as started).
    """

    def __init__(
        self,
        workdir: Path,
        all_services: Mapping[str, Service],
        *,
        scale: Mapping[str, int] | None = None,
        provided: set[str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.services = all_services
        self.net = Loopback(all_services)
        self.scale = dict(scale or {})
        self.provided = set(provided or ())
        self.procs: dict[str, list[Proc]] = {}
        (workdir / "logs").mkdir(parents=True, exist_ok=True)

    # -- translating a service ---------------------------------------------------------------

    def paths(self, name: str) -> dict[str, Path]:
        """Container path -> local path: repository files (bind mounts, COPY) and volume folders."""
        svc = self.services[name]
        volumes = {t: self.workdir / "volumes" / s for s, t in svc.mounts if not s.startswith((".", "/", "~"))}
        for folder in volumes.values():
            folder.mkdir(parents=True, exist_ok=True)
        out = {dest: ROOT / src for dest, src in (svc.image.copies if svc.image else {}).items()} | volumes
        for source, target in svc.mounts:
            if source.startswith("."):  # a config file: its copy, with this service's addresses and paths
                local = self.workdir / "mounts" / name / Path(source).name
                local.parent.mkdir(parents=True, exist_ok=True)
                local.write_text(self.net.file((ROOT / source).read_text(), name, volumes))
                out[target] = local
                for inside, folder in volumes.items():  # a volume beside it, as a relative include sees it
                    if Path(inside).parent == Path(target).parent and not (local.parent / Path(inside).name).exists():
                        (local.parent / Path(inside).name).symlink_to(folder)
        return out

    def argv(self, name: str, argv: list[str], replica: int = 0) -> list[str]:
        paths = self.paths(name)
        exe = EXECUTABLES.get(argv[0])
        if exe is None:
            raise LookupError(f"service {name} runs {argv[0]!r}, which has no local equivalent here")
        return exe + [str(paths[a]) if a in paths else self.net.token(a, name, replica) for a in argv[1:]]

    def env(self, name: str, replica: int = 0, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("GYMBUS_", "OTEL_", "NATS_"))}
        paths = self.paths(name)
        own = {k: self.net.token(_local(v, paths), name, replica) for k, v in self.services[name].env.items()}
        return {**base, **own, **(extra or {})}

    # -- running ------------------------------------------------------------------------------

    def start(self, name: str, replica: int = 0, extra_env: Mapping[str, str] | None = None) -> Proc:
        svc = self.services[name]
        label = f"{name}-{replica}"
        log_path = self.workdir / "logs" / f"{label}.log"
        log = open(log_path, "ab")
        popen = subprocess.Popen(
            self.argv(name, svc.argv, replica),
            cwd=ROOT,
            env=self.env(name, replica, extra_env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        proc = Proc(label, popen, log_path, log)
        self.procs.setdefault(name, []).append(proc)
        return proc

    def up(self, names: list[str], timeout: float = 90.0) -> None:
        """Start ``names`` (and what they depend on, unless provided), each once its dependencies are ready."""
        for name in names:
            self._up(name, time.monotonic() + timeout)

    def _up(self, name: str, deadline: float) -> None:
        if name in self.procs or name in self.provided:
            return
        for dep, condition in self.services[name].depends_on.items():
            self._up(dep, deadline)
            if dep in self.provided:
                continue
            if condition == "service_healthy":
                self.wait_healthy(dep, deadline)
            elif condition == "service_completed_successfully":
                self.wait_exit(dep, deadline)
        for replica in range(self.scale.get(name, self.services[name].replicas)):
            self.start(name, replica)

    def check(self, name: str, replica: int = 0) -> subprocess.CompletedProcess[bytes]:
        """Run the service's health check once, as the engine would in its container."""
        test = self.services[name].healthcheck
        if test is None:
            raise LookupError(f"service {name} has no health check")
        return subprocess.run(
            self.argv(name, test, replica), cwd=ROOT, env=self.env(name, replica), capture_output=True, timeout=30
        )

    def wait_healthy(self, name: str, deadline: float) -> None:
        while self.check(name).returncode != 0:
            for proc in self.procs.get(name, []):
                if not proc.alive():
                    raise RuntimeError(f"{name} exited with {proc.popen.returncode}; see {proc.log_path}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not become healthy; see {self.workdir / 'logs'}")
            time.sleep(0.2)

    def wait_exit(self, name: str, deadline: float) -> None:
        for proc in self.procs[name]:
            code = proc.popen.wait(max(0.1, deadline - time.monotonic()))
            if code != 0:
                raise RuntimeError(f"{name} exited with {code}; see {proc.log_path}")

    def run(self, name: str, extra_env: Mapping[str, str] | None = None, timeout: float = 120) -> str:
        """Run a one-shot service to completion (after its dependencies); returns its output."""
        deadline = time.monotonic() + timeout
        for dep in self.services[name].depends_on:
            self._up(dep, deadline)
        proc = self.start(name, extra_env=extra_env)
        code = proc.popen.wait(timeout)
        proc.log.close()
        output = proc.log_path.read_text()
        if code != 0:
            raise RuntimeError(f"{name} exited with {code}: {output}")
        return output

    def down(self) -> None:
        for name in reversed(list(self.procs)):
            for proc in self.procs[name]:
                proc.stop()
        self.procs.clear()


def _local(value: str, paths: Mapping[str, Path]) -> str:
    """A container path in an environment value (NATS_NKEY=/etc/...), as the local path it maps to."""
    for inside, local in paths.items():
        if value == inside or value.startswith(inside + "/"):
            return str(local) + value[len(inside) :]
    return value
