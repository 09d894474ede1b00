"""One model replica: an OpenAI-compatible server process owned by a Ray actor.

`ReplicaServer` is a plain class; the launcher makes it a Ray actor (``ray.remote``), so nothing
here imports Ray. The actor holds the replica's GPUs (its placement-group bundle) and starts the
server command as a child process that dies with it; Ray restarts a dead actor, which starts the
server again on a new port, and the launcher re-registers the new URL.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from broker.server import die_with_parent


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host if host != "0.0.0.0" else "", 0))
        return int(sock.getsockname()[1])


def fill(command: list[str], **values: str) -> list[str]:
    """``{port}``, ``{host}``, ``{name}``, ``{python}`` placeholders in a command, replaced literally
    (so JSON arguments stay intact)."""
    out = []
    for arg in command:
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        out.append(arg)
    return out


class ReplicaServer:
    """Runs one server command; reports where it listens and whether it still runs."""

    def __init__(self, index: int, command: list[str], name: str, host: str, env: dict[str, str], log_dir: str) -> None:
        self.index = index
        self.port = free_port(host)
        self.host = host
        cmd = fill(command, port=str(self.port), host=host, name=name, python=sys.executable)
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.log_path = str(Path(log_dir) / f"replica-{index}.log")
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== replica {index} (pid {os.getpid()}): {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **env},
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    def status(self) -> tuple[str, int | None, int]:
        """(base URL, the server's exit code or None while it runs, its pid)."""
        return self.base_url(), self.proc.poll(), self.proc.pid

    def base_url(self) -> str:
        host = self.host
        if host in ("0.0.0.0", ""):
            import ray  # only ever called inside a Ray actor

            host = ray.util.get_node_ip_address()
        return f"http://{host}:{self.port}"

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM the server (its whole process group), SIGKILL it after ``timeout_s``."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode
