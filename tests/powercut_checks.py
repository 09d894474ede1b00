"""The checks of a power-cut trial (tests/powercut.py) and the figures of a set of trials.

What a trial found is a `Trial`; its `problems` list every check that failed: the auditor's, a work
message left for a rollout without a Result, a reward not given to a whole transcript, the run
folder disagreeing with the results stream, and (under ``sync: always``) a Result shown before a
cut that was lost or changed.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext

from broker import inspect, topology
from broker.schemas import Result, result_decoder
from runtime.engine.deadletters import lenient_ids

ROOT = Path(__file__).resolve().parents[1]
MATH_TASKS = ROOT / "functions" / "math" / "data" / "example.jsonl"

Outcome = tuple[float | None, str | None]
"""A Result's reward and failure kind."""


@dataclass
class Cut:
    """One power cut."""

    at_s: float
    """Seconds after the collect it interrupted had started."""
    shown: dict[tuple[str, int], Outcome]
    """Results collect had written to rollouts.jsonl by then, by (session, attempt)."""
    unsynced_store: dict[str, int]
    """Bytes (dirty pages) each file of the broker's store lost."""
    unsynced_other: int
    """Bytes the rest of the run folder lost."""
    unloadable: int = 0
    """Streams and consumers whose definition (meta.inf) the disk lost: nats-server skips them at
    start, and they come back (with their messages) only when a client declares them again."""


@dataclass
class Trial:
    """One run under power cuts, and what the checks found."""

    sync: str
    run_id: str
    rollouts: int
    cuts: list[Cut] = field(default_factory=list)
    collects: int = 0
    """Collect invocations (the first, the resumes)."""
    finished_uncut: int = 0
    """Collects that finished before the moment drawn for their cut."""
    outcomes: Counter[str] = field(default_factory=Counter)
    """Per rollout: ``reward`` or its failure kind."""
    attempts: Counter[int] = field(default_factory=Counter)
    """Per rollout: the attempt its Result came from (> 0: re-run after its first attempt was lost)."""
    shown_lost: int = 0
    """Results collect showed before a cut that the final stream lacks (same session and attempt)."""
    shown_changed: int = 0
    """... that the final stream holds with another reward or failure kind."""
    left: int = 0
    """Work messages of the run still in the work stream at the end (stale copies, never run)."""
    problems: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def read_rows(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


async def read_streams(js: JetStreamContext, run_id: str) -> tuple[dict[tuple[str, int], Outcome], set[str]]:
    """Every Result of the run by (session, attempt), and the sessions of its work messages left."""
    stored: dict[tuple[str, int], Outcome] = {}
    async for m in inspect.messages(js, topology.RESULTS_STREAM, topology.result_subject(run_id)):
        r = result_decoder.decode(m.data or b"")
        stored[r.session_id, r.attempt] = (r.reward, r.failure_kind)
    left = set()
    async for m in inspect.messages(js, topology.WORK_STREAM, "gym.>"):
        ids = lenient_ids(m.data or b"")
        if ids is not None and ids[1] == run_id:
            left.add(ids[0])
    return stored, left


async def whole(r: Result) -> list[str]:
    """A reward must score a whole transcript: each tool call answered, a final reply, and the
    verifier giving the same reward again. A failure must carry no reward."""
    if r.failed:
        return [] if r.reward is None else [f"{r.session_id}: failed ({r.failure_kind}) with a reward"]
    from functions.math.env import ENVIRONMENT, Meta
    from runtime.sdk import Rollout, Task

    calls = [i.get("call_id") for i in r.output if i.get("type") == "function_call"]
    answers = [i.get("call_id") for i in r.output if i.get("type") == "function_call_output"]
    if not calls or calls != answers or not r.output or r.output[-1].get("type") != "message":
        return [f"{r.session_id}: scored from a partial transcript {[i.get('type') for i in r.output]}"]
    tasks = read_rows(MATH_TASKS)
    meta = Meta(expected_answer=tasks[r.task_index]["expected_answer"])
    task = Task(index=r.task_index, rollout_index=r.rollout_index, meta=meta, params={}, input=[])
    again = await ENVIRONMENT.verify(task, Rollout(output=r.output, state={}))
    again = getattr(again, "reward", again)
    return [] if again == r.reward else [f"{r.session_id}: reward {r.reward}, but its transcript scores {again}"]


def folder_agrees(run_dir: Path, latest: dict[str, Result]) -> list[str]:
    """rollouts.jsonl holds exactly the stream's latest Results; metadata.json counts them."""
    rows = {row["session_id"]: row for row in read_rows(run_dir / "rollouts.jsonl")}
    problems = []
    if set(rows) != set(latest):
        problems.append(f"rollouts.jsonl has {len(rows)} rows for {len(latest)} Results in the stream")
    for sid, r in latest.items():
        row = rows.get(sid)
        if row is not None and (row.get("attempt", 0), row.get("reward"), row.get("failure_kind")) != (
            r.attempt,
            r.reward,
            r.failure_kind,
        ):
            problems.append(f"rollouts.jsonl disagrees with the stream on {sid}")
    try:
        meta = json.loads((run_dir / "metadata.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError) as exc:
        return [*problems, f"metadata.json unreadable: {exc}"]
    if meta.get("results") != len(latest):
        problems.append(f"metadata.json counts {meta.get('results')} results, the stream {len(latest)}")
    return problems


def summary(trials: list[Trial]) -> dict[str, Any]:
    """The figures of a set of trials (one sync policy)."""
    outcomes: Counter[str] = Counter()
    attempts: Counter[int] = Counter()
    for t in trials:
        outcomes.update(t.outcomes)
        attempts.update(t.attempts)
    cuts = [c for t in trials for c in t.cuts]
    store_files: Counter[str] = Counter()
    for c in cuts:
        store_files.update(kind_of(path) for path, n in c.unsynced_store.items() if n)
    return {
        "sync": trials[0].sync if trials else "",
        "trials": len(trials),
        "cuts": len(cuts),
        "collects": sum(t.collects for t in trials),
        "rollouts": sum(t.rollouts for t in trials),
        "outcomes": dict(outcomes.most_common()),
        "rerun_attempts": sum(n for a, n in attempts.items() if a > 0),
        "shown_before_cut": sum(len(c.shown) for c in cuts),
        "shown_lost": sum(t.shown_lost for t in trials),
        "shown_changed": sum(t.shown_changed for t in trials),
        "cuts_losing_definitions": sum(1 for c in cuts if c.unloadable),
        "store_bytes_lost": sum(sum(c.unsynced_store.values()) for c in cuts),
        "store_files_lost": dict(store_files.most_common()),
        "left_in_work_stream": sum(t.left for t in trials),
        "problems": [p for t in trials for p in t.problems],
        "wall_s": round(sum(t.wall_s for t in trials), 1),
    }


def kind_of(path: str) -> str:
    """A store file's kind, e.g. ``streams/*/msgs/*.blk`` (how many cuts found such files unsynced)."""
    parts = path.split("/")
    if parts[0].startswith("ports-"):
        return "ports-*/*.ports"
    if "streams" in parts:
        i = parts.index("streams")
        parts = [*parts[: i + 1], "*", *parts[i + 2 :]]
    if "obs" in parts:
        i = parts.index("obs")
        parts = [*parts[: i + 1], "*", *parts[i + 2 :]]
    name = parts[-1]
    if name.endswith(".blk"):
        parts[-1] = "*.blk"
    return "/".join(p for p in parts if p not in ("jetstream", "$G"))
