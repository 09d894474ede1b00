"""Every message on the gymbus wire, and the session record kept in KV.

Wire messages are JSON (so any NATS client can publish a task: see `gymbus schema`), tagged by
the field ``kind``. Session records are msgpack (compact, never read by other languages).

Schema evolution follows msgspec's rules: a new field comes with a default and an existing field's
type never changes. What producers write (a Start and its Options, a run's Manifest) rejects
unknown fields, so a typo is an error with its path, not a setting silently ignored: a new field
there reaches the workers before the producers that use it. Messages between workers ignore
unknown fields, so old workers tolerate new ones during a rolling upgrade. What gymbus writes for
readers in any language (a Result, a DeadLetter) carries every field, defaults included.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from broker import names
from broker.training import Trajectory, Turn

RunId = Annotated[str, Meta(pattern=names.PATTERN, description=f"Run id: {names.RULE}.")]
Name = Annotated[str, Meta(pattern=names.PATTERN, description=f"A function name (one subject token): {names.RULE}.")]
Index = Annotated[int, Meta(ge=0)]
SessionId = Annotated[
    str,
    Meta(pattern=rf"{names.PATTERN[:-1]}\.[0-9]+\.[0-9]+$", description="<run_id>.<task_index>.<rollout_index>"),
]

FailureKind = Literal[
    "invalid_input",  # the task or a message failed validation; never retried
    "model_error",  # the policy endpoint failed past its retry budget
    "context_length",  # the conversation no longer fits the model's context
    "tool_error",  # an environment tool raised past its retry budget
    "verifier_error",  # the verifier raised past its retry budget
    "sandbox_error",  # a code sandbox could not run the candidate's code (infrastructure, never the candidate)
    "judge_error",  # a judge model's verdict was not in the form the environment expects
    "env_lost",  # the environment instance holding the rollout's state died or was replaced mid-rollout
    "timeout",  # the rollout or one of its steps ran past its deadline
    "worker_lost",  # a message spent its delivery budget without an answer (workers died)
    "cancelled",  # the user cancelled the rollout
    "internal",  # a gymbus invariant broke (a bug): reported, never scored
    "history_changed",  # token_exact: the conversation changed before the model's last turn; cannot be spliced
    "user_sim_error",  # the agent's user simulator model failed past its retries, or answered unusably
    "tool_sim_error",  # the agent's tool simulator (a model, or recorded outputs) could not answer a call
    "harness_error",  # the harness command an agent runs exited with an error
]


class Msg(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="kind", tag=str.lower):
    """A wire message: immutable, keyword-only, tagged by its lowercased class name in ``kind``."""


class Options(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """Per-rollout limits and model options, fixed when the rollout starts and carried in its session.
    A field a Start leaves out takes the run's default (its manifest's ``defaults.options``), else this one."""

    max_steps: Annotated[int, Meta(ge=1)] = 8
    """Most agent turns (model calls) before the rollout is sent to verification."""
    rollout_timeout_s: Annotated[float, Meta(gt=0)] = 600.0
    """Wall-clock budget for the whole rollout, from submission; past it the rollout fails with `timeout`."""
    step_timeout_s: Annotated[float, Meta(gt=0)] = 300.0
    """Budget for one handler run (one model call, one batch of tools, one verification)."""
    seed: bool = False
    """Route the new session through the environment's `seed` before the first agent turn."""
    return_token_ids: bool = False
    """Ask the model for prompt/generation token ids and logprobs (vLLM) and keep them in the Result."""
    chat_template_kwargs: dict[str, Any] = {}
    """Passed to the model server's chat template (vLLM), e.g. ``{"enable_thinking": false}``."""
    retry: list[FailureKind] | None = None
    """Failure kinds redelivered with backoff until the delivery budget is spent (None: the default
    policy, ``runtime.engine.retry.DEFAULT_RETRY``); the other kinds end the rollout at once."""
    token_exact: bool = False
    """Keep one token sequence for the whole rollout: every turn's prompt is the previous turn's prompt
    and generation (the model's own ids, never re-tokenized) plus the tokenized new messages, sent as
    token ids (vLLM ``/v1/completions``); the Result carries it as ``trajectory``. Implies token ids."""
    invalid_tool_calls: Literal["return_error", "fail"] = "return_error"
    """A tool call the model got wrong (unknown tool, invalid JSON, arguments failing the schema):
    ``return_error`` answers it with an error output the model reads on its next turn; ``fail`` ends
    the rollout with ``invalid_input`` naming the call."""
    agent_options: dict[str, Any] = {}
    """The agent's own settings (the run config's ``agent_options``), checked against the agent's
    ``config`` type before the run starts (e.g. ``{"max_corrections": 2}``)."""


