"""Session records and Results: opening a session from a Start, building a Result, keeping both
within one broker message."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec
from nats.js import JetStreamContext

from broker import topology
from broker.params import CreateParams
from broker.schemas import NUDGE, FailureKind, Result, Session, Start, Timings, encoder, session_encoder, session_id
from runtime.errors import ContextLength, InvalidInput

if TYPE_CHECKING:
    from runtime.engine.transitions import Delivery

RolloutIds = tuple[str, int, int, int]
"""(run_id, task_index, rollout_index, attempt): what names one attempt of one rollout."""


def input_items(params: dict[str, Any]) -> list[dict[str, Any]]:
    """The create body's ``input`` as Responses items, once the body passes `CreateParams` (the
    Responses API's fields, typed); InvalidInput names the field."""
    try:
        parsed = msgspec.convert(params, CreateParams)
    except msgspec.ValidationError as exc:
        raise InvalidInput(at(str(exc), "$.responses_create_params")) from exc
    if isinstance(parsed.input, str):
        return [{"type": "message", "role": "user", "content": parsed.input}]
    items = [dict(i) for i in params["input"]]
    for n, item in enumerate(items):
        if "type" not in item:
            if "role" not in item:
                raise InvalidInput(f"item has neither `type` nor `role` - at `$.responses_create_params.input[{n}]`")
            item["type"] = "message"
    return items


def at(error: str, where: str) -> str:
    """A msgspec error about a part of a message, told with the part's path (msgspec leaves out ``$``)."""
    if " - at `$" in error:
        return error.replace(" - at `$", f" - at `{where}", 1)
    return f"{error} - at `{where}`"


def new_session(msg: Start, base_step: int, d: Delivery) -> Session:
    """The session a Start opens; InvalidInput (naming the field) if its create params are malformed."""
    ids = (msg.run_id, msg.task_index, msg.rollout_index, msg.attempt)
    s = stub_session(ids, d, base_step, msg.agent, msg.env, msg.model)
    s.meta, s.options = msg.meta, msg.options
    params = dict(msg.responses_create_params)
    s.items = input_items(params)
    s.n_input = len(s.items)
    params.pop("input", None)
    s.params = params
    return s


def stub_session(
    ids: RolloutIds,
    d: Delivery,
    base: int = 0,
    agent: str = "",
    env: str = "",
    model: str = "",
) -> Session:
    """A session holding only a rollout's identity, to record its failure."""
    run_id, task, rollout, attempt = ids
    return Session(
        session_id=session_id(run_id, task, rollout),
        run_id=run_id,
        task_index=task,
        rollout_index=rollout,
        attempt=attempt,
        agent=agent,
        env=env,
        model=model,
        step=base,
        base_step=base,
        phase="model",
        params={},
        timings=Timings(submitted_at=d.published_at),
        headers={k: v for k, v in d.headers.items() if k != NUDGE},  # what its messages carry
    )


def finish_timings(t: Timings) -> Timings:
    t.finished_at = time.time()
    return msgspec.structs.replace(t)


def build_result(
    s: Session,
    *,
    reward: float | None = None,
    verifier: dict[str, Any] | None = None,
    failure: tuple[FailureKind, str] | None = None,
) -> Result:
    return Result(
        session_id=s.session_id,
        run_id=s.run_id,
        task_index=s.task_index,
        rollout_index=s.rollout_index,
        attempt=s.attempt,
        agent=s.agent,
        env=s.env,
        model=s.model,
        reward=None if failure else reward,
        failure_kind=failure[0] if failure else None,
        failure_reason=failure[1] if failure else None,
        verifier=verifier or {},
        output=s.items[s.n_input :],
        usage=s.usage,
        sampling=s.sampling,
        turns=s.turns,
        trajectory=s.trajectory,
        policy_versions=s.policy_versions,
        agent_info=s.agent_info,
        timings=finish_timings(s.timings),
    )


def end(s: Session, result: Result) -> None:
    """The session's last transition: it is done, with this Result."""
    s.result, s.phase = result, "done"


RECORD_HEADROOM = 64 * 1024
"""Bytes kept free under the broker's max_payload for headers."""


def max_record_bytes(js: JetStreamContext) -> int:
    """Largest session record or Result this broker takes: its max_payload (8 MiB shipped, 1 MiB default)."""
    nc = getattr(js, "_nc", None)
    server = getattr(nc, "max_payload", 0) or topology.MAX_MSG_SIZE
    return min(server, topology.MAX_MSG_SIZE) - RECORD_HEADROOM


def fit(s: Session, limit: int) -> bytes:
    """Keep a session (and its Result) within ``limit`` bytes; returns the session's record, encoded
    once here for both the size check and the write.

    A live rollout that outgrows it fails with ``context_length`` (the transcript no longer fits a
    message); a finished one that does is kept as a failure whose output is dropped, so it still ends
    as one Result with its reason, never as a lost rollout."""
    record = session_encoder.encode(s)
    size = max(len(record), len(encoder.encode(s.result)) if s.result else 0)
    if size <= limit:
        return record
    reason = f"the rollout's record is {size / 2**20:.1f} MiB, over the {limit / 2**20:.1f} MiB message limit"
    if s.phase != "done":
        raise ContextLength(reason)
    kind, why = (s.result.failure_kind, s.result.failure_reason) if s.result and s.result.failed else (None, None)
    s.items, s.pending, s.env_state, s.turns = s.items[: s.n_input], [], {}, []
    s.trajectory = None
    if len(session_encoder.encode(s)) > limit:
        s.items, s.n_input, s.params, s.meta = [], 0, {}, {}
    s.result = build_result(s, failure=(kind or "context_length", f"{why}; {reason}" if why else reason))
    s.result = msgspec.structs.replace(s.result, output=[])
    return session_encoder.encode(s)
