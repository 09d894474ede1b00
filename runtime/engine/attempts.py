"""Starting a rollout over as a new attempt, when the state it was built on is gone.

A retried failure is normally the same message delivered again. That cannot help when the
environment instance that held the rollout's state died (``env_lost``): the next call would reach
an instance that never saw the rollout. So a retried ``env_lost`` publishes the rollout's Start
again with ``attempt + 1`` (rebuilt from its session, as ``gymbus replay`` does), and the new
attempt supersedes the old one: its first write replaces the session, so every message still in
flight for the old attempt finds a later step and is dropped. The old attempt publishes no Result,
so the rollout still ends exactly once. Attempts are bounded by the delivery budget
(``max_deliver``); past it the rollout fails with the kind.
"""

from __future__ import annotations

import logging

from broker import topology
from broker.publish import publish
from broker.schemas import FailureKind, Msg, Session, Start
from runtime.engine.transitions import Runtime

log = logging.getLogger("gymbus.runtime")

NEW_ATTEMPT_KINDS: frozenset[FailureKind] = frozenset({"env_lost"})
"""Kinds that, when the rollout's policy retries them, start the rollout over instead of redelivering."""


async def start_over(rt: Runtime, sid: str, step: int | None, reason: str, budget: int) -> bool:
    """Publish the rollout's next attempt; False when its attempts are spent (then fail it).

    True also when there is nothing to do: the message is stale (the session moved on or ended),
    or the next attempt was already published by an earlier delivery of this message."""
    loaded = await rt.store.get(sid)
    if loaded is None:
        return False
    s, _ = loaded
    if s.phase == "done" or (step is not None and s.step != step):
        return True
    if s.attempt + 1 >= budget:
        return False
    start = next_attempt(s)
    log.warning("%s: attempt %d lost its environment (%s); starting attempt %d", sid, s.attempt, reason, start.attempt)
    await publish(rt.js, topology.agent_subject(s.agent), start, f"{sid}:start:{start.attempt}", s.headers or None)
    return True


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
