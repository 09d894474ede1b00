"""compose.yaml read as a specification, and its services run as local processes.

There is no Docker engine where gymbus is built and tested. The tests therefore read compose.yaml and
the Dockerfiles the way compose and the engine do (variable interpolation, entrypoint plus command,
image ENV under the service's environment, health checks, depends_on conditions, replicas) and run
each service's own command as a plain process: the same command line, config files and environment,
with service hostnames mapped to 127.0.0.1, container ports to free local ports and container paths to
the repository's files (the images' WORKDIR holds the repository's layout, so the working directory is
the repository root).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import dockerfile
import typer
import yaml

from broker.server import binary, die_with_parent
from runtime.cli import app
from runtime.stack import gymbus_command

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "compose.yaml"

_VAR = re.compile(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?[-+?])(?P<arg>[^}]*))?\}|\$(?P<bare>[A-Za-z_]\w*)")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:+alt}`` and ``$$``."""

    def value(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group("name") or m.group("bare"), m.group("op") or "", m.group("arg") or ""
        current = env.get(name)
        if op in (":?", "?") and not (current if op == ":?" else current is not None):
            raise KeyError(f"compose.yaml requires {name}: {arg}")
        if op == ":-":
            return current or arg
        if op == "-":
            return arg if current is None else current
        if op == ":+":
            return arg if current else ""
        if op == "+":
            return "" if current is None else arg
        return current or ""

    return _VAR.sub(value, text)


def _map_strings(obj: Any, f: Callable[[str], str]) -> Any:
    if isinstance(obj, str):
        return f(obj)
    if isinstance(obj, list):
        return [_map_strings(x, f) for x in obj]
    if isinstance(obj, dict):
        return {k: _map_strings(v, f) for k, v in obj.items()}
    return obj


def load_compose(env: Mapping[str, str] | None = None, path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """compose.yaml with anchors merged and variables interpolated from ``env`` (default: none set)."""
    raw = yaml.safe_load(path.read_text())
    return _map_strings(raw, lambda s: interpolate(s, env or {}))


def nats_config(path: Path = ROOT / "configs" / "nats-server.conf") -> dict[str, str]:
    """The ``key: value`` settings of the nats-server config (blocks flattened; enough for the checks)."""
    return dict(re.findall(r"^\s*(\w+):\s*(\S+)", path.read_text(), flags=re.M))


# ---- images ------------------------------------------------------------------------------------


@dataclass
class Image:
    """What a Dockerfile's final stage gives a container (with build args substituted)."""

    path: Path
    stages: list[list[dockerfile.Command]]
    args: dict[str, str] = field(default_factory=dict)
    """Build arguments: the global ARG defaults, then the ones given to the build."""

    def final(self, cmd: str) -> list[dockerfile.Command]:
        return [c for c in self.stages[-1] if c.cmd == cmd]

    @property
    def base(self) -> str:
        """The final stage's base image."""
        return self._sub(self.stages[-1][0].value[0])

    def _sub(self, text: str) -> str:
        return interpolate(text, self.args)

    @property
    def entrypoint(self) -> list[str]:
        found = self.final("ENTRYPOINT")
        return _exec_form(found[-1]) if found else []

    @property
    def cmd(self) -> list[str]:
        found = self.final("CMD")
        return _exec_form(found[-1]) if found else []

    @property
    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for c in self.final("ENV"):
            pairs = c.value
            out.update({pairs[i]: self._sub(pairs[i + 1]) for i in range(0, len(pairs), 2)})
        return out

    @property
    def expose(self) -> list[int]:
        return [int(p.split("/")[0]) for c in self.final("EXPOSE") for p in c.value]

    @property
    def healthcheck(self) -> list[str] | None:
        found = self.final("HEALTHCHECK")
        return list(found[-1].value) if found else None

    @property
    def user(self) -> str:
        found = self.final("USER")
        return found[-1].value[0] if found else "root"

    @property
    def copies(self) -> dict[str, str]:
        """Absolute destination -> source in the build context, for the final stage's plain COPYs."""
        out = {}
        for c in self.final("COPY"):
            if any(f.startswith("--from") for f in c.flags):
                continue
            *sources, dest = c.value
            if dest.startswith("/") and len(sources) == 1:
                out[dest] = sources[0]
        return out


def _exec_form(c: dockerfile.Command) -> list[str]:
    return list(c.value) if c.json else ["/bin/sh", "-c", c.value[0]]


def image_of(build: Mapping[str, Any]) -> Image:
    """The image a compose ``build`` section builds (context, dockerfile, args)."""
    context = ROOT / build.get("context", ".")
    path = context / build.get("dockerfile", "Dockerfile")
    stages: list[list[dockerfile.Command]] = []
    args: dict[str, str] = {}
    for c in dockerfile.parse_file(str(path)):
        if c.cmd == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(c)
        elif c.cmd == "ARG" and "=" in c.value[0]:
            args.update([c.value[0].split("=", 1)])
    args.update({str(k): str(v) for k, v in (build.get("args") or {}).items()})
    return Image(path, stages, args)


# ---- services ----------------------------------------------------------------------------------


def _argv(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


@dataclass
class Service:
    name: str
    spec: dict[str, Any]
    image: Image | None

    @property
    def profiles(self) -> list[str]:
        return list(self.spec.get("profiles") or [])

    @property
    def argv(self) -> list[str]:
        """What the container runs: entrypoint then command (compose's rules for overriding either)."""
        entry = _argv(self.spec["entrypoint"]) if "entrypoint" in self.spec else self.image_entrypoint
        if "command" in self.spec:
            command = _argv(self.spec["command"])
        else:
            command = [] if "entrypoint" in self.spec or not self.image else self.image.cmd
        return entry + command

    @property
    def image_entrypoint(self) -> list[str]:
        return self.image.entrypoint if self.image else []

    @property
    def runs_gymbus(self) -> bool:
        return bool(self.argv) and self.argv[0] == "gymbus"

    @property
    def env(self) -> dict[str, str]:
        out = dict(self.image.env) if self.image else {}
        out.pop("PATH", None)  # the container's own PATH
        environment = self.spec.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(item.split("=", 1) for item in environment)
        out.update({k: "" if v is None else str(v) for k, v in environment.items()})
        return out

    @property
    def healthcheck(self) -> list[str] | None:
        """The health check as argv (compose's, else the image's); None if there is none or it is disabled."""
        check = self.spec.get("healthcheck")
        if check is not None:
            if check.get("disable"):
                return None
            test = check.get("test")
        else:
            test = self.image.healthcheck if self.image else None
        if test is None:
            return None
        test = _argv(test) if isinstance(test, list) else ["CMD-SHELL", test]
        if test[0] == "NONE":
            return None
        return test[1:] if test[0] == "CMD" else ["/bin/sh", "-c", test[1]]

    @property
    def ports(self) -> set[int]:
        """Ports the service listens on in its container: expose, ports (targets) and the image's EXPOSE."""
        out = {int(str(p)) for p in self.spec.get("expose") or []}
        for p in self.spec.get("ports") or []:
            out.add(int(str(p).rsplit(":", 1)[-1].split("/")[0]) if not isinstance(p, dict) else int(p["target"]))
        return out | set(self.image.expose if self.image else [])

    @property
    def depends_on(self) -> dict[str, str]:
        deps = self.spec.get("depends_on") or {}
        if isinstance(deps, list):
            return {d: "service_started" for d in deps}
        return {name: (d or {}).get("condition", "service_started") for name, d in deps.items()}

    @property
    def one_shot(self) -> bool:
        return str(self.spec.get("restart", "no")) == "no"

    @property
    def replicas(self) -> int:
        return int((self.spec.get("deploy") or {}).get("replicas", 1))

    @property
    def build_args(self) -> dict[str, str]:
        return self.image.args if self.image else {}

    @property
    def mounts(self) -> list[tuple[str, str]]:
        """(source, container path) of each volume; a source starting with . is a file of the repository."""
        out = []
        for v in self.spec.get("volumes") or []:
            source, target = (v["source"], v["target"]) if isinstance(v, dict) else v.split(":")[:2]
            out.append((source, target))
        return out


def services(compose: Mapping[str, Any] | None = None) -> dict[str, Service]:
    compose = compose if compose is not None else load_compose()
    out = {}
    for name, spec in compose["services"].items():
        build = spec.get("build")
        if isinstance(build, str):
            build = {"context": build}
        out[name] = Service(name, spec, image_of(build) if build else None)
    return out


# ---- the real CLI ------------------------------------------------------------------------------


@contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """os.environ with ``env`` set (and other GYMBUS_/OTEL_ variables removed), restored after."""
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith(("GYMBUS_", "OTEL_"))]:
        del os.environ[key]
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def gymbus_command_of(args: list[str]) -> tuple[Any, list[str]]:
    """The (click) command ``gymbus ARGS`` names, through sub-groups, and the arguments left for it.

    typer carries its own copy of click, so commands are recognised by what they do, not by class.
    """
    cmd = typer.main.get_command(app)
    rest = list(args)
    while hasattr(cmd, "list_commands"):
        if not rest:
            raise LookupError(f"`gymbus {' '.join(args)}`: missing command")
        name, rest = rest[0], rest[1:]
        sub = cmd.get_command(cmd.context_class(cmd), name)
        if sub is None:
            raise LookupError(f"`gymbus {' '.join(args)}`: no such command {name!r}")
        cmd = sub
    return cmd, rest


def parse_gymbus(args: list[str], env: Mapping[str, str]) -> Any:
    """Parse ``gymbus ARGS`` with the real CLI under ``env``, without running it; returns the context.

    An unknown command or option, a missing argument or a value of the wrong type raises click's error.
    """
    cmd, rest = gymbus_command_of(args)
    with environment(env):
        return cmd.make_context(cmd.name or "gymbus", rest)


def envvars_read_by(args: list[str]) -> set[str]:
    cmd, _ = gymbus_command_of(args)
    out: set[str] = set()
    for p in cmd.params:
        out |= {p.envvar} if isinstance(p.envvar, str) else set(p.envvar or [])
    return out


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
        out = {dest: ROOT / src for dest, src in (svc.image.copies if svc.image else {}).items()}
        volumes = {t: s for s, t in svc.mounts if not s.startswith((".", "/", "~"))}
        for target, volume in volumes.items():
            out[target] = self.workdir / "volumes" / volume
            out[target].mkdir(parents=True, exist_ok=True)
        for source, target in svc.mounts:
            if source.startswith("."):
                local = self.workdir / "mounts" / name / Path(source).name
                local.parent.mkdir(parents=True, exist_ok=True)
                local.write_text(self.net.file((ROOT / source).read_text(), name, volumes_as_paths(volumes, out)))
                out[target] = local
        return out

    def argv(self, name: str, argv: list[str], replica: int = 0) -> list[str]:
        paths = self.paths(name)
        exe = EXECUTABLES.get(argv[0])
        if exe is None:
            raise LookupError(f"service {name} runs {argv[0]!r}, which has no local equivalent here")
        return exe + [str(paths[a]) if a in paths else self.net.token(a, name, replica) for a in argv[1:]]

    def env(self, name: str, replica: int = 0, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("GYMBUS_", "OTEL_", "NATS_"))}
        own = {k: self.net.token(v, name, replica) for k, v in self.services[name].env.items()}
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


def volumes_as_paths(volumes: Mapping[str, str], paths: Mapping[str, Path]) -> dict[str, Path]:
    return {target: paths[target] for target in volumes}
