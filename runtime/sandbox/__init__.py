"""Run model-written code where it cannot escape: ``await run(code, files, stdin, limits) -> Outcome``.

    from runtime.sandbox import run
    outcome = await run("print(int(input()) * 2)", stdin="21\\n")
    outcome.verdict, outcome.stdout        # ('ok', '42\\n')

The Outcome's verdict is about the candidate (ok, error, timeout, memory, output_capped); when the
sandbox itself cannot run the code, ``run`` raises ``runtime.errors.SandboxError`` (failure kind
``sandbox_error``: retried per policy, never a reward). The backend and the limits come from
``GYMBUS_SANDBOX_*`` (see config.py), or from ``configure(...)``:

    config.py     Limits, SandboxConfig (GYMBUS_SANDBOX_BACKEND=process|bubblewrap|docker, ...)
    core.py       Sandbox: local and fleet admission, the backend, spans
    process.py    a child process: own uid, rlimits, Landlock, seccomp, empty env, own process group
    bubblewrap.py the same in fresh namespaces (bwrap)
    container.py  a throwaway container per run (the docker SDK)
    admission.py  the fleet-wide semaphore in the KV store (leases)
    escape.py     the escape suite: what hostile code tries, and the table of what happened
"""

from __future__ import annotations

from typing import Any

from runtime.sandbox.config import Limits, SandboxConfig
from runtime.sandbox.core import Sandbox
from runtime.sandbox.job import Files, Program
from runtime.sandbox.outcome import Outcome, Verdict

__all__ = ["Limits", "Outcome", "Sandbox", "SandboxConfig", "Verdict", "configure", "default", "run"]

_DEFAULT: Sandbox | None = None


def default() -> Sandbox:
    """This process's sandbox, configured from the environment on first use."""
    global _DEFAULT
    if _DEFAULT is None:
        try:
            config = SandboxConfig.from_env()
        except ValueError as exc:
            from runtime.errors import SandboxError

            raise SandboxError(str(exc)) from None
        _DEFAULT = Sandbox(config)
    return _DEFAULT


def configure(config: SandboxConfig | None = None, **overrides: Any) -> Sandbox:
    """Replace this process's sandbox (``config``, or the environment's with ``overrides``)."""
    global _DEFAULT
    _DEFAULT = Sandbox(config or SandboxConfig.from_env(**overrides))
    return _DEFAULT


async def run(
    program: Program, files: Files | None = None, stdin: str | bytes = b"", limits: Limits | None = None
) -> Outcome:
    """Run Python source (a str) or a command (``["python", "test.py"]``) in this process's sandbox."""
    return await default().run(program, files, stdin, limits)
