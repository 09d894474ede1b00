"""The ``process`` backend: a confined child process, no privileges beyond the worker's own.

Each run gets a scratch directory and a uid of its own (as root: ``uid_base + i``, see uids.py), and
the child, between fork and exec, sets its rlimits, restricts itself with Landlock and loads the
seccomp filter (confine.py), with an empty environment, in its own process group. The interpreter
must be readable by that uid (``/usr/bin/python3`` by default; a pyenv under /root is not).
"""

from __future__ import annotations

import asyncio
import os
import resource
from pathlib import Path

from runtime.errors import SandboxError
from runtime.sandbox import confine
from runtime.sandbox.config import SandboxConfig
from runtime.sandbox.job import Job, remove, scratch_dir, write_files
from runtime.sandbox.outcome import Outcome
from runtime.sandbox.runner import execute
from runtime.sandbox.uids import UidPool, sweep


class ProcessBackend:
    name = "process"

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.python = [config.interpreter()]
        self.readable = _interpreter_dirs(self.python[0])
        self.root = os.geteuid() == 0
        if not self.root and not config.allow_same_uid:
            raise SandboxError(
                f"the {self.name} backend drops each run to a uid of its own and needs root for that "
                f"(running as uid {os.geteuid()}); run the worker as root, or set GYMBUS_SANDBOX_ALLOW_SAME_UID=1 "
                "to run as this uid without a per-run process limit"
            )
        self.uids = UidPool(config.uid_base, config.uid_count) if self.root else None
        try:
            self.seccomp = confine.compiled_filter()
        except confine.ConfineError as exc:
            raise SandboxError(str(exc)) from exc

    async def run(self, job: Job) -> Outcome:
        pool = self.uids
        uid, lock = pool.acquire() if pool is not None else (None, -1)
        swept = False
        scratch = scratch_dir(self.config.scratch_root, uid)
        ruleset = None
        try:
            write_files(scratch, job.files, uid)
            try:
                ruleset = confine.landlock_ruleset(scratch, self.readable)
            except confine.ConfineError as exc:
                raise SandboxError(str(exc)) from exc
            limits = confine.rlimits(job.limits)
            if uid is None:  # same uid as the worker: a process limit would count the worker's own
                limits = [(which, value) for which, value in limits if which != resource.RLIMIT_NPROC]
            spawn: dict[str, object] = {"preexec_fn": confine.preexec(limits, ruleset, self.seccomp)}
            if uid is not None:
                spawn.update(user=uid, group=uid, extra_groups=[])

            async def cleanup() -> None:
                nonlocal swept
                if uid is not None:
                    await asyncio.to_thread(sweep, uid)
                swept = True

            return await execute(
                job.command(self.python),
                backend=self.name,
                limits=job.limits,
                stdin=job.stdin,
                cwd=str(scratch),
                spawn=spawn,
                cleanup=cleanup,
            )
        finally:
            confine.close_ruleset(ruleset)
            remove(scratch)
            if uid is not None and pool is not None:
                if not swept:  # cancelled or failed before its cleanup: never hand the uid on with processes
                    sweep(uid)
                pool.release(uid, lock)


def _interpreter_dirs(python: str) -> list[str]:
    """Where the interpreter and its standard library live, when that is outside the system dirs."""
    real = Path(os.path.realpath(python))
    prefix = real.parent.parent  # <prefix>/bin/python3
    return [str(prefix)] if not str(prefix).startswith("/usr") else []
