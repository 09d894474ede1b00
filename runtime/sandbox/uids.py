"""A uid of its own for every run on this host, and the sweep that leaves no process of it behind.

RLIMIT_NPROC counts processes per uid, and it does nothing for uid 0, so each run drops to a uid no
other running sandbox has (``uid_base + i``, held through an flock on a lock file, so worker
processes on one host never share one and a crashed holder frees its uid). When the run ends, every
process of that uid is killed, including any that left the process group with ``setsid``.
"""

from __future__ import annotations

import fcntl
import os
import random
import signal
import tempfile
import time
from pathlib import Path

CLEAN = b"clean"


class UidPool:
    def __init__(self, base: int, count: int, lock_dir: str | Path | None = None) -> None:
        self.base = base
        self.count = count
        self.lock_dir = Path(lock_dir or Path(tempfile.gettempdir()) / "gymbus-uids")
        self.lock_dir.mkdir(mode=0o700, exist_ok=True)

    def acquire(self) -> tuple[int, int]:
        """A free uid and the lock fd that holds it (give both back to `release`)."""
        start = random.randrange(self.count)
        for i in range(self.count):
            uid = self.base + (start + i) % self.count
            fd = os.open(self.lock_dir / f"{uid}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            if os.pread(fd, 5, 0) != CLEAN:  # a holder that crashed may have left processes behind
                sweep(uid)
            os.pwrite(fd, b"dirty", 0)
            return uid, fd
        raise RuntimeError(f"all {self.count} sandbox uids from {self.base} are in use on this host")

    def release(self, uid: int, fd: int) -> None:
        """Give the uid back; the caller has swept it (a crash before that leaves it marked dirty)."""
        try:
            os.pwrite(fd, CLEAN, 0)
        finally:
            os.close(fd)


def processes_of(uid: int) -> list[int]:
    """Live (not zombie) processes whose owner is ``uid``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rpartition(b")")[2].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def sweep(uid: int, rounds: int = 50) -> int:
    """SIGKILL every process of ``uid`` until none is left (a fork loop cannot outrun this: its
    process count is capped); returns how many were killed."""
    killed = 0
    for _ in range(rounds):
        pids = processes_of(uid)
        if not pids:
            return killed
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.001)
    return killed
