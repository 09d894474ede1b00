"""A lazy mount for power-cut tests: file data is held in memory until fsync, and lost on a cut.

    with LazyMount(tmp / "disk", tmp / "mnt") as m:   # everything written under mnt/ ...
        ...                                           # ... lands in disk/ only when fsynced
        m.cut()                                       # power cut: every unsynced write is gone
        m.start()                                     # "reboot": mnt/ shows what disk/ kept

The file system is tests/lazyfs/fs.py (LazyFS's model, written for these tests); it runs as its
own process (``python -m tests.lazyfs``) so that SIGKILL takes its memory with it. It needs
/dev/fuse, ``fusermount3`` (Debian: fuse3) and the ``mfusepy`` bindings; `unavailable()` says
which is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def unavailable() -> str | None:
    """Why a lazy mount cannot run here, or None if it can."""
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"/dev/fuse cannot be opened ({exc.strerror})"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian: apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"the FUSE bindings cannot load ({exc}; pip install mfusepy, apt-get install fuse3)"
    return None


class LazyMount:
    """One lazy mount of ``backing`` (the disk) on ``mountpoint``, as a child process."""

    def __init__(self, backing: str | Path, mountpoint: str | Path, log: str | Path | None = None) -> None:
        self.backing = Path(backing)
        self.mountpoint = Path(mountpoint)
        self.log = Path(log) if log else self.backing.parent / f"{self.mountpoint.name}.lazyfs.log"
        self._ctl_dir = tempfile.mkdtemp(prefix="lazyfs-")
        self.control = os.path.join(self._ctl_dir, "control.sock")
        self.proc: subprocess.Popen[bytes] | None = None
        self.cuts = 0

    def start(self, timeout: float = 20.0) -> LazyMount:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "tests.lazyfs", str(self.backing), str(self.mountpoint), "--control", self.control]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self.mounted():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the lazy mount exited with {self.proc.returncode}; see {self.log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the lazy mount did not come up within {timeout}s; see {self.log}")
            time.sleep(0.02)
        return self

    def mounted(self) -> bool:
        target = str(self.mountpoint.resolve())
        with open("/proc/self/mounts") as mounts:
            return any(line.split()[1] == target and "fuse" in line.split()[2] for line in mounts)

    def report(self) -> dict[str, Any]:
        """What a cut now would lose: ``unsynced`` (bytes per file) and the write/fsync counts."""
        return self._ask(b"report")

    def checkpoint(self) -> int:
        """Write every unsynced file to the disk, as a clean shutdown would; returns how many."""
        return int(self._ask(b"checkpoint")["flushed"])

    def _ask(self, command: bytes, timeout: float = 30.0) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(self.control)
            s.sendall(command + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        return json.loads(data)

    def cut(self) -> None:
        """The power cut: the file system dies with every unsynced write; the mount is torn down."""
        self._kill()
        self.cuts += 1

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None
        self._unmount()

    def _unmount(self) -> None:
        deadline = time.monotonic() + 10
        while self.mounted():
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.mountpoint} is still mounted")
            time.sleep(0.05)

    def stop(self) -> None:
        """A clean shutdown: everything written reaches the disk, then the mount goes away."""
        if self.proc is not None and self.proc.poll() is None:
            self.checkpoint()
            subprocess.run(["fusermount3", "-u", str(self.mountpoint)], capture_output=True)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self._kill()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        shutil.rmtree(self._ctl_dir, ignore_errors=True)

    def __enter__(self) -> LazyMount:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
