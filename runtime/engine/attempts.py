"""Starting a rollout over as a new attempt, when the state it was built on is gone.

A retried failure is normally the same message delivered again. That cannot help when the
environment instance that held the rollout's state died (``env_lost``): the next call would reach
an instance that never saw the rollout. So a retried ``env_lost`` publishes the rollout's Start
again with ``attempt + 1`` (rebuilt from its session, as ``gymbus replay`` does), and the new
attempt supersedes the old one: its first write replaces the session, so every message still in
flight for the old attempt finds a later step and is dropped. The old attempt publishes no Result,
so the rollout still ends exactly once. Attempts are bounded by the delivery budget
(``max_deliver``); past it the rollout fails with the kind.

A power cut under a sync interval can do the same to any rollout: the broker keeps a message and
loses the session write it was emitted after, so the session sits at a step whose message is gone
(`transitions.RolledBack`). That rollout starts over the same way.
"""

from __future__ import annotations

import logging
from typing import Literal

from broker import topology
from broker.publish import publish
from broker.schemas import FailureKind, Msg, Session, Start
from runtime.engine.transitions import Runtime

log = logging.getLogger("gymbus.runtime")

Outcome = Literal["started", "moved", "spent", "lost"]

NEW_ATTEMPT_KINDS: frozenset[FailureKind] = frozenset({"env_lost"})
"""Kinds that, when the rollout's policy retries them, start the rollout over instead of redelivering."""


async def start_over(
    rt: Runtime, sid: str, step: int | None, reason: str, budget: int, gone: Session | None = None
) -> Outcome:
    """Publish the rollout's next attempt if the session is still at ``step`` (any step if None);
    if the session is gone, from ``gone`` (the session as a message carried it), if given.

    ``started`` also when an earlier delivery of this message published it already (the Start's id
    is the stream's dedupe key); ``moved`` when the session went on or ended since the message
    looked at it; ``spent`` when its attempts are spent and ``lost`` when the session is gone (then
    fail it)."""
    loaded = await rt.store.get(sid)
    if loaded is not None:
        s = loaded[0]
        if gone is not None or s.phase == "done" or (step is not None and s.step != step):
            return "moved"  # written since the message looked (a session that was gone is back)
    elif gone is None:
        return "lost"
    else:
        s = gone
    if s.attempt + 1 >= budget:
        return "spent"
    start = next_attempt(s)
    log.warning("%s: attempt %d cannot go on (%s); starting attempt %d", sid, s.attempt, reason, start.attempt)
    await publish(rt.js, topology.agent_subject(s.agent), start, f"{sid}:start:{start.attempt}", s.headers or None)
    return "started"


def next_attempt(s: Session) -> Start:
    """The Start of the session's rollout, one attempt later, from what the session kept of its task."""
    return Start(
        run_id=s.run_id,
        task_index=s.task_index,
        rollout_index=s.rollout_index,
        attempt=s.attempt + 1,
        agent=s.agent,
        env=s.env,
        model=s.model,
        responses_create_params={**s.params, "input": s.items[: s.n_input]},
        meta=s.meta,
        options=s.options,
    )


def step_of(msg: Msg) -> int | None:
    step = getattr(msg, "step", None)
    return step if isinstance(step, int) else None
