"""Which NeMo Gym resources servers the bridge reaches, and the instances it runs itself.

The servers file (``GYMBUS_NEMO_GYM_SERVERS``, else ``servers.yaml`` beside this module) names each
server once, by a key rows are routed by, with either the ``urls`` of instances already running or
how many ``instances`` the bridge starts itself. A started instance is the server's own code, run
unchanged as its own process by the interpreter of its own environment (``python``: one with
nemo-gym installed), with its configuration in NeMo Gym's environment variables, exactly as NeMo
Gym's CLI starts it; its config name carries a nonce, so it is told apart from any other start.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from runtime.instances import Child, Pool, SetupError, read_settings, spawn
from runtime.sdk import InvalidInput

HERE = Path(__file__).resolve().parent


class ServerSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    server: str | None = None
    """The resources server (``resources_servers/<server>`` of nemo-gym); default: the key."""
    urls: list[str] = []
    """Instances already running (started elsewhere): the bridge starts none."""
    instances: int = 1
    """Without ``urls``: how many instances each worker process starts."""
    config: dict[str, Any] = {}
    """The server's config fields, over those of its ``configs/<server>.yaml``."""
    python: str | None = None
    dir: str | None = None
    """The server's folder (default: found in ``python``'s nemo-gym)."""


class ServersFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    servers: dict[str, ServerSpec]
    python: str | None = None
    """An interpreter with nemo-gym installed (default: ``$GYMBUS_NEMO_GYM_PYTHON``)."""
    log_dir: str | None = None


def servers_path() -> Path:
    return Path(os.environ.get("GYMBUS_NEMO_GYM_SERVERS") or HERE / "servers.yaml")


def settings() -> ServersFile:
    return read_settings(servers_path(), ServersFile, "NeMo Gym servers file", "GYMBUS_NEMO_GYM_SERVERS")


def key_of(meta: Mapping[str, Any]) -> str:
    """The configured server a row goes to: its ``resources_server`` field, else the server its
    ``agent_ref`` names (``mcqa_simple_agent`` -> ``mcqa``: the key, or the longest key it starts
    with followed by ``_``), else the only server configured."""
    keys = settings().servers
    named = meta.get("resources_server")
    if named is not None:
        if named not in keys:
            raise InvalidInput(f"task field `resources_server` {named!r} is not a configured server ({sorted(keys)})")
        return str(named)
    ref = meta.get("agent_ref")
    name = ref.get("name") if isinstance(ref, dict) else None
    if isinstance(name, str):
        found = [k for k in keys if name == k or name.startswith(f"{k}_")]
        if found:
            return max(found, key=len)
    if len(keys) == 1:
        return next(iter(keys))
    raise InvalidInput(
        "the task row names no configured NeMo Gym server: give it `resources_server` "
        f"(one of {sorted(keys)}) or an `agent_ref` naming one"
    )


def server_name(key: str) -> str:
    spec = settings().servers[key]
    return spec.server or key


_POOLS: dict[str, Pool] = {}


async def targets(key: str) -> list[tuple[str, str | None]]:
    """The instances rows of ``key`` may be pinned to: (url, the instance's name when the bridge started it)."""
    spec = settings().servers[key]
    if spec.urls:
        return [(u.rstrip("/"), None) for u in spec.urls]
    pool = _POOLS.get(key)
    if pool is None:
        pool = _POOLS[key] = Pool(spec.server or key, spec.instances, functools.partial(_start, key))
    try:
        children = await pool.live()
    except RuntimeError as exc:
        raise SetupError(f"NeMo Gym server {key!r} did not start: {exc}") from None
    return [(c.url, c.name) for c in children]


def pools() -> dict[str, Pool]:
    """The instances this process started, by server key (tests kill them)."""
    return _POOLS


def close() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


def _start(key: str, name: str, port: int) -> Child:
    file, spec = settings(), settings().servers[key]
    server = spec.server or key
    python = _python(spec.python or file.python)
    folder = Path(spec.dir) if spec.dir else _servers_root(python) / server
    if not (folder / "app.py").exists() and "entrypoint" not in spec.config:
        raise SetupError(f"NeMo Gym server {key!r}: no {folder}/app.py (set `dir` to the server's folder)")
    config = {**_own_config(folder, server), **spec.config, "host": "127.0.0.1", "port": port}
    config.setdefault("entrypoint", "app.py")
    global_config = {
        "head_server": {"host": "127.0.0.1", "port": 1},
        "dry_run": False,
        name: {"resources_servers": {server: config}},
    }
    env = {
        "NEMO_GYM_CONFIG_DICT": json.dumps(global_config),  # JSON is YAML: what NeMo Gym's CLI hands its servers
        "NEMO_GYM_CONFIG_PATH": name,
        "PYTHONUNBUFFERED": "1",
    }
    log_dir = Path(file.log_dir or Path(tempfile.gettempdir()) / "gymbus-nemo-gym")
    return spawn(name, port, [python, str(config["entrypoint"])], cwd=folder, env=env, log_dir=log_dir)


def _python(configured: str | None) -> str:
    """The interpreter of NeMo Gym's environment: the servers file's (relative to the file), else
    ``$GYMBUS_NEMO_GYM_PYTHON`` (relative to the working directory)."""
    if configured:
        path = Path(configured).expanduser()
        return str(path if path.is_absolute() or os.sep not in configured else servers_path().parent / path)
    python = os.environ.get("GYMBUS_NEMO_GYM_PYTHON")
    if not python:
        raise SetupError(
            "no interpreter for NeMo Gym: set GYMBUS_NEMO_GYM_PYTHON (or `python:` in the servers file) to a "
            "Python that has nemo-gym installed (functions/nemo_gym_bridge/README.md)"
        )
    return str(Path(python).expanduser().absolute()) if os.sep in python else python


@functools.cache
def _servers_root(python: str) -> Path:
    code = "import resources_servers as r; print(list(r.__path__)[0])"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SetupError(f"{python} cannot import nemo-gym's resources_servers: {exc}") from None
    return Path(out.stdout.strip())


def _own_config(folder: Path, server: str) -> dict[str, Any]:
    """The server's block of its own ``configs/<server>.yaml`` (its defaults), if it has one."""
    path = folder / "configs" / f"{server}.yaml"
    try:
        raw = msgspec.yaml.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return {}
    for top in raw.values() if isinstance(raw, dict) else []:
        block = top.get("resources_servers", {}).get(server) if isinstance(top, dict) else None
        if isinstance(block, dict):
            return dict(block)
    return {}
