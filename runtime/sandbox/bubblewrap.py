"""The ``bubblewrap`` backend: the process backend's limits, plus fresh namespaces (Debian's ``bwrap``).

The run sees a filesystem of its own: /usr (and the interpreter's prefix) read-only, a fresh /proc
of its own PID namespace, a minimal /dev, and size-limited tmpfs at /work (its files, copied in) and
/tmp; nothing of the host's /etc, /root or /home. It has no network (an empty network namespace),
its own IPC, UTS and user namespaces, and no way to make more (``--disable-userns``). It runs as a
uid of its own with the same rlimits, and the same seccomp filter is loaded by bwrap just before the
program starts. Needs unprivileged user namespaces (Debian's bwrap is not setuid).
"""

from __future__ import annotations

import asyncio
import os
import resource
from pathlib import Path, PurePosixPath

from runtime.errors import SandboxError
from runtime.sandbox import confine
from runtime.sandbox.config import SandboxConfig, bwrap_path
from runtime.sandbox.job import Job
from runtime.sandbox.outcome import Outcome
from runtime.sandbox.process import _interpreter_dirs
from runtime.sandbox.runner import execute
from runtime.sandbox.uids import UidPool, sweep

WORKDIR = "/work"
LINKABLE = ("/lib", "/lib64", "/lib32", "/bin", "/sbin")


class BubblewrapBackend:
    name = "bubblewrap"

    def __init__(self, config: SandboxConfig) -> None:
        bwrap = bwrap_path()
        if bwrap is None:
            raise SandboxError("the bubblewrap backend needs bwrap on PATH (apt-get install bubblewrap)")
        self.config = config
        self.bwrap = bwrap
        self.python = [config.interpreter()]
        self.root = os.geteuid() == 0
        if not self.root and not config.allow_same_uid:
            raise SandboxError(
                f"the {self.name} backend drops each run to a uid of its own and needs root for that "
                f"(running as uid {os.geteuid()}); run the worker as root, or set GYMBUS_SANDBOX_ALLOW_SAME_UID=1"
            )
        self.uids = UidPool(config.uid_base, config.uid_count) if self.root else None
        try:
            self.bpf = confine.seccomp_bpf()
        except confine.ConfineError as exc:
            raise SandboxError(str(exc)) from exc
        self.base = self._base_args()

    def _base_args(self) -> list[str]:
        args = [self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
        args += ["--new-session", "--clearenv", "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
        for path in LINKABLE:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for path in ("/etc/ld.so.cache", "/etc/localtime", *_interpreter_dirs(self.python[0])):
            args += ["--ro-bind-try", path, path]
        return [*args, "--proc", "/proc", "--dev", "/dev"]

    async def run(self, job: Job) -> Outcome:
        pool = self.uids
        uid, lock = pool.acquire() if pool is not None else (None, -1)
        swept = False
        fds: list[int] = []
        try:
            args = [*self.base]
            size = str(job.limits.file_mb * 1024 * 1024)
            args += ["--size", size, "--tmpfs", "/tmp", "--size", size, "--perms", "0755", "--tmpfs", WORKDIR]
            for name, content in job.files.items():
                for parent in reversed(PurePosixPath(name).parents[:-1]):
                    args += ["--dir", f"{WORKDIR}/{parent}"]
                fds.append(_memfd(name, content))
                args += ["--file", str(fds[-1]), f"{WORKDIR}/{name}"]
            fds.append(_memfd("seccomp", self.bpf))
            args += ["--seccomp", str(fds[-1]), "--chdir", WORKDIR, "--", *job.command(self.python)]
            limits = confine.rlimits(job.limits)
            if uid is None:
                limits = [(which, value) for which, value in limits if which != resource.RLIMIT_NPROC]
            spawn: dict[str, object] = {"preexec_fn": confine.preexec(limits, None, None), "pass_fds": fds}
            if uid is not None:
                spawn.update(user=uid, group=uid, extra_groups=[])

            async def cleanup() -> None:
                nonlocal swept
                if uid is not None:
                    await asyncio.to_thread(sweep, uid)
                swept = True

            return await execute(
                args,
                backend=self.name,
                limits=job.limits,
                stdin=job.stdin,
                cwd="/",
                spawn=spawn,
                cleanup=cleanup,
                status=_bwrap_status,
            )
        finally:
            for fd in fds:
                os.close(fd)
            if uid is not None and pool is not None:
                if not swept:  # cancelled or failed before its cleanup: never hand the uid on with processes
                    sweep(uid)
                pool.release(uid, lock)


def _memfd(name: str, content: bytes) -> int:
    fd = os.memfd_create(Path(name).name or "file", 0)  # no MFD_CLOEXEC: bwrap reads it by number
    os.write(fd, content)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _bwrap_status(code: int) -> int:
    """bwrap exits 128 + N when the program was killed by signal N: back to a signal."""
    return -(code - 128) if 128 < code < 128 + 65 else code
