"""The run folder, ``runs/<run_id>/``: its lock, metadata.json and rollouts.jsonl.

One run has one writer: the folder is locked (an OS file lock, held for the life of the process
and released by the kernel when it exits, crash included), so a second `gymbus collect` of the
same run is refused with who holds it, instead of a second embedded broker on the same store.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import msgspec

from broker.schemas import Result, RunIdentity
from runtime.errors import UsageError
from runtime.rows import output_row, result_from_row


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

    def results(self, run_id: str) -> Iterable[Result]:
        """The Results the folder's rows were written from (rows it cannot read are skipped)."""
        if not self.rows_path.exists():
            return
        for line in self.rows_path.read_text().splitlines():
            try:
                r = result_from_row(json.loads(line))
            except (ValueError, msgspec.ValidationError):
                continue
            if r.run_id == run_id:
                yield r

    def appender(self) -> IO[str]:
        """rollouts.jsonl opened for appending rows as they arrive (rewritten sorted at the end)."""
        return self.rows_path.open("a")

    def write_rows(self, rows_by_index: dict[int, dict[str, Any] | None], results: Iterable[Result]) -> None:
        """Rewrite rollouts.jsonl sorted by task and repeat, atomically."""
        ordered = sorted(results, key=lambda r: (r.task_index, r.rollout_index))
        tmp = self.rows_path.with_suffix(".jsonl.tmp")
        with tmp.open("w") as fh:
            for r in ordered:
                fh.write(json.dumps(output_row(rows_by_index.get(r.task_index), r)) + "\n")
        os.replace(tmp, self.rows_path)
