"""``gymbus reverify RUN_DIR``: score a run's stored rollouts again with the current verifier, without
generating anything, into a new results subject, and say how the rewards changed.

Every rollout of ``rollouts.jsonl`` that reached its verifier (it has a reward, or failed with
``verifier_error``) is verified again from its stored task row and output; the new Results go to
``gym.result.<into>`` (default ``<run>-rv``) on the run's broker (its embedded one, or ``--nats``),
and ``<run_dir>/reverify-<into>.jsonl`` gets one row per rollout with the reward before and after.
The environment's state (``rollout.state``) is not kept in rows: verifiers see it empty.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from broker import names, topology
from broker.connect import connection
from broker.publish import publish
from broker.schemas import Result, Session, Timings
from runtime.errors import UsageError
from runtime.rows import result_from_row
from runtime.sdk import Environment, Rollout, Verdict, load

OUTPUT_FIELDS = {
    "task_index", "rollout_index", "session_id", "attempt", "response", "reward", "verifier", "sampling",
    "timings", "turns", "failure_kind", "failure_reason", "trajectory", "policy_versions",
}  # fmt: skip
"""What `runtime.rows.output_row` adds to a task row: the rest is the task as submitted."""


@dataclass
class Change:
    task_index: int
    rollout_index: int
    before: float | None
    after: float | None
    error: str = ""


@dataclass
class Reverified:
    run_id: str
    into: str
    changes: list[Change] = field(default_factory=list)
    skipped: int = 0
    """Rows that never reached a verifier (model or tool failures): nothing to score."""

    @property
    def changed(self) -> list[Change]:
        return [c for c in self.changes if c.before != c.after]

    def mean(self, which: str) -> float | None:
        values = [getattr(c, which) for c in self.changes if getattr(c, which) is not None]
        return sum(values) / len(values) if values else None


def load_run(run_dir: Path) -> tuple[str, str, list[dict[str, Any]]]:
    """(run id, environment ref, rows) of a run folder; UsageError naming what is missing."""
    meta_path, rows_path = run_dir / "metadata.json", run_dir / "rollouts.jsonl"
    if not meta_path.exists() or not rows_path.exists():
        raise UsageError(f"{run_dir} is not a run folder of `gymbus collect` (no metadata.json or rollouts.jsonl)")
    meta = json.loads(meta_path.read_text())
    config = meta.get("config") or {}
    rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
    return str(meta["run_id"]), str(config.get("env_ref") or config.get("env") or ""), rows


async def reverify(run_dir: Path, nats_url: str, env_ref: str | None = None, into: str | None = None) -> Reverified:
    run_id, stored_env, rows = load_run(run_dir)
    env = load(env_ref or stored_env)
    if not isinstance(env, Environment):
        raise UsageError(f"--env {env_ref or stored_env!r} is an agent, not an environment")
    target = names.check("--into", into or f"{run_id}-rv"[:64])
    out = Reverified(run_id, target)
    lines = []
    async with connection(nats_url, name="gymbus-reverify") as nc:
        js = nc.jetstream()
        await topology.ensure(js, topology.Limits.from_env())
        for row in rows:
            old = result_from_row(row)
            if old.reward is None and old.failure_kind != "verifier_error":
                out.skipped += 1
                continue
            new = await _score(env, row, old, target)
            sid = f"{target}.{new.task_index}.{new.rollout_index}"
            await publish(js, topology.result_subject(target), new, f"{sid}:reverify:{new.attempt}")
            change = Change(old.task_index, old.rollout_index, old.reward, new.reward, new.failure_reason or "")
            out.changes.append(change)
            lines.append(json.dumps(msgspec.structs.asdict(new) | {"reward_before": old.reward}, default=str))
    (run_dir / f"reverify-{target}.jsonl").write_text("".join(line + "\n" for line in lines))
    return out


async def _score(env: Environment, row: dict[str, Any], old: Result, target: str) -> Result:
    task_row = {k: v for k, v in row.items() if k not in OUTPUT_FIELDS}
    params = dict(task_row.get("responses_create_params") or {})
    raw = params.pop("input", [])
    items = [{"type": "message", "role": "user", "content": raw}] if isinstance(raw, str) else list(raw)
    session = Session(
        session_id=f"{target}.{old.task_index}.{old.rollout_index}",
        run_id=target,
        task_index=old.task_index,
        rollout_index=old.rollout_index,
        agent="",
        env=env.name,
        model="",
        step=0,
        phase="verify",
        params=params,
        meta={k: v for k, v in task_row.items() if k != "responses_create_params"},
        items=items + list(old.output),
        n_input=len(items),
    )
    base = msgspec.structs.replace(old, session_id=session.session_id, run_id=target, timings=Timings())
    try:
        verdict = await env.verify(env.task(session), Rollout(output=list(old.output), state={}))
        reward, info = (verdict.reward, verdict.info) if isinstance(verdict, Verdict) else (verdict, {})
        reward = float(reward) if isinstance(reward, bool) else reward
        if not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"returned reward {reward!r}, not a finite number")
        scored: dict[str, Any] = {"reward": float(reward), "verifier": info}
        scored.update(failure_kind=None, failure_reason=None)
        return msgspec.structs.replace(base, **scored)
    except Exception as exc:  # a verifier that raises is a failure, never a reward
        reason = f"verifier of {env.name!r} raised {type(exc).__name__}: {exc}"
        failure: dict[str, Any] = {"failure_kind": "verifier_error", "failure_reason": reason}
        return msgspec.structs.replace(base, reward=None, verifier={}, **failure)
