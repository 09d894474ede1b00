"""What a sandboxed run ended as: a verdict about the candidate's code, with its output.

An ``Outcome`` is always about the candidate: it ran and exited 0 (``ok``), failed (``error``: a
non-zero exit, a signal, a denied operation it did not handle), ran out of time (``timeout``: the
wall clock or the CPU limit), out of memory (``memory``), or wrote more than it may (``output_capped``:
stdout/stderr over the cap, or a file over the size limit). When the sandbox itself could not run the
code, ``run`` raises ``runtime.errors.SandboxError`` instead: a failure kind, never a verdict.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["ok", "error", "timeout", "memory", "output_capped"]
VERDICTS: tuple[Verdict, ...] = ("ok", "error", "timeout", "memory", "output_capped")


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    stdout: str
    """What the program printed (UTF-8, undecodable bytes replaced), up to the output cap."""
    stderr: str
    exit_code: int | None
    """The exit status, or None when a signal ended it (``signal`` then says which)."""
    signal: int | None
    duration_s: float
    """From start to exit (or to the kill)."""
    backend: str
    detail: str = ""
    """Why the verdict, in a few words (``killed at the wall-clock limit (10 s)``, ``exit status 1``)."""

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def summary(self, tail: int = 400) -> str:
        """One line for a verifier's info or a tool's output: the verdict, the detail, the stderr's end."""
        err = self.stderr.strip()[-tail:]
        return f"{self.verdict} ({self.detail})" + (f": {err}" if err and not self.ok else "")


_MEMORY_MARKS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
_FILE_MARKS = ("[Errno 27] File too large", "File size limit exceeded")


def classify(
    returncode: int | None, stderr: str, *, killed_for: Verdict | None, wall_s: float, cpu_s: int
) -> tuple[Verdict, str]:
    """The verdict of a finished run from how it ended (``killed_for``: why we killed it, if we did)."""
    if killed_for == "timeout":
        return "timeout", f"killed at the wall-clock limit ({wall_s:g} s)"
    if killed_for == "output_capped":
        return "output_capped", "killed: stdout and stderr over the output cap"
    if killed_for == "memory":
        return "memory", "killed: over the memory limit"
    if returncode == 0:
        return "ok", "exit status 0"
    if returncode is not None and returncode < 0:
        sig = -returncode
        if sig == signal.SIGXCPU or sig == signal.SIGKILL:  # the CPU limit: soft SIGXCPU, then hard SIGKILL
            return "timeout", f"killed by {signal.Signals(sig).name}: over the CPU limit ({cpu_s} s)"
        if sig == signal.SIGXFSZ:
            return "output_capped", "killed by SIGXFSZ: a file over the size limit"
        return "error", f"killed by {_signame(sig)}"
    tail = stderr[-2000:]
    if any(mark in tail for mark in _MEMORY_MARKS):
        return "memory", f"exit status {returncode}: out of memory"
    if any(mark in tail for mark in _FILE_MARKS):
        return "output_capped", f"exit status {returncode}: a file over the size limit"
    return "error", f"exit status {returncode}"


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
