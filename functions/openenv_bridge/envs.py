"""Which OpenEnv environments the bridge reaches, and the session hosts in front of them.

The environments file (``GYMBUS_OPENENV_ENVS``, else ``envs.yaml`` beside this module) names each
OpenEnv server once, by a key rows are routed by: its ``url`` (a process or a container, already
running), and either the session hosts already running in front of it (``host_urls``: ``python -m
functions.openenv_bridge.host``) or how many the bridge starts itself (``hosts``, per worker process).
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from runtime.instances import Child, Pool, SetupError, read_settings, spawn
from runtime.sdk import InvalidInput

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


class EnvSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    url: str
    """The OpenEnv server's base URL (HTTP; its WebSocket is ``/ws``)."""
    hosts: int = 1
    """Session hosts the bridge starts per worker process (without ``host_urls``)."""
    host_urls: list[str] = []
    """Session hosts already running in front of it."""


class EnvsFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    environments: dict[str, EnvSpec]
    log_dir: str | None = None


def envs_path() -> Path:
    return Path(os.environ.get("GYMBUS_OPENENV_ENVS") or HERE / "envs.yaml")


def settings() -> EnvsFile:
    return read_settings(envs_path(), EnvsFile, "OpenEnv environments file", "GYMBUS_OPENENV_ENVS")


def key_of(named: str | None) -> str:
    """The configured environment a row plays: the one it names, else the only one configured."""
    keys = settings().environments
    if named is not None:
        if named not in keys:
            raise InvalidInput(
                f"task field `openenv.env` {named!r} is not a configured OpenEnv environment ({sorted(keys)})"
            )
        return named
    if len(keys) == 1:
        return next(iter(keys))
    raise InvalidInput(f"the task row names no OpenEnv environment: give it `openenv.env` (one of {sorted(keys)})")


_POOLS: dict[str, Pool] = {}


async def hosts(key: str) -> list[tuple[str, str | None]]:
    """The session hosts rows of ``key`` may be pinned to: (url, its name when the bridge started it)."""
    spec = settings().environments[key]
    if spec.host_urls:
        return [(u.rstrip("/"), None) for u in spec.host_urls]
    pool = _POOLS.get(key)
    if pool is None:
        pool = _POOLS[key] = Pool(f"openenv_{key}", spec.hosts, functools.partial(_start, spec.url))
    try:
        children = await pool.live()
    except RuntimeError as exc:
        raise SetupError(f"the session host of OpenEnv environment {key!r} did not start: {exc}") from None
    return [(c.url, c.name) for c in children]


def pools() -> dict[str, Pool]:
    return _POOLS


def close() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


def _start(target: str, name: str, port: int) -> Child:
    cmd = [
        sys.executable,
        "-m",
        "functions.openenv_bridge.host",
        "--target",
        target,
        "--port",
        str(port),
        "--name",
        name,
    ]
    env: dict[str, Any] = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    log_dir = Path(settings().log_dir or Path(tempfile.gettempdir()) / "gymbus-openenv")
    return spawn(name, port, cmd, cwd=REPO, env=env, log_dir=log_dir)
