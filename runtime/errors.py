"""How a failure travels: every error that ends a rollout carries a ``failure_kind``.

    GymError (kind, reason)
    ├── InvalidInput     invalid_input    a task, message or tool call failed validation
    ├── ModelError       model_error      the policy endpoint failed past the client's retry budget
    ├── ContextLength    context_length   the conversation no longer fits the model's context
    ├── ToolError        tool_error       an environment tool raised
    ├── VerifierError    verifier_error   the verifier raised
    ├── SandboxError     sandbox_error    a code sandbox could not run (backend unavailable, start failed)
    ├── JudgeError       judge_error      a judge model's verdict was not in the expected form
    ├── EnvLost          env_lost         the environment instance holding the rollout's state was lost
    ├── Timeout          timeout          a step ran past its deadline
    │   └── DeadlineExceeded              the rollout ran past its deadline (never retried)
    ├── Cancelled        cancelled        the user cancelled the rollout
    ├── HistoryChanged   history_changed  token_exact: the conversation changed before the last model turn
    ├── UserSimError     user_sim_error   an agent's user simulator model failed
    ├── ToolSimError     tool_sim_error   an agent's tool simulator could not answer a call
    └── HarnessError     harness_error    the harness command an agent runs failed

A handler raises one of these (or the runtime wraps a foreign exception into one at its boundary:
the model client, the tool runner, the verifier). The worker then looks the kind up in the run's
retry policy (``runtime.engine.retry``; ``Options.retry`` per run): a retried kind is redelivered with
backoff until the delivery budget is spent, the others end the rollout at once. Either way the
rollout ends as exactly one failed Result, never reward 0.
Anything else that escapes a handler is a bug, reported with kind ``internal`` after its retries.

Apart from that tree, `UsageError` (``ConfigError``, ``InputError``) is a user's mistake caught
before a run starts: the CLI prints it as one line naming the field, the value and the fix.
"""

from __future__ import annotations

from typing import ClassVar

from broker.schemas import FailureKind


class GymError(Exception):
    """Base of every failure with a kind; ``reason`` is what the user reads."""

    kind: ClassVar[FailureKind] = "internal"
    retry: ClassVar[bool | None] = None
    """None: the run's retry policy decides by kind; True/False overrides it for this error class."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"


class InvalidInput(GymError):
    """A task, message or tool call failed validation; the reason names the field."""

    kind = "invalid_input"


class ModelError(GymError):
    """The policy endpoint failed (connection, 5xx, 429, timeout) past the retry budget."""

    kind = "model_error"


class ContextLength(GymError):
    """The model server rejected the request as longer than its context window."""

    kind = "context_length"


class ToolError(GymError):
    """An environment tool raised."""

    kind = "tool_error"


class VerifierError(GymError):
    """The verifier raised."""

    kind = "verifier_error"


class SandboxError(GymError):
    """A code sandbox could not run the candidate's code: the infrastructure failed, not the candidate.

    Raised by ``runtime.sandbox`` (backend unavailable, a start that failed, no admission in time);
    the candidate's own failures (wrong output, crash, timeout, memory) are verdicts, never this."""

    kind = "sandbox_error"


class JudgeError(GymError):
    """A judge model answered, but not with a verdict in the form the environment expects: the
    rollout has no reward (a verdict nobody could read is not a wrong answer)."""

    kind = "judge_error"


class EnvLost(GymError):
    """The environment instance that held the rollout's state (a pinned server: NeMo Gym, OpenEnv) died
    or was replaced mid-rollout: its state is gone, so no reward can be trusted. A run whose retry
    policy names ``env_lost`` starts the rollout over as a new attempt; otherwise it fails."""

    kind = "env_lost"


class Timeout(GymError):
    """A step or the whole rollout ran past its deadline."""

    kind = "timeout"


class DeadlineExceeded(Timeout):
    """The rollout ran past ``rollout_timeout_s``: retrying cannot help, so it never is."""

    retry = False


class Cancelled(GymError):
    """The rollout was cancelled."""

    kind = "cancelled"


class HistoryChanged(GymError):
    """token_exact: the conversation changed before the model's last turn (compaction, dropped
    reasoning), so the rollout's token ids cannot be spliced; never retried (it would change again)."""

    kind = "history_changed"
    retry = False


class UserSimError(GymError):
    """The model playing the user (an agent's user simulator) failed past its retries, or answered
    unusably: the conversation cannot go on, and nothing about the policy was learnt."""

    kind = "user_sim_error"


class ToolSimError(GymError):
    """The tool simulator (a model, or the task's recorded outputs) could not answer a tool call."""

    kind = "tool_sim_error"


class HarnessError(GymError):
    """The harness command an agent runs exited with an error (or could not be started)."""

    kind = "harness_error"


class Retry(Exception):
    """Raised by a handler to ask for redelivery after ``delay`` seconds (counts against the budget)."""

    def __init__(self, delay: float = 1.0, reason: str = "retry requested") -> None:
        super().__init__(reason)
        self.delay = delay
        self.reason = reason


class UsageError(Exception):
    """A mistake the user can fix before anything runs (a config key, a flag, a file, a name, an
    unreachable address). The CLI prints it as one line and exits with 2; never a traceback."""


class ConfigError(UsageError, ValueError):
    """The run config is missing or invalid; the message names the key (or the flag) and the value."""


class InputError(UsageError, ValueError):
    """The task file, a run id or a function cannot be used; the message says which and why."""


RETRIED_KINDS: frozenset[FailureKind] = frozenset({"tool_error", "verifier_error", "sandbox_error", "internal"})
"""The default retry policy (``runtime.engine.retry.DEFAULT_RETRY``; a run overrides it with ``Options.retry``)."""
