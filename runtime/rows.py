"""The rows of ``rollouts.jsonl``: a Result as a NeMo Gym-compatible output row, and back."""

from __future__ import annotations

from typing import Any

import msgspec

from broker.schemas import FailureKind, Result, Timings, Usage, parse_session_id


def output_row(task_row: dict[str, Any] | None, r: Result) -> dict[str, Any]:
    """The input row plus response, reward, ids, verifier info, sampling, timings (and the failure)."""
    row = dict(task_row or {})
    row.update(
        {
            "task_index": r.task_index,
            "rollout_index": r.rollout_index,
            "env": r.env or row.get("env", ""),
            "agent": r.agent or row.get("agent", ""),
            "session_id": r.session_id,
            "attempt": r.attempt,
            "response": {"output": r.output, "usage": msgspec.to_builtins(r.usage)},
            "reward": r.reward,
            "verifier": r.verifier,
            "sampling": r.sampling,
            "timings": {**msgspec.to_builtins(r.timings), "total_s": r.timings.total_s},
        }
    )
    if r.turns:
        row["turns"] = msgspec.to_builtins(r.turns)
    if r.trajectory is not None:
        row["trajectory"] = msgspec.to_builtins(r.trajectory)
    if r.policy_versions:
        row["policy_versions"] = r.policy_versions
    if r.agent_info:
        row["agent_info"] = r.agent_info
    if r.failed:
        row["failure_kind"] = r.failure_kind
        row["failure_reason"] = r.failure_reason
    return row


class _Row(msgspec.Struct, kw_only=True):
    """The fields of an output row that are read back."""

    session_id: str
    task_index: int
    rollout_index: int
    attempt: int = 0
    env: Any = ""
    agent: Any = ""
    reward: float | None = None
    failure_kind: FailureKind | None = None
    failure_reason: str | None = None
    verifier: dict[str, Any] = {}
    agent_info: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    response: dict[str, Any] = {}


def result_from_row(row: dict[str, Any]) -> Result:
    """The Result an output row was written from (without the input row's fields).

    Raises msgspec.ValidationError naming the field when the row is not one gymbus wrote."""
    r = msgspec.convert(row, _Row)
    if r.reward is None and r.failure_kind is None:
        raise msgspec.ValidationError("a row with `reward` null must have a `failure_kind`")
    try:
        parse_session_id(r.session_id)
    except ValueError:
        raise msgspec.ValidationError(f"`session_id` {r.session_id!r} is not <run_id>.<task>.<rollout>") from None
    return Result(
        session_id=r.session_id,
        run_id=parse_session_id(r.session_id)[0],
        task_index=r.task_index,
        rollout_index=r.rollout_index,
        attempt=r.attempt,
        env=r.env if isinstance(r.env, str) else "",
        agent=r.agent if isinstance(r.agent, str) else "",
        reward=r.reward,
        failure_kind=r.failure_kind,
        failure_reason=r.failure_reason,
        verifier=r.verifier,
        agent_info=r.agent_info,
        output=r.response.get("output") or [],
        usage=msgspec.convert(r.response.get("usage") or {}, Usage),
        timings=msgspec.convert({k: v for k, v in r.timings.items() if k != "total_s"}, Timings),
    )
