"""The whole event protocol on one screen: streams, subjects, durable consumers and KV buckets.

    gym.agent.<agent>    Start              -> the agent's first step      (stream GYM_WORK, work queue)
    gym.agent.<agent>.resume
                         Resume             -> the agent's next step       (only workers publish here)
    gym.tool.<env>       Seed | Tools       -> the environment's tools     (stream GYM_WORK, work queue)
    gym.verify.<env>     Verify             -> the environment's verifier  (stream GYM_WORK, work queue)
    gym.result.<run_id>  Result             -> collectors, the profiler    (stream GYM_RESULTS, kept)
    gym.dead.<function>  dead letters       -> operators, `gymbus replay`  (stream GYM_DEAD, kept)
    $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.GYM_WORK.*
                         advisories         -> the janitor                 (stream GYM_ADVISORIES, work queue)

    KV sessions  <run_id>.<task>.<rollout>  live rollout state (CAS on the step counter)
    KV runs      <run_id>...                 run manifests and profiler snapshots (<run_id>.profile)
    KV models    <model name>                the model's live endpoints
    KV functions agent.<name>, env.<name>    each function as its workers registered it (broker/functions.py)
    KV sandboxes <pool>.<slot>               fleet-wide sandbox admission: one leased key per running sandbox

Every function has one durable pull consumer per subject, shared by all its replicas (an agent's
takes both of its subjects); the profiler
has one on the results stream (``profiler``, all of ``gym.result.>``).
`ensure` creates all of it and is idempotent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Literal

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError

from broker.denials import PermissionDenied, create_or_find

WORK_STREAM = "GYM_WORK"
RESULTS_STREAM = "GYM_RESULTS"
DEAD_STREAM = "GYM_DEAD"
ADVISORY_STREAM = "GYM_ADVISORIES"
MAX_DELIVERIES_SUBJECT = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{WORK_STREAM}.*"
"""The broker's core-NATS advisory for a work message that spent its delivery budget; captured in a
stream so none is lost while no janitor listens (see runtime/engine/janitor.py)."""
SESSIONS = "sessions"
RUNS = "runs"
MODELS = "models"
FUNCTIONS = "functions"
SANDBOXES = "sandboxes"
"""Leases of the fleet-wide sandbox semaphore (runtime/sandbox/admission.py); per-key TTLs."""

MAX_MSG_SIZE = 8 * 1024 * 1024
"""Largest message a stream accepts; the shipped server config raises max_payload to match."""

Role = Literal["agent", "tool", "verify"]


def agent_subject(agent: str) -> str:
    """Where Starts go: submitters publish here."""
    return f"gym.agent.{agent}"


RESUME_SUFFIX = ".resume"


def resume_subject(agent: str) -> str:
    """Where the agent's later steps go. Only workers may publish here (broker/auth.py), so a Resume
    may carry the session it follows, as a message to an environment does (broker/schemas.py `Carrier`)."""
    return f"gym.agent.{agent}{RESUME_SUFFIX}"


def tool_subject(env: str) -> str:
    return f"gym.tool.{env}"


def verify_subject(env: str) -> str:
    return f"gym.verify.{env}"


def result_subject(run_id: str) -> str:
    return f"gym.result.{run_id}"


def dead_subject(function: str) -> str:
    return f"gym.dead.{function}"


PROFILER = "profiler"
"""The profiler's durable consumer on the results stream."""


def manifest_key(run_id: str) -> str:
    return f"{run_id}.manifest"


def profile_key(run_id: str) -> str:
    """Where the profiler keeps a run's latest profile snapshot in the ``runs`` bucket."""
    return f"{run_id}.profile"


def subject(role: Role, name: str) -> str:
    return f"gym.{role}.{name}"


def subjects(role: Role, name: str) -> list[str]:
    """Every subject the durable consumer of ``(role, name)`` takes."""
    return [agent_subject(name), resume_subject(name)] if role == "agent" else [subject(role, name)]


def function_of(work_subject: str) -> tuple[str, str]:
    """``(role, name)`` of a work subject: ``gym.agent.a.resume`` -> ``("agent", "a")``."""
    _, role, rest = work_subject.split(".", 2)
    return role, rest.split(".", 1)[0]


def durable(role: Role, name: str) -> str:
    """The durable consumer of ``gym.<role>.<name>``, shared by every replica of the function."""
    return f"{role}-{name}"


class InvalidLimit(ValueError):
    """A ``GYMBUS_<LIMIT>`` variable that is not a value the field can take (the message names it)."""


@dataclass(frozen=True)
class Limits:
    """Delivery and retention knobs; the defaults suit a model call that may take minutes."""

    ack_wait_s: float = 30.0
    """Redeliver a message nobody acked or marked in progress for this long (a dead worker)."""
    max_deliver: int = 5
    """Delivery budget per message; past it the message is dead-lettered and its rollout fails."""
    max_ack_pending: int = 4096
    """Unacked messages in flight per consumer (flow control across all replicas)."""
    work_dedupe_s: float = 600.0
    """Duplicate window of the work stream (Nats-Msg-Id), longer than a full redelivery cycle."""
    results_dedupe_s: float = 3600.0
    """Duplicate window of the results stream."""
    done_ttl_s: float = 600.0
    """How long a finished session stays in the sessions bucket (so a late duplicate of one of its
    messages finds it done), then expires: as long as the work stream's duplicate window. A failed
    rollout's session stays for session_ttl_s, so `gymbus replay` can run it again."""
    session_ttl_s: float = 7 * 24 * 3600.0
    """Backstop expiry of session keys (each step rewrites the key, so only abandoned ones expire)."""
    stream_replicas: int = 1
    """Copies of every stream and bucket in a NATS cluster (3 on a 3-node cluster; 1 on a single server).
    Every process applies it when it ensures the topology, so all of them must be given the same value."""

    @classmethod
    def from_env(cls) -> Limits:
        """Defaults overridden by ``GYMBUS_<FIELD>`` variables (e.g. ``GYMBUS_ACK_WAIT_S=5``)."""
        values = {}
        for f in fields(cls):
            raw = os.environ.get(f"GYMBUS_{f.name.upper()}")
            if raw is not None:
                try:
                    values[f.name] = type(getattr(cls, f.name))(raw)
                except ValueError:
                    raise InvalidLimit(f"GYMBUS_{f.name.upper()}={raw!r} is not a valid {f.name}") from None
        if values.get("done_ttl_s", 1) < 1:
            raise InvalidLimit(
                f"GYMBUS_DONE_TTL_S={values['done_ttl_s']:g}: a finished session must stay at least 1 s "
                f"(the default, {cls.done_ttl_s:g}, is the work stream's duplicate window)"
            )
        return cls(**values)


DEFAULT_LIMITS = Limits()


def work_stream(limits: Limits = DEFAULT_LIMITS) -> StreamConfig:
    return StreamConfig(
        name=WORK_STREAM,
        description="gymbus work: agent steps, tool calls, verifications",
        subjects=["gym.agent.>", "gym.tool.>", "gym.verify.>"],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        max_msg_size=MAX_MSG_SIZE,
        duplicate_window=limits.work_dedupe_s,
    )


def results_stream(limits: Limits = DEFAULT_LIMITS) -> StreamConfig:
    return StreamConfig(
        name=RESULTS_STREAM,
        description="gymbus results, kept for resume, replay and profiling",
        subjects=["gym.result.>"],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_msg_size=MAX_MSG_SIZE,
        duplicate_window=limits.results_dedupe_s,
        allow_direct=True,
    )


def dead_stream() -> StreamConfig:
    return StreamConfig(
        name=DEAD_STREAM,
        description="gymbus dead letters: messages that failed for good, with their error",
        subjects=["gym.dead.>"],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_msg_size=MAX_MSG_SIZE,
        duplicate_window=120.0,
    )


def advisory_stream() -> StreamConfig:
    return StreamConfig(
        name=ADVISORY_STREAM,
        description="gymbus: max-deliveries advisories of the work stream, kept until the janitor moves the message",
        subjects=[MAX_DELIVERIES_SUBJECT],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        max_age=7 * 24 * 3600.0,
    )


def kv_stream(bucket: str, ttl_s: float | None = None, history: int = 1) -> StreamConfig:
    """A KV bucket as its backing stream, so options nats-py's helper lacks (per-message TTL) can be set."""
    return StreamConfig(
        name=f"KV_{bucket}",
        subjects=[f"$KV.{bucket}.>"],
        max_msgs_per_subject=history,
        discard=DiscardPolicy.NEW,
        storage=StorageType.FILE,
        max_msg_size=MAX_MSG_SIZE,
        max_age=ttl_s,
        allow_rollup_hdrs=True,
        deny_delete=True,
        allow_direct=True,
        allow_msg_ttl=True,
        duplicate_window=120.0 if not ttl_s else min(120.0, ttl_s),
    )


def consumer(role: Role, name: str, limits: Limits = DEFAULT_LIMITS) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=durable(role, name),
        name=durable(role, name),
        filter_subjects=subjects(role, name),
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=limits.ack_wait_s,
        max_deliver=limits.max_deliver,
        max_ack_pending=limits.max_ack_pending,
        max_waiting=512,
    )


def profiler_consumer(limits: Limits = DEFAULT_LIMITS) -> ConsumerConfig:
    """Every Result from the start of the stream; never dead-lettered (a profile folds, it does not fail)."""
    return ConsumerConfig(
        durable_name=PROFILER,
        name=PROFILER,
        filter_subject="gym.result.>",
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=limits.ack_wait_s,
        max_deliver=-1,
        max_ack_pending=limits.max_ack_pending,
        max_waiting=512,
    )


async def ensure_profiler(js: JetStreamContext, limits: Limits = DEFAULT_LIMITS) -> str:
    """Create (or update) the profiler's durable consumer on the results stream; returns its name.
    An identity that may not (broker/auth.py) finds the one `gymbus init` made."""
    await create_or_find(
        js.add_consumer(RESULTS_STREAM, config=profiler_consumer(limits)),
        lambda: js.consumer_info(RESULTS_STREAM, PROFILER),
        f"consumer {PROFILER}",
    )
    return PROFILER


def streams(limits: Limits = DEFAULT_LIMITS) -> list[StreamConfig]:
    configs = [
        work_stream(limits),
        results_stream(limits),
        dead_stream(),
        advisory_stream(),
        kv_stream(SESSIONS, ttl_s=limits.session_ttl_s),
        kv_stream(RUNS),
        kv_stream(MODELS),
        kv_stream(FUNCTIONS),
        kv_stream(SANDBOXES),
    ]
    for config in configs:
        config.num_replicas = limits.stream_replicas
    return configs


async def ensure(js: JetStreamContext, limits: Limits = DEFAULT_LIMITS) -> None:
    """Create every stream and bucket, or bring an existing one to this configuration. An identity
    that may not change streams (broker/auth.py) checks they exist: an admin provisioned them."""
    for config in streams(limits):
        await _ensure_stream(js, config)


async def ensure_consumer(js: JetStreamContext, role: Role, name: str, limits: Limits = DEFAULT_LIMITS) -> str:
    """Create (or update) the durable consumer of the function's `subjects`; returns its name."""
    config = consumer(role, name, limits)
    name_ = config.durable_name or ""
    wanted = config.filter_subjects or []

    def lacks(info: ConsumerInfo) -> str:
        taken = {info.config.filter_subject, *(info.config.filter_subjects or [])}
        missing = [s for s in wanted if s not in taken]
        return f"take {', '.join(missing)} as well" if missing else ""

    await create_or_find(
        js.add_consumer(WORK_STREAM, config=config),
        lambda: js.consumer_info(WORK_STREAM, name_),
        f"consumer {name_} on stream {WORK_STREAM}",
        lacks,
    )
    return name_


async def has_consumer(js: JetStreamContext, role: Role, name: str) -> bool:
    try:
        await js.consumer_info(WORK_STREAM, durable(role, name))
    except NotFoundError:
        return False
    return True


async def _ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    try:
        await js.stream_info(config.name or "")
    except NotFoundError:
        try:
            await js.add_stream(config)
            return
        except BadRequestError as exc:  # created concurrently by another process
            if exc.err_code != 10058:
                raise
        except PermissionDenied as denied:
            raise PermissionDenied(
                denied.identity,
                f"{denied.operation}, which does not exist yet: run `gymbus init` as admin first",
                denied.subject,
            ) from None
    try:
        await js.update_stream(config)
    except PermissionDenied:
        pass  # provisioned by an admin; this identity only uses it
