"""`gymbus auth init`: one nkey per identity of broker/auth.py, and the server's authorization block.

    OUT/server/auth.conf          the ``authorization { users = [...] }`` block (public keys and
                                  permissions only; include it from the server's config)
    OUT/<identity>/<identity>.nk  that identity's seed, for its processes alone ($NATS_NKEY)

Each identity has a folder of its own so a container can be given exactly one (compose mounts the
folder as a volume subpath; Kubernetes makes one Secret of each). Seeds that exist are kept, so
running it again (another function added) changes only the server's block; ``rotate`` makes new ones.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import nkeys

from broker.auth import Identity, identities

SERVER_DIR = "server"
AUTH_CONF = "auth.conf"


@dataclass(frozen=True)
class Written:
    """What `write` produced."""

    server_conf: Path
    seeds: dict[str, Path]
    """identity name -> its seed file"""
    created: list[str]
    """identities whose seed was made now (the others were kept)"""


@dataclass(frozen=True)
class TlsFiles:
    """The broker's certificate and key, and the CA it checks client certificates against (mutual TLS)."""

    cert: Path
    key: Path
    ca: Path | None = None
    verify_clients: bool = False


def seed_path(out: Path, identity: str) -> Path:
    return out / identity / f"{identity}.nk"


def write(out: str | Path, agents: list[str], envs: list[str], *, rotate: bool = False) -> Written:
    """Seeds for every identity of the deployment (new ones only, unless ``rotate``) and the server's block."""
    out = Path(out)
    users: list[tuple[Identity, str]] = []
    seeds: dict[str, Path] = {}
    created: list[str] = []
    for ident in identities(agents, envs):
        path = seed_path(out, ident.name)
        if rotate or not path.is_file():
            _write_private(path, nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
            created.append(ident.name)
        seeds[ident.name] = path
        users.append((ident, public_key(path)))
    conf = out / SERVER_DIR / AUTH_CONF
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(authorization_block(users))
    return Written(conf, seeds, created)


def public_key(seed_file: Path) -> str:
    seed = seed_file.read_bytes().strip()
    try:
        return nkeys.from_seed(bytearray(seed)).public_key.decode()
    except nkeys.NkeysError as exc:
        raise ValueError(f"{seed_file}: not an nkey user seed ({type(exc).__name__})") from None


def authorization_block(users: list[tuple[Identity, str]]) -> str:
    """nats-server configuration text: every identity an nkey user with its own allow-lists."""
    lines = [
        "# Written by `gymbus auth init`: one nkey user per gymbus identity (broker/auth.py).",
        "authorization {",
        "  users = [",
    ]
    for ident, public in users:
        allows = ident.allows()
        permissions = {
            "publish": {"allow": allows["publish"]},
            "subscribe": {"allow": allows["subscribe"]},
        }
        lines.append(f"    # {ident.name}")
        lines.append(f"    {{nkey: {json.dumps(public)}, permissions: {json.dumps(permissions)}}}")
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


def tls_block(tls: TlsFiles) -> str:
    """nats-server configuration text for TLS on the client port."""
    lines = ["tls {", f"  cert_file: {json.dumps(str(tls.cert))}", f"  key_file: {json.dumps(str(tls.key))}"]
    if tls.ca is not None:
        lines.append(f"  ca_file: {json.dumps(str(tls.ca))}")
    if tls.verify_clients:
        lines.append("  verify: true")
    lines += ["  timeout: 5", "}", ""]
    return "\n".join(lines)


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data + b"\n")
    os.replace(tmp, path)
