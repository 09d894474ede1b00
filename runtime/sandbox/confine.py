"""The confinement a sandboxed process gets between fork and exec: rlimits, Landlock, seccomp.

Everything that opens files or resolves symbols is prepared in the parent (the seccomp filter once
per process, the Landlock ruleset per run); between fork and exec the child only calls functions
already resolved, so it cannot deadlock on a lock (the loader's, an import's) another thread of the
worker held at fork time.

- rlimits: CPU, address space, file size, processes, open files; no core dumps; nice 10.
- Landlock (filesystem allow-list): read and execute the interpreter and the system libraries,
  read-write the run's scratch directory and /dev/null; everything else (/etc/passwd, /root, the
  worker's files, /proc) is denied.
- seccomp (``pyseccomp`` over libseccomp, a deny list; everything else allowed): no sockets (so no
  network and no Unix sockets), no ptrace or cross-process memory access, no mount, unshare, setns
  or namespace-creating clone, no bpf, keyctl, perf_event_open, userfaultfd, io_uring, kernel modules
  or reboot; no signal to the worker, its process group or every process at once. ``clone3``
  answers ENOSYS so the C library falls back to ``clone``, whose flags seccomp can see.
"""

from __future__ import annotations

import ctypes
import errno
import io
import os
import resource
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from runtime.sandbox.config import Limits

DENIED_SYSCALLS: tuple[str, ...] = (
    "socket",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "bpf",
    "keyctl",
    "add_key",
    "request_key",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "syslog",
    "open_by_handle_at",
    "name_to_handle_at",
    "fsopen",
    "fsmount",
    "move_mount",
    "open_tree",
)
CLONE_NAMESPACE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)
READ_ONLY_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/localtime")
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


class ConfineError(RuntimeError):
    """The confinement cannot be prepared on this host (no Landlock, no libseccomp): a sandbox error."""


_FILTER: Any = None  # a pyseccomp.SyscallFilter (untyped)


def seccomp_filter() -> Any:
    """The process-wide deny-list filter (built once; loaded by every sandboxed child)."""
    global _FILTER
    if _FILTER is None:
        try:
            import pyseccomp as sc
        except (ImportError, OSError) as exc:  # OSError: libseccomp itself is missing
            raise ConfineError(
                f"seccomp is unavailable: {exc} (pip install pyseccomp; apt install libseccomp2)"
            ) from exc
        f = sc.SyscallFilter(sc.ALLOW)
        for name in DENIED_SYSCALLS:
            try:
                f.add_rule(sc.ERRNO(errno.EPERM), name)
            except (OSError, ValueError):
                continue  # a syscall this architecture does not have
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        for flag in CLONE_NAMESPACE_FLAGS:
            f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        _protect_worker(sc, f)
        _FILTER = f
    return _FILTER


def _protect_worker(sc: Any, f: Any) -> None:
    """No signal to this worker process or its group, and none to every process at once (kill -1),
    should a run share the worker's uid (``allow_same_uid``); as a uid of its own it could not anyway."""
    me, group = os.getpid(), os.getpgrp()
    targets = {"kill": (me, -group, -1), "tkill": (me,), "tgkill": (me,), "pidfd_open": (me,)}
    for name, pids in targets.items():
        for pid in pids:
            low = pid & 0xFFFFFFFF  # a pid_t: compare the low 32 bits, however the register was extended
            f.add_rule(sc.ERRNO(errno.EPERM), name, sc.Arg(0, sc.MASKED_EQ, 0xFFFFFFFF, low))


def seccomp_bpf() -> bytes:
    """The same filter as BPF, for a loader that takes a program (bubblewrap's ``--seccomp FD``)."""
    f = seccomp_filter()
    r, w = os.pipe()
    try:
        with io.FileIO(w, "w", closefd=False) as out:
            f.export_bpf(out)
        os.close(w)
        w = -1
        chunks = []
        while chunk := os.read(r, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class CompiledFilter:
    """The filter compiled to BPF once, loaded with one prctl in each child: libseccomp's own
    ``load`` regenerates the program every time, which cost a sandboxed run more CPU than its start."""

    def __init__(self, bpf: bytes) -> None:
        self._buf = ctypes.create_string_buffer(bpf, len(bpf))  # kept alive as long as the filter
        self._prog = _SockFprog(len(bpf) // 8, ctypes.cast(self._buf, ctypes.c_void_p))
        libc = ctypes.CDLL(None, use_errno=True)
        self._prctl = libc.prctl
        self._prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong)
        self._prctl.restype = ctypes.c_int

    def load(self) -> None:
        if self._prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if self._prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(self._prog), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


_COMPILED: CompiledFilter | None = None


def compiled_filter() -> CompiledFilter:
    """The deny list as a loadable BPF program (built once per process)."""
    global _COMPILED
    if _COMPILED is None:
        _COMPILED = CompiledFilter(seccomp_bpf())
    return _COMPILED


def landlock_ruleset(writable: Path, readable: Iterable[str]) -> Any:
    """A Landlock ruleset for one run: ``readable`` read+execute, ``writable`` everything, devices r/w."""
    try:
        import landlock
        from landlock import FSAccess
    except ImportError as exc:
        raise ConfineError(f"Landlock is unavailable: {exc} (pip install landlock)") from exc
    try:
        from landlock import plumbing

        abi = landlock.landlock_abi_version()
        ruleset = landlock.Ruleset()
        plumbing.get_prctl(), plumbing.get_restrict_self()  # resolved here: no dlsym between fork and exec
    except OSError as exc:
        raise ConfineError(f"Landlock is unavailable in this kernel: {exc}") from exc
    read = FSAccess.READ_FILE | FSAccess.READ_DIR | FSAccess.EXECUTE
    device = FSAccess.READ_FILE | FSAccess.WRITE_FILE | (FSAccess.TRUNCATE if abi >= 3 else 0)
    for path in dict.fromkeys([*READ_ONLY_PATHS, *readable]):
        if os.path.exists(path):
            ruleset.allow(path, rules=read if os.path.isdir(path) else FSAccess.READ_FILE | FSAccess.EXECUTE)
    for path in DEVICES:
        if os.path.exists(path):
            ruleset.allow(path, rules=device)
    ruleset.allow(str(writable))
    return ruleset


def close_ruleset(ruleset: Any) -> None:
    fd = getattr(ruleset, "_fd", None)
    if isinstance(fd, int) and fd >= 0:
        os.close(fd)


def rlimits(limits: Limits) -> list[tuple[int, tuple[int, int]]]:
    mb = 1024 * 1024
    return [
        (resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1)),
        (resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb)),
        (resource.RLIMIT_FSIZE, (limits.file_mb * mb, limits.file_mb * mb)),
        (resource.RLIMIT_NPROC, (limits.processes, limits.processes)),
        (resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files)),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_MEMLOCK, (0, 0)),
    ]


def preexec(limits: list[tuple[int, tuple[int, int]]], ruleset: Any, seccomp: Any) -> Callable[[], None]:
    """The function the child runs after fork (already as the run's uid) and before exec."""

    def confine() -> None:
        os.nice(10)
        for which, value in limits:
            resource.setrlimit(which, value)
        if ruleset is not None:
            ruleset.apply()  # also sets no_new_privs
        if seccomp is not None:
            seccomp.load()

    return confine
