"""Server instances an environment starts itself (the NeMo Gym and OpenEnv bridges): one child
process each, on a free loopback port.

An instance has a name no other start of it shares (``<server>_<8 hex>``), so a server that answers
at the same address after a restart is told apart from the one a rollout was pinned to. Children
die with the worker process that started them (their rollouts then end as ``env_lost``); one that
died is replaced, on a new port under a new name, the next time an instance is asked for.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import aiohttp
import msgspec

from broker.server import die_with_parent
from runtime.errors import ToolError

log = logging.getLogger("gymbus.bridges")

S = TypeVar("S", bound=msgspec.Struct)

RETRY_START_S = 30.0
"""How long a pool whose instances failed to start fails at once instead of starting them again."""


class SetupError(ToolError):
    """A bridge cannot reach or start an instance as configured: retrying will not help."""

    retry = False


def read_settings(path: Path, kind: type[S], what: str, env_var: str) -> S:
    """A bridge's YAML settings file decoded as ``kind``, read again only once it changes; SetupError
    naming the file (``what``, and the variable that names another) if it is missing or wrong."""
    try:
        mtime = path.stat().st_mtime
    except OSError:
        raise SetupError(f"{what} {str(path)!r} does not exist ({env_var})") from None
    return _decode(path, mtime, kind, what)


@functools.cache
def _decode(path: Path, _mtime: float, kind: type[S], what: str) -> S:
    try:
        return msgspec.yaml.decode(path.read_bytes(), type=kind)
    except (OSError, msgspec.DecodeError) as exc:
        raise SetupError(f"{what} {str(path)!r}: {exc}") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def instance_name(server: str) -> str:
    return f"{server}_{secrets.token_hex(4)}"


@dataclass
class Child:
    """One started instance: its name, address and process."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    started_at: float = field(default_factory=time.time)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""


def spawn(name: str, port: int, cmd: Sequence[str], *, cwd: Path, env: dict[str, str], log_dir: Path) -> Child:
    """Start ``cmd`` as an instance listening on ``port``; its output goes to ``log_dir/<name>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            list(cmd),
            cwd=cwd,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    return Child(name, f"http://127.0.0.1:{port}", proc, log_path)


async def wait_ready(child: Child, path: str = "/", timeout_s: float = 180.0) -> None:
    """Wait until the instance answers ``GET path`` with 200; RuntimeError with its log's tail if it
    exits or does not answer in time."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited ({child.proc.returncode}) while starting: {child.tail()}")
            try:
                async with http.get(child.url + path, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.2)
    child.stop()
    raise RuntimeError(f"{child.name} did not answer at {child.url} within {timeout_s:g} s: {child.tail()}")


class Pool:
    """The instances of one server this worker process runs: started on first use, replaced when dead."""

    def __init__(self, server: str, size: int, start: Callable[[str, int], Child], ready_path: str = "/") -> None:
        self.server, self.size, self._start, self.ready_path = server, size, start, ready_path
        self.children: list[Child] = []
        self._lock = asyncio.Lock()
        self._failed: tuple[float, str] | None = None

    async def live(self) -> list[Child]:
        """The pool's live instances, starting (or replacing) what is missing. A start that failed is
        not tried again for ``RETRY_START_S``: the calls meanwhile fail at once, with its reason."""
        async with self._lock:
            if self._failed is not None and time.monotonic() - self._failed[0] < RETRY_START_S:
                raise RuntimeError(self._failed[1])
            dead = [c for c in self.children if not c.alive()]
            for c in dead:
                log.warning("%s (%s) died (%s); starting another", c.name, c.url, c.proc.returncode)
                self.children.remove(c)
            missing = [
                self._start(instance_name(self.server), free_port()) for _ in range(self.size - len(self.children))
            ]
            try:
                await asyncio.gather(*(wait_ready(c, self.ready_path) for c in missing))
            except BaseException as exc:
                for c in missing:
                    c.stop()
                if isinstance(exc, RuntimeError):
                    self._failed = (time.monotonic(), str(exc))
                raise
            self._failed = None
            self.children += missing
            return list(self.children)

    def close(self) -> None:
        for c in self.children:
            c.stop()
        self.children.clear()
