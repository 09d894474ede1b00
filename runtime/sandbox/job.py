"""One run as the backends see it: the command, the files of its scratch directory, stdin, limits."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from runtime.errors import InvalidInput
from runtime.sandbox.config import Limits

PYTHON = "python"
"""``argv[0]`` that means the backend's Python interpreter."""
PYTHON_FLAGS = ("-E", "-s", "-B")
"""Ignore PYTHON* variables and the user site, write no .pyc: the same program runs the same everywhere."""
MAIN = "main.py"

Program = str | Sequence[str]
Files = Mapping[str, str | bytes]


@dataclass(frozen=True)
class Job:
    argv: tuple[str, ...]
    files: dict[str, bytes] = field(default_factory=dict)
    stdin: bytes = b""
    limits: Limits = field(default_factory=Limits)

    def command(self, python: Sequence[str]) -> list[str]:
        """``argv`` with a leading ``python`` replaced by the interpreter (and its flags)."""
        if self.argv and self.argv[0] == PYTHON:
            return [*python, *PYTHON_FLAGS, *self.argv[1:]]
        return list(self.argv)


def make_job(program: Program, files: Files | None, stdin: str | bytes, limits: Limits) -> Job:
    """Python source (a str) runs as ``main.py``; a sequence is a command run in the scratch directory."""
    data = {
        _check_name(name): content.encode() if isinstance(content, str) else bytes(content)
        for name, content in (files or {}).items()
    }
    if isinstance(program, str):
        data[MAIN] = program.encode()
        argv: tuple[str, ...] = (PYTHON, MAIN)
    else:
        argv = tuple(program)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise InvalidInput(f"sandbox command must be a non-empty list of strings, got {program!r}")
    return Job(argv=argv, files=data, stdin=stdin.encode() if isinstance(stdin, str) else stdin, limits=limits)


def _check_name(name: str) -> str:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or name.startswith("\0") or "\0" in name:
        raise InvalidInput(f"sandbox file name {name!r} must be a relative path inside the scratch directory")
    return str(path)


def scratch_dir(root: str, uid: int | None) -> Path:
    """A fresh directory for one run, owned by the run's uid, mode 700."""
    path = Path(tempfile.mkdtemp(prefix="gymbus-sandbox-", dir=root or None))
    if uid is not None:
        os.chown(path, uid, uid)
    return path


def write_files(directory: Path, files: Mapping[str, bytes], uid: int | None) -> None:
    for name, content in files.items():
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        if uid is not None:
            for part in [target, *target.relative_to(directory).parents]:
                os.chown(directory / part, uid, uid)


def remove(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
