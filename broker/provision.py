"""Provisioning a broker before any worker runs (``gymbus init``): streams, buckets and consumers.

Workers create all of this themselves, idempotently. Provisioning ahead matters where no worker
may be running: tasks published by any NATS client are stored (the work stream exists), and an
autoscaler that scales a function from zero replicas finds the function's durable consumer and
its lag (KEDA's ``nats-jetstream`` scaler reads the consumer's pending count).
"""

from __future__ import annotations

from nats.js import JetStreamContext

from broker import advisories, names, topology
from broker.topology import Limits, Role


def roles(agents: list[str], envs: list[str]) -> list[tuple[Role, str]]:
    """The (role, function) consumers that the named agents and environments are served through."""
    for name in [*agents, *envs]:
        names.check("function name", name)
    out: list[tuple[Role, str]] = [("agent", a) for a in agents]
    for env in envs:
        out += [("tool", env), ("verify", env)]
    return out


async def provision(js: JetStreamContext, agents: list[str], envs: list[str], limits: Limits) -> list[str]:
    """Create (or update) every stream and bucket, the durable consumers of the named functions, and
    the profiler's and the janitors' (which their least-privileged identities may not create)."""
    wanted = roles(agents, envs)
    await topology.ensure(js, limits)
    made = [await topology.ensure_consumer(js, role, name, limits) for role, name in wanted]
    return [*made, await topology.ensure_profiler(js, limits), await advisories.ensure_consumer(js)]
