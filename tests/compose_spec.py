"""compose.yaml and the Dockerfiles, read the way compose and the engine read them.

Variable interpolation, YAML anchors, entrypoint plus command, image ENV under the service's
environment, health checks (the service's, else the image's), ports, depends_on conditions, replicas
and mounts: what the consistency tests check, and what compose_local runs without an engine.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dockerfile
import yaml

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
        """(source, container path) of each volume; a source starting with . is a file of the repository, a
        volume's subpath is ``<volume>/<subpath>``."""
        out = []
        for v in self.spec.get("volumes") or []:
            source, target = (v["source"], v["target"]) if isinstance(v, dict) else v.split(":")[:2]
            subpath = (v.get("volume") or {}).get("subpath") if isinstance(v, dict) else None
            out.append((f"{source}/{subpath}" if subpath else source, target))
        return out


def services(compose: Mapping[str, Any] | None = None) -> dict[str, Service]:
    compose = compose if compose is not None else load_compose()
    builds: dict[str, dict[str, Any]] = {}
    for spec in compose["services"].values():
        if spec.get("build") and spec.get("image"):
            build = spec["build"]
            builds[spec["image"]] = {"context": build} if isinstance(build, str) else build
    out = {}
    for name, spec in compose["services"].items():
        build = spec.get("build")
        if isinstance(build, str):
            build = {"context": build}
        build = build or builds.get(spec.get("image", ""))  # an image another service builds
        out[name] = Service(name, spec, image_of(build) if build else None)
    return out
