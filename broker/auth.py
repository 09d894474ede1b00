"""Least privilege on the broker: one identity per role, each allowed only the subjects its job uses.

Every JetStream operation is a publish to a subject (``$JS.API.STREAM.DELETE.GYM_WORK``,
``$JS.API.CONSUMER.MSG.NEXT.GYM_WORK.agent-simple_agent``, ``$JS.ACK...``, ``$KV.sessions.<key>``),
so a user's publish and subscribe allow-lists in the server's ``authorization`` block say exactly
what it may do. Each identity authenticates with an nkey (an Ed25519 key pair: the server holds
only the public key, the client signs the server's challenge with its seed, nothing secret crosses
the wire) and receives replies on an inbox prefix of its own (``_INBOX.<identity>``), so no identity
can read another's replies, pulled messages included.

    identity          may
    admin             everything (`gymbus init`: streams, buckets, consumers)
    agent-<A>         pull and ack its consumer; read and write sessions; read the models bucket;
                      publish the tool and verify messages of the deployment's environments, its own
                      Resumes (an agent that steps again) and Starts (a rollout started over), Results,
                      and its own dead letters; register itself and read the environments' registrations
                      (KV functions) and the environments' tool consumers; read run manifests (defaults)
    env-<E>           pull and ack its tool and verify consumers; read and write sessions; publish
                      the deployment's agents' Resumes and Starts (a rollout started over), Results
                      and its own dead letters; register itself (KV functions); read run manifests
    submitter         publish Starts to the deployment's agents (never Resumes: a Resume carries a
                      session, which only a worker may vouch for) and run manifests; read Results,
                      sessions and run manifests (what `gymbus submit` and `collect --nats` do);
                      publish failed Results for task rows it cannot submit
    profiler          pull and ack the results stream's profiler consumer; read Results and run
                      manifests; write run profiles
    janitor           `gymbus janitor`: max-deliveries advisories, move lost or unserved work
                      messages to dead letters, fail overdue sessions, publish again the message a
                      stalled session calls for (Resumes, tool and verify messages), hold its lease;
                      list the registered functions (an unserved subject of an unknown one fails sooner)
    operator          read every stream, consumer and bucket (`gymbus status`, `profile --run`,
                      `dead-letters`, `schema start --env`) and publish replayed Starts (`gymbus replay`)
    model             register model endpoints in the models bucket (`gymbus model serve`)

What subjects cannot say: a run id is data, not an identity, so a worker may publish a Result for
any run (every run's rollouts reach every replica) and the submitter reads every run's Results.
Deleting or purging a stream, changing a consumer, reading another function's work subjects and
subscribing to anything but its own inbox are denied to all but admin.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker import names, topology

API = "$JS.API"


@dataclass(frozen=True)
class Identity:
    """One user of the broker: its name, what it may publish, and what it may subscribe to."""

    name: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...] = ()

    @property
    def inbox_prefix(self) -> str:
        return inbox_prefix(self.name)

    def allows(self) -> dict[str, list[str]]:
        """The permissions block of this user: its subjects, plus its own inbox to subscribe to."""
        return {"publish": list(self.publish), "subscribe": [*self.subscribe, f"{self.inbox_prefix}.>"]}


def inbox_prefix(identity: str) -> str:
    return f"_INBOX.{identity}"


def _pull(stream: str, consumer: str) -> tuple[str, ...]:
    return (
        f"{API}.CONSUMER.INFO.{stream}.{consumer}",
        f"{API}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        f"$JS.ACK.{stream}.{consumer}.>",
    )


def _read(stream: str) -> tuple[str, ...]:
    """Read a stream's messages by sequence or subject (direct and API gets)."""
    return (f"{API}.DIRECT.GET.{stream}", f"{API}.DIRECT.GET.{stream}.>", f"{API}.STREAM.MSG.GET.{stream}")


def _follow(stream: str) -> tuple[str, ...]:
    """Replay a stream through ephemeral ordered consumers (KV watches and key listings, result feeds)."""
    return (f"{API}.CONSUMER.CREATE.{stream}", f"{API}.CONSUMER.CREATE.{stream}.>", f"$JS.FC.{stream}.>")


_INFO = (f"{API}.STREAM.INFO.*", f"{API}.STREAM.NAMES")
_SESSIONS_RW = (*_read(f"KV_{topology.SESSIONS}"), f"$KV.{topology.SESSIONS}.>")
_RUNS_READ = _read(f"KV_{topology.RUNS}")
_FUNCTIONS_READ = (*_read(f"KV_{topology.FUNCTIONS}"), *_follow(f"KV_{topology.FUNCTIONS}"))
"""Read registrations (KV functions) and list them."""


def agent_worker(agent: str, envs: list[str]) -> Identity:
    work = [s for e in envs for s in (topology.tool_subject(e), topology.verify_subject(e))]
    return Identity(
        f"agent-{agent}",
        (
            *_INFO,
            *_pull(topology.WORK_STREAM, topology.durable("agent", agent)),
            *_SESSIONS_RW,
            *_read(f"KV_{topology.MODELS}"),
            *_follow(f"KV_{topology.MODELS}"),
            *work,
            *topology.subjects("agent", agent),
            "gym.result.*",
            topology.dead_subject(agent),
            *_RUNS_READ,
            *_FUNCTIONS_READ,
            f"$KV.{topology.FUNCTIONS}.agent.{agent}",
            *(f"{API}.CONSUMER.INFO.{topology.WORK_STREAM}.{topology.durable('tool', e)}" for e in envs),
        ),
    )


