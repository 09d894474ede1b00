"""The offline profile's source: a run folder's ``rollouts.jsonl`` and ``metadata.json``, read a row at
a time, and the profile files written back into it (``profile.json``, ``tasks.jsonl``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from runtime.profiling.profile import Profile, ProfileError, RunInfo, Sample, SampleTable, TaskProfile
from runtime.rows import result_from_row


def sample_from_row(row: dict[str, Any]) -> Sample:
    """A Sample from a ``rollouts.jsonl`` row; raises msgspec.ValidationError naming the field."""
    return Sample.of(result_from_row(row))


def iter_rows(path: Path) -> Iterator[dict[str, Any]]:
    """The rows of a JSONL file, read one line at a time; a line that is not a JSON object is an error
    naming it."""
    with path.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ProfileError(f"{path} line {lineno} is not valid JSON: {exc}") from None
            if not isinstance(row, dict):
                raise ProfileError(f"{path} line {lineno} is a JSON {type(row).__name__}, not an object")
            yield row


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL file (see `iter_rows`)."""
    return list(iter_rows(path))


def run_info(run_dir: Path, pass_threshold: float | None = None) -> RunInfo:
    """RunInfo from ``metadata.json`` (tasks, repeats, expected, the config's pass threshold)."""
    path = run_dir / "metadata.json"
    meta: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    threshold = ((meta.get("config") or {}).get("profile") or {}).get("pass_threshold", 1.0)
    try:
        return msgspec.convert(
            {
                "run_id": meta.get("run_id") or run_dir.name,
                "tasks": meta.get("tasks"),
                "repeats": meta.get("repeats"),
                "expected": meta.get("expected"),
                "pass_threshold": threshold if pass_threshold is None else pass_threshold,
            },
            RunInfo,
        )
    except msgspec.ValidationError as exc:
        raise ProfileError(f"{path}: {exc}") from None


def load(
    run_dir: Path, pass_threshold: float | None = None, on_row: Callable[[dict[str, Any]], None] | None = None
) -> tuple[RunInfo, SampleTable]:
    """A run folder's RunInfo and its Samples, reading ``rollouts.jsonl`` one row at a time: a row is
    handed to ``on_row`` and dropped, so a run of any size is profiled in memory for its SampleTable only."""
    path = run_dir / "rollouts.jsonl"
    if not run_dir.is_dir():
        raise ProfileError(f"run folder {str(run_dir)!r} does not exist")
    if not path.exists():
        raise ProfileError(f"run folder {str(run_dir)!r} has no rollouts.jsonl (has the run written any Results?)")
    info = run_info(run_dir, pass_threshold)
    samples = SampleTable(info.run_id)
    for n, row in enumerate(iter_rows(path), 1):
        try:
            samples.add(sample_from_row(row))
        except msgspec.ValidationError as exc:
            raise ProfileError(f"{path} row {n}: {exc}") from None
        if on_row is not None:
            on_row(row)
    return info, samples


def write(run_dir: Path, profile: Profile, tasks: list[TaskProfile]) -> None:
    """``profile.json`` and ``tasks.jsonl`` in the run folder."""
    (run_dir / "profile.json").write_bytes(msgspec.json.format(msgspec.json.encode(profile), indent=2) + b"\n")
    (run_dir / "tasks.jsonl").write_bytes(b"".join(msgspec.json.encode(t) + b"\n" for t in tasks))
