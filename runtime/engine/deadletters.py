"""Dead letters: messages that failed for good, kept on ``gym.dead.<function>`` with why.

A message is dead-lettered when it cannot be decoded (``invalid_input``, on its first delivery),
when a retried failure spent the delivery budget (the worker's last delivery), or when the budget
ran out with no worker answering (``worker_lost``, moved by the janitor from the broker's advisory).
Every dead letter also ends its rollout as one failed Result. `gymbus dead-letters` lists them;
`gymbus replay` re-runs their rollouts as a new attempt once the cause is fixed.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from nats.js import JetStreamContext

from broker import inspect, names, topology
from broker.letters import DeadLetter, dead_letter_decoder
from broker.publish import publish, publish_raw
from broker.schemas import (
    FailureKind,
    Msg,
    Start,
    encoder,
    parse_session_id,
    session_id,
    wire_decoder,
)
from broker.sessions import SessionStore
from runtime.engine.attempts import next_attempt


async def dead_letter(
    js: JetStreamContext,
    *,
    function: str,
    subject: str,
    stream_seq: int,
    data: bytes,
    headers: dict[str, str] | None,
    num_delivered: int,
    kind: FailureKind,
    error: str,
    sid: str | None,
) -> None:
    """Keep a message on ``gym.dead.<function>``; idempotent per work-stream sequence."""
    encoding: Literal["utf-8", "base64"]
    try:
        payload, encoding = data.decode(), "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(data).decode(), "base64"
    letter = DeadLetter(
        function=function,
        subject=subject,
        stream_seq=stream_seq,
        num_delivered=num_delivered,
        failure_kind=kind,
        error=error,
        session_id=sid,
        msg_id=(headers or {}).get("Nats-Msg-Id"),
        payload=payload,
        payload_encoding=encoding,
        headers=dict(headers or {}),
        dead_at=time.time(),
    )
    await publish_raw(
        js, topology.dead_subject(function), encoder.encode(letter), {"Nats-Msg-Id": f"dead:{stream_seq}"}
    )


def payload_bytes(letter: DeadLetter) -> bytes:
    return base64.b64decode(letter.payload) if letter.payload_encoding == "base64" else letter.payload.encode()


def sid_of(msg: Msg) -> str | None:
    """The session a decoded wire message belongs to."""
    if isinstance(msg, Start):
        return session_id(msg.run_id, msg.task_index, msg.rollout_index)
    return getattr(msg, "session_id", None)


def lenient_ids(data: bytes) -> tuple[str, str, int, int, int] | None:
    """(session, run, task, rollout, attempt) from a message that failed strict decoding, if it has them."""
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    if not isinstance(raw, dict):
        return None
    try:
        if isinstance(raw.get("session_id"), str):
            ids = (*parse_session_id(raw["session_id"]), 0)
        else:
            ids = (raw["run_id"], int(raw["task_index"]), int(raw.get("rollout_index", 0)), int(raw.get("attempt", 0)))
    except (KeyError, ValueError, TypeError, AttributeError):
        return None
    run_id = ids[0]
    if not isinstance(run_id, str) or not names.valid(run_id) or min(ids[1:]) < 0:
        return None
    return (session_id(run_id, ids[1], ids[2]), run_id, ids[1], ids[2], ids[3])


@dataclass
class Letter:
    """A dead letter as listed: where it is kept and what it says."""

    seq: int
    """Its sequence in the dead-letter stream (what `gymbus replay` takes)."""
    letter: DeadLetter

    def row(self) -> dict[str, Any]:
        return {"seq": self.seq, **msgspec.to_builtins(self.letter)}


async def letters(
    js: JetStreamContext, *, run_id: str | None = None, function: str | None = None, kind: str | None = None
) -> list[Letter]:
    """Dead letters in the order they died, filtered by run, function and failure kind."""
    subject = topology.dead_subject(function) if function else "gym.dead.>"
    out = []
    async for m in inspect.messages(js, topology.DEAD_STREAM, subject):
        try:
            letter = dead_letter_decoder.decode(m.data or b"")
        except msgspec.DecodeError:
            continue
        if run_id and not (letter.session_id or "").startswith(f"{run_id}."):
            continue
        if kind and letter.failure_kind != kind:
            continue
        out.append(Letter(m.seq or 0, letter))
    return out


@dataclass
class Replayed:
    """What `replay` did with one dead letter."""

    seq: int
    session_id: str | None
    attempt: int | None
    """The new attempt submitted, or None when skipped."""
    note: str


async def replay(js: JetStreamContext, chosen: list[Letter]) -> list[Replayed]:
    """Re-submit the rollouts of ``chosen`` dead letters as a new attempt each (once per session)."""
    store, done, out = SessionStore(js), set(), []
    for item in chosen:
        sid = item.letter.session_id
        if sid is None or sid in done:
            out.append(
                Replayed(item.seq, sid, None, "skipped: names no rollout" if sid is None else "skipped: same rollout")
            )
            continue
        done.add(sid)
        out.append(await _replay_one(js, store, item, sid))
    return out


async def _replay_one(js: JetStreamContext, store: SessionStore, item: Letter, sid: str) -> Replayed:
    if item.letter.failure_kind == "invalid_input":
        return Replayed(item.seq, sid, None, "skipped: the message itself is invalid; fix the task and submit it")
    loaded = await store.get(sid)
    if loaded is not None:
        s, _ = loaded
        if s.phase != "done":
            return Replayed(item.seq, sid, None, f"skipped: attempt {s.attempt} is still running")
        if s.result is not None and not s.result.failed:
            return Replayed(item.seq, sid, None, f"skipped: attempt {s.attempt} already has reward {s.result.reward}")
        start = next_attempt(s)
    else:
        try:
            msg = wire_decoder.decode(payload_bytes(item.letter))
        except msgspec.DecodeError:
            msg = None
        if not isinstance(msg, Start):
            return Replayed(item.seq, sid, None, "skipped: its session expired and the letter is not a Start")
        start = msgspec.structs.replace(msg, attempt=msg.attempt + 1)
    msg_id = f"{sid}:start:{start.attempt}"
    await publish(js, topology.agent_subject(start.agent), start, msg_id)
    return Replayed(item.seq, sid, start.attempt, f"submitted attempt {start.attempt}")