def env_worker(env: str, agents: list[str]) -> Identity:
    return Identity(
        f"env-{env}",
        (
            *_INFO,
            *_pull(topology.WORK_STREAM, topology.durable("tool", env)),
            *_pull(topology.WORK_STREAM, topology.durable("verify", env)),
            *_SESSIONS_RW,
            *(subject for a in agents for subject in topology.subjects("agent", a)),
            "gym.result.*",
            topology.dead_subject(env),
            *_RUNS_READ,
            *_read(f"KV_{topology.FUNCTIONS}"),
            f"$KV.{topology.FUNCTIONS}.env.{env}",
        ),
    )


def identities(agents: list[str], envs: list[str]) -> list[Identity]:
    """Every identity of a deployment serving these agents and environments."""
    for name in [*agents, *envs]:
        names.check("function name", name)
    starts = tuple(topology.agent_subject(a) for a in agents)
    return [
        Identity("admin", (">",), (">",)),
        *(agent_worker(a, envs) for a in agents),
        *(env_worker(e, agents) for e in envs),
        submitter(starts),
        profiler(),
        janitor(),
        operator(starts),
        Identity("model", (*_INFO, *_read(f"KV_{topology.MODELS}"), f"$KV.{topology.MODELS}.>")),
    ]


def submitter(starts: tuple[str, ...]) -> Identity:
    return Identity(
        "submitter",
        (
            *_INFO,
            f"{API}.CONSUMER.INFO.{topology.WORK_STREAM}.*",
            *starts,
            "gym.result.*",
            f"$KV.{topology.RUNS}.*.manifest",
            *_RUNS_READ,
            *_read(f"KV_{topology.SESSIONS}"),
            *_follow(topology.RESULTS_STREAM),
        ),
    )


def profiler() -> Identity:
    results = topology.RESULTS_STREAM
    return Identity(
        "profiler",
        (*_INFO, *_pull(results, topology.PROFILER), *_read(results), *_RUNS_READ, f"$KV.{topology.RUNS}.*.profile"),
    )


def janitor() -> Identity:
    work = topology.WORK_STREAM
    return Identity(
        "janitor",
        (
            *_INFO,
            f"{API}.CONSUMER.LIST.{work}",
            *_pull(topology.ADVISORY_STREAM, "janitor"),
            f"{API}.STREAM.MSG.GET.{work}",
            f"{API}.STREAM.MSG.DELETE.{work}",
            *_SESSIONS_RW,
            *_follow(f"KV_{topology.SESSIONS}"),
            *_RUNS_READ,
            f"$KV.{topology.RUNS}.janitor.>",
            *_FUNCTIONS_READ,
            "gym.result.*",
            "gym.dead.*",
            f"gym.agent.*{topology.RESUME_SUFFIX}",
            "gym.tool.*",
            "gym.verify.*",
        ),
    )


def operator(starts: tuple[str, ...]) -> Identity:
    results = topology.RESULTS_STREAM
    return Identity(
        "operator",
        (
            *_INFO,
            f"{API}.CONSUMER.INFO.*.*",
            f"{API}.CONSUMER.LIST.*",
            *(s for stream in (topology.DEAD_STREAM, results) for s in _read(stream)),
            *_read(f"KV_{topology.SESSIONS}"),
            *_RUNS_READ,
            *_follow(f"KV_{topology.RUNS}"),
            *_read(f"KV_{topology.MODELS}"),
            *_follow(f"KV_{topology.MODELS}"),
            *_FUNCTIONS_READ,
            *_follow(results),
            *starts,
        ),
    )


@dataclass
class ClientAuth:
    """How this process connects: its identity's name and the nats-py options that prove it."""

    identity: str = ""
    options: dict[str, Any] = field(default_factory=dict)


NKEY_ENV = "NATS_NKEY"
"""Path of this process's nkey seed file (``<identity>.nk``, as `gymbus auth init` writes it)."""
TLS_ENV = ("NATS_TLS_CA", "NATS_TLS_CERT", "NATS_TLS_KEY")
"""CA bundle to verify the broker with; a client certificate and its key (mutual TLS)."""


def client_auth(env: dict[str, str] | None = None) -> ClientAuth:
    """The identity and TLS settings of this process, from $NATS_NKEY (or $NATS_CREDS) and $NATS_TLS_*."""
    env = dict(os.environ) if env is None else env
    auth = ClientAuth()
    seed = env.get(NKEY_ENV) or None
    creds = env.get("NATS_CREDS") or None
    if seed:
        path = Path(seed)
        if not path.is_file():
            raise ValueError(f"{NKEY_ENV}={seed!r}: no such file (an nkey seed file written by `gymbus auth init`)")
        auth.identity = path.stem
        auth.options["nkeys_seed"] = str(path)
    elif creds:
        auth.identity = Path(creds).stem
    if auth.identity and names.valid(auth.identity):
        auth.options["inbox_prefix"] = inbox_prefix(auth.identity)
    ca, cert, key = (env.get(v) or None for v in TLS_ENV)
    if ca or cert:
        auth.options["tls"] = tls_context(ca, cert, key)
    return auth


def tls_context(ca: str | None, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """A client TLS context verifying the broker with ``ca`` (else the system's CAs), with an optional client cert."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    if cert:
        context.load_cert_chain(cert, key)
    return context
