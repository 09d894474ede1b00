"""What happens on each failure kind: redeliver with backoff, or end the rollout at once.

    kind             default      why
    invalid_input    fail         deterministic: the same input fails the same way (never retried)
    model_error      fail         the model client already retried it (one retry layer only)
    context_length   fail         deterministic: the conversation will not shrink
    tool_error       retry        a tool may fail transiently (a sandbox, a network call)
    verifier_error   retry        likewise; past the budget the message is dead-lettered
    sandbox_error    retry        a code sandbox failed to run (infrastructure), never the candidate's fault
    timeout          fail         a step or the rollout ran out of time (rollout deadlines never retry)
    env_lost         fail         the environment instance holding the state is gone; retried, it starts
                                  the rollout over as a new attempt (runtime.engine.attempts)
    worker_lost      -            decided by the broker: the delivery budget ran out while no worker answered
    cancelled        fail         the user asked for it
    internal         retry        a gymbus bug or a broker hiccup; retried, then dead-lettered

A run changes the retried set with ``limits.retry`` in its config (carried in ``Options.retry`` of
every Start), e.g. ``retry: [tool_error, verifier_error, internal, model_error, timeout]`` to have
model failures and step timeouts redelivered too. Whatever the policy, a rollout ends as exactly one
Result, and a failed one carries its kind and no reward.
"""

from __future__ import annotations

from broker.schemas import FailureKind, Options
from runtime.errors import RETRIED_KINDS

DEFAULT_RETRY: frozenset[FailureKind] = RETRIED_KINDS
"""Kinds redelivered with backoff until the delivery budget (``max_deliver``) is spent."""

NEVER_RETRIED: frozenset[FailureKind] = frozenset({"invalid_input", "worker_lost", "cancelled"})
"""Kinds no policy can retry: bad input stays bad, a lost worker was the retry, a cancel is final."""


def retried(options: Options | None, kind: FailureKind, default: frozenset[FailureKind] = DEFAULT_RETRY) -> bool:
    """Whether a failure of ``kind`` is redelivered under the rollout's policy."""
    if kind in NEVER_RETRIED:
        return False
    kinds = default if options is None or options.retry is None else frozenset(options.retry)
    return kind in kinds