class Start(Msg, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Begin a rollout: one repeat of one task. Published to ``gym.agent.<agent>`` with the message id
    ``<run_id>.<task_index>.<rollout_index>:start:<attempt>``."""

    run_id: RunId
    """The run this rollout belongs to; its Result goes to ``gym.result.<run_id>``."""
    task_index: Index
    """Index of the task row in the run's input."""
    rollout_index: Index = 0
    """Which repeat of the task this is (0 … repeats-1)."""
    attempt: Index = 0
    """Bumped to re-run a finished rollout (resume after a lost Result, `gymbus replay`)."""
    agent: Name
    """The agent function that takes the steps: the one whose subject ``gym.agent.<agent>`` this is published to."""
    env: Name
    """The environment whose tools run and whose verifier scores the answer."""
    model: str = "policy"
    """Model name: looked up in the ``models`` KV bucket for endpoints, and sent as the request's model."""
    responses_create_params: dict[str, Any]
    """OpenAI Responses create body: ``input`` (str or items), ``tools``, sampling parameters (see
    `broker.params.CreateParams`). Parameters it leaves out take the run's defaults; without ``tools``
    the environment's tools are offered."""
    meta: dict[str, Any] = {}
    """The task row's other fields, for the verifier (``expected_answer``, …); never sent to the model.
    Checked against the environment's schema of them (``gymbus schema start --env ENV``)."""
    options: Options = Options()
    """Limits and model options for this rollout; a field left out takes the run's default."""


class FunctionCall(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call the model asked for (a Responses ``function_call`` item)."""

    call_id: str
    """The model's id for the call; its output carries the same id."""
    name: str
    """Tool name."""
    arguments: str
    """Arguments as the model wrote them: a JSON string, not yet validated."""


class Carrier(Msg, frozen=True, kw_only=True):
    """A message a worker publishes right after committing a step, which may carry the session it
    applies to.

    The publisher just committed that session, so on a first delivery the worker takes it from the
    message instead of reading the sessions bucket; its compare-and-set on ``rev`` is the fence
    either way. A redelivery, or a message without ``state``, reads the bucket. Only workers may
    publish on the subjects these travel (broker/auth.py), so a submitter cannot forge a state."""

    state: bytes | None = None
    """The session as committed at ``rev`` (msgpack, base64 in JSON); absent when it is over
    `CARRY_MAX_BYTES` or the message is a re-emit."""
    rev: int = 0
    """The session's KV revision ``state`` was committed at."""
    attempt: Index = 0
    """The rollout's attempt this message belongs to; a message of another attempt is stale."""


NUDGE = "Gymbus-Nudge"
"""Header of a Start sent again for a rollout still in flight (a resume's nudge, runtime/runs/rollouts.py):
the agent reads the session before anything else, and publishes again what the session calls for."""


class Resume(Carrier, frozen=True, kw_only=True):
    """Tool outputs of the previous turn are committed: run the agent turn at ``step``. Published to
    ``gym.agent.<agent>.resume``, a subject only workers may publish to."""

    session_id: SessionId
    """The rollout's session key, ``<run_id>.<task_index>.<rollout_index>``."""
    step: Index
    """The session's step counter this message applies to; anything else is stale."""


class ToEnv(Carrier, frozen=True, kw_only=True):
    """A message to an environment (``gym.tool.<env>``, ``gym.verify.<env>``)."""


CARRY_MAX_BYTES = 64 * 1024
"""Sessions larger than this are read from the bucket rather than carried in the message."""


class Seed(ToEnv, frozen=True, kw_only=True):
    """Let the environment set up a new session's state before the first agent turn."""

    session_id: SessionId
    """The rollout's session key."""
    step: Index
    """The session's step counter this message applies to."""


class Tools(ToEnv, frozen=True, kw_only=True):
    """Run all function calls of one agent turn, in order, and commit their outputs together."""

    session_id: SessionId
    """The rollout's session key."""
    step: Index
    """The session's step counter this message applies to."""
    calls: list[FunctionCall]
    """The calls, in the order the model made them."""


class Verify(ToEnv, frozen=True, kw_only=True):
    """The rollout is finished: score the final answer and publish the Result."""

    session_id: SessionId
    """The rollout's session key."""
    step: Index
    """The session's step counter this message applies to."""


class Usage(msgspec.Struct, kw_only=True, gc=False):
    """Token counts summed over the rollout's model calls (numbers only: not tracked by the garbage collector)."""

    input_tokens: int = 0
    """Prompt tokens, summed over calls."""
    output_tokens: int = 0
    """Generated tokens, summed over calls."""


class Timings(msgspec.Struct, kw_only=True, gc=False):
    """Where a rollout's time went, in seconds, summed over its hops (numbers only: not tracked by the
    garbage collector)."""

    submitted_at: float = 0.0
    """Unix time the Start was stored by the broker."""
    finished_at: float = 0.0
    """Unix time the Result was built."""
    queue_s: float = 0.0
    """Time messages of this rollout waited in the queue before a worker took them."""
    model_s: float = 0.0
    """Time spent in model calls (including retries)."""
    tool_s: float = 0.0
    """Time spent running tools."""
    verify_s: float = 0.0
    """Time spent in the verifier."""
    handler_s: float = 0.0
    """Time spent inside handlers, all included; minus model, tool and verify time it is the overhead."""
    hops: int = 0
    """Messages handled for this rollout."""
    model_calls: int = 0
    """Model calls made."""
    tool_calls: int = 0
    """Tool calls run."""

    @property
    def total_s(self) -> float:
        return max(0.0, self.finished_at - self.submitted_at)


class Result(Msg, frozen=True, kw_only=True, omit_defaults=False):
    """One finished rollout: a reward, or a failure with its kind. Published to ``gym.result.<run_id>``
    with every field present (``reward: null`` on a failure, ``attempt: 0``, ...)."""

    session_id: str
    """The rollout's session key."""
    run_id: RunId
    """The run."""
    task_index: Index
    """Index of the task row."""
    rollout_index: Index = 0
    """Which repeat."""
    attempt: Index = 0
    """Which attempt produced this Result."""
    agent: str = ""
    """Agent function name."""
    env: str = ""
    """Environment name."""
    model: str = ""
    """Model name."""
    reward: float | None = None
    """The verifier's reward; None when the rollout failed (a failure is never a reward)."""
    failure_kind: FailureKind | None = None
    """Why the rollout failed, or None."""
    failure_reason: str | None = None
    """Readable reason, naming the field or the boundary that failed."""
    verifier: dict[str, Any] = {}
    """What the verifier reports besides the reward (``extracted_answer``, …)."""
    output: list[dict[str, Any]] = []
    """Responses-style items produced during the rollout: model outputs, tool calls and tool outputs."""
    usage: Usage = msgspec.field(default_factory=Usage)
    """Token counts."""
    sampling: dict[str, Any] = {}
    """The sampling parameters actually sent to the model."""
    turns: list[Turn] = []
    """Per model call token ids and logprobs, when requested."""
    trajectory: Trajectory | None = None
    """The rollout as one token sequence, when ``Options.token_exact``."""
    policy_versions: list[int] = []
    """The policy version that served each model call (set by the trainer in the models bucket)."""
    agent_info: dict[str, Any] = {}
    """What the agent reports (refinement attempts, compactions, harness runs, the episode of a step
    loop) and the token usage of the models it called besides the policy (``models``)."""
    timings: Timings = msgspec.field(default_factory=Timings)
    """Per-hop timings."""

    @property
    def failed(self) -> bool:
        return self.failure_kind is not None


Phase = Literal["seed", "model", "tools", "verify", "done"]


class Session(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A live rollout's state (KV ``sessions``): everything a stateless worker needs to take the next step."""

    session_id: str
    run_id: str
    task_index: int
    rollout_index: int = 0
    attempt: int = 0
    agent: str
    env: str
    model: str
    step: int
    """Transitions committed so far; a message applies only when its step equals this."""
    base_step: int = 0
    """The step this attempt started from (steps keep rising across attempts)."""
    phase: Phase
    params: dict[str, Any]
    """The Responses create body minus ``input``."""
    meta: dict[str, Any] = {}
    options: Options = Options()
    items: list[dict[str, Any]] = []
    """The conversation: input items, then every item produced since."""
    n_input: int = 0
    """How many leading items of ``items`` were the task's input."""
    pending: list[FunctionCall] = []
    """Calls awaiting the environment (phase ``tools``)."""
    env_state: dict[str, Any] = {}
    """The environment's own state, committed with each step."""
    agent_state: dict[str, Any] = {}
    """The agent's own state, committed with each step."""
    agent_info: dict[str, Any] = {}
    """What the agent reports, copied into the Result (``Result.agent_info``)."""
    checking: bool = False
    """The verify phase scores a draft for the agent (its ``Check`` action), not the final answer."""
    check_until: float | None = None
    """A check reaching this reward ends the rollout with it (None: the environment's maximum)."""
    checks: list[dict[str, Any]] = []
    """The verdicts of the agent's checks so far, in order: ``{"reward": r, "info": {...}}``."""
    turns_taken: int = 0
    """Agent turns (model calls) taken."""
    usage: Usage = msgspec.field(default_factory=Usage)
    sampling: dict[str, Any] = {}
    turns: list[Turn] = []
    trajectory: Trajectory | None = None
    policy_versions: list[int] = []
    timings: Timings = msgspec.field(default_factory=Timings)
    headers: dict[str, str] = {}
    """Trace context of the rollout, propagated to every message it emits."""
    result: Result | None = None
    """Set when the rollout is done, so a lost Result can be re-emitted from committed state."""


AgentMsg = Start | Resume
"""What the agent's consumer takes: Starts from ``gym.agent.<agent>``, Resumes from ``gym.agent.<agent>.resume``."""
ToolMsg = Seed | Tools
"""What ``gym.tool.<env>`` carries."""
VerifyMsg = Verify
"""What ``gym.verify.<env>`` carries."""
WireMsg = Start | Resume | Seed | Tools | Verify | Result
"""Every wire message."""

encoder = msgspec.json.Encoder()
session_encoder = msgspec.msgpack.Encoder()
agent_decoder = msgspec.json.Decoder(AgentMsg)
tool_decoder = msgspec.json.Decoder(ToolMsg)
verify_decoder = msgspec.json.Decoder(VerifyMsg)
result_decoder = msgspec.json.Decoder(Result)
wire_decoder = msgspec.json.Decoder(WireMsg)
session_decoder = msgspec.msgpack.Decoder(Session)


def session_id(run_id: str, task_index: int, rollout_index: int) -> str:
    """The session key of a rollout; deterministic, so submitting twice creates nothing twice."""
    return f"{run_id}.{task_index}.{rollout_index}"


def parse_session_id(sid: str) -> tuple[str, int, int]:
    """Inverse of `session_id`; raises ValueError on a malformed id."""
    run_id, task, rollout = sid.rsplit(".", 2)
    return run_id, int(task), int(rollout)
