"""Least privilege on a real broker: every identity of broker/auth.py against every operation.

The broker runs with `gymbus auth init`'s authorization block. Each cell of the matrix is one real
operation by one identity: an allowed one must work, a denied one must fail at once with
`PermissionDenied` naming the identity, the operation and the subject (never a timeout). What
nothing waits on (an ack, a subscription) is denied through the connection's error callback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.api import ConsumerConfig, StreamConfig
from nats.js.errors import KeyNotFoundError, NotFoundError, ServerError

from broker import credentials, topology
from broker.auth import ClientAuth, client_auth, identities
from broker.connect import BrokerUnavailable, connect
from broker.denials import GuardedClient, PermissionDenied
from broker.provision import provision
from broker.publish import publish_raw
from broker.server import EmbeddedServer
from broker.sessions import SessionStore

AGENTS, ENVS = ["simple_agent"], ["math"]
Op = Callable[[Client], Awaitable[object]]


def js_publish(subject: str) -> Op:
    """A publish to a stream as workers make them: on the connection's own inbox (broker/inbox.py)."""
    return lambda nc: publish_raw(nc.jetstream(), subject, b"{}")


async def read_session(nc: Client, sid: str) -> None:
    """A session read as the hot path makes it: a direct get on the connection's own inbox."""
    try:
        await SessionStore(nc.jetstream()).get(sid, any_replica=True)
    except msgspec.ValidationError:  # "write a session" stored b"{}", not a session: the read was allowed
        pass


async def pull(nc: Client, stream: str, consumer: str) -> None:
    """One pull request, as the worker sends them: on an inbox of its own, so no reply waits in the
    client; a caller sees its denial by watching the subject (`GuardedClient.watch`)."""
    assert isinstance(nc, GuardedClient)
    subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    denied = nc.watch(subject)
    reply = asyncio.ensure_future(sub.next_msg(timeout=5))  # a message, or the status saying there is none
    try:
        await nc.publish(subject, b'{"batch": 1, "no_wait": true}', reply=inbox)
        await asyncio.wait({denied, reply}, return_when=asyncio.FIRST_COMPLETED)
        if denied.done():
            raise denied.result()
        reply.result()
    finally:
        denied.cancel()
        reply.cancel()
        await sub.unsubscribe()


async def kv_get(nc: Client, bucket: str, key: str) -> None:
    kv = await nc.jetstream().key_value(bucket)
    try:
        await kv.get(key)
    except KeyNotFoundError:
        pass


async def kv_put(nc: Client, bucket: str, key: str) -> None:
    await (await nc.jetstream().key_value(bucket)).put(key, b"{}")


async def get_msg(nc: Client, stream: str) -> None:
    try:
        await nc.jetstream().get_msg(stream, seq=1)
    except NotFoundError:
        pass


async def follow_results(nc: Client) -> None:
    sub = await nc.jetstream().subscribe("gym.result.matrix", ordered_consumer=True)
    await sub.unsubscribe()


async def delete_work_message(nc: Client) -> None:
    try:
        await nc.jetstream().delete_msg(topology.WORK_STREAM, 10**9)
    except ServerError as exc:  # no such message ("stream store EOF"): the request was allowed
        assert exc.err_code == 10057, exc


async def create_consumer(nc: Client) -> None:
    config = ConsumerConfig(durable_name="matrix", name="matrix", filter_subject="gym.agent.matrix_probe")
    await nc.jetstream().add_consumer(topology.WORK_STREAM, config=config)


async def delete_stream(nc: Client) -> None:
    js = nc.jetstream()
    await js.delete_stream("SCRATCH")
    await js.add_stream(StreamConfig(name="SCRATCH", subjects=["scratch.>"]))


OPS: dict[str, Op] = {
    "create a stream": lambda nc: nc.jetstream().add_stream(StreamConfig(name="MATRIX", subjects=["matrix.>"])),
    "delete a stream": delete_stream,
    "create a consumer": create_consumer,
    "list consumers": lambda nc: nc.jetstream().consumers_info(topology.WORK_STREAM),
    "see math's tool consumer": lambda nc: nc.jetstream().consumer_info(topology.WORK_STREAM, "tool-math"),
    "publish a Start to simple_agent": js_publish("gym.agent.simple_agent"),
    "publish a Resume to simple_agent": js_publish("gym.agent.simple_agent.resume"),
    "publish to an agent outside the deployment": js_publish("gym.agent.intruder"),
    "publish a tool call to math": js_publish("gym.tool.math"),
    "publish a verification to math": js_publish("gym.verify.math"),
    "publish a Result": js_publish("gym.result.matrix"),
    "publish a dead letter of math": js_publish("gym.dead.math"),
    "pull simple_agent's work": lambda nc: pull(nc, topology.WORK_STREAM, "agent-simple_agent"),
    "pull math's tool calls": lambda nc: pull(nc, topology.WORK_STREAM, "tool-math"),
    "pull the profiler's Results": lambda nc: pull(nc, topology.RESULTS_STREAM, topology.PROFILER),
    "read a session": lambda nc: read_session(nc, "matrix.0.0"),
    "write a session": lambda nc: kv_put(nc, topology.SESSIONS, "matrix.0.0"),
    "read the runs bucket": lambda nc: kv_get(nc, topology.RUNS, "matrix.manifest"),
    "write a run manifest": lambda nc: kv_put(nc, topology.RUNS, "matrix.manifest"),
    "write a run profile": lambda nc: kv_put(nc, topology.RUNS, "matrix.profile"),
    "read the models bucket": lambda nc: kv_get(nc, topology.MODELS, "policy"),
    "read registrations": lambda nc: kv_get(nc, topology.FUNCTIONS, "env.math"),
    "register simple_agent": lambda nc: kv_put(nc, topology.FUNCTIONS, "agent.simple_agent"),
    "register math": lambda nc: kv_put(nc, topology.FUNCTIONS, "env.math"),
    "register a model endpoint": lambda nc: kv_put(nc, topology.MODELS, "policy"),
    "read Results": lambda nc: get_msg(nc, topology.RESULTS_STREAM),
    "follow a run's Results": follow_results,
    "read dead letters": lambda nc: get_msg(nc, topology.DEAD_STREAM),
    "delete a work message": delete_work_message,
}
START = "publish a Start to simple_agent"
RESUME = "publish a Resume to simple_agent"
SESSIONS_RW = {"read a session", "write a session"}
ALLOWED: dict[str, set[str]] = {
    "admin": set(OPS),
    "agent-simple_agent": {
        START,
        RESUME,
        "pull simple_agent's work",
        "publish a tool call to math",
        "publish a verification to math",
        "publish a Result",
        "read the models bucket",
        "read the runs bucket",
        "read registrations",
        "register simple_agent",
        "see math's tool consumer",
        *SESSIONS_RW,
    },
    "env-math": {
        START,
        RESUME,
        "pull math's tool calls",
        "publish a Result",
        "publish a dead letter of math",
        "read the runs bucket",
        "read registrations",
        "register math",
        "see math's tool consumer",
        *SESSIONS_RW,
    },
    "submitter": {
        START,
        "publish a Result",
        "read a session",
        "read the runs bucket",
        "write a run manifest",
        "follow a run's Results",
        "see math's tool consumer",
    },
    "profiler": {"pull the profiler's Results", "read Results", "read the runs bucket", "write a run profile"},
    "janitor": {
        RESUME,
        "publish a tool call to math",
        "publish a verification to math",
        "list consumers",
        "publish a Result",
        "publish a dead letter of math",
        "delete a work message",
        "read the runs bucket",
        "read registrations",
        *SESSIONS_RW,
    },
    "operator": {
        START,
        "list consumers",
        "see math's tool consumer",
        "read a session",
        "read the runs bucket",
        "read Results",
        "follow a run's Results",
        "read dead letters",
        "read registrations",
        "read the models bucket",
    },
    "model": {"read the models bucket", "register a model endpoint"},
}


def test_the_matrix_names_every_identity() -> None:
    assert [i.name for i in identities(AGENTS, ENVS)] == list(ALLOWED)


@pytest.fixture(scope="module")
def auth_dir(tmp_path_factory: pytest.TempPathFactory) -> credentials.Written:
    return credentials.write(tmp_path_factory.mktemp("auth"), AGENTS, ENVS)


@pytest.fixture(scope="module")
def broker(auth_dir: credentials.Written, tmp_path_factory: pytest.TempPathFactory) -> EmbeddedServer:
    with EmbeddedServer(tmp_path_factory.mktemp("broker"), auth_conf=auth_dir.server_conf) as server:
        yield server


def as_identity(written: credentials.Written, name: str) -> ClientAuth:
    return client_auth({"NATS_NKEY": str(written.seeds[name])})


@pytest.fixture
async def provisioned(broker: EmbeddedServer, auth_dir: credentials.Written) -> AsyncIterator[Client]:
    admin = await connect(broker.url, name="admin", auth=as_identity(auth_dir, "admin"))
    js = admin.jetstream()
    await provision(js, AGENTS, ENVS, topology.Limits())
    try:
        await js.add_stream(StreamConfig(name="SCRATCH", subjects=["scratch.>"]))
    except NatsError:
        pass
    yield admin
    for cleanup in (js.delete_stream("MATRIX"), js.delete_consumer(topology.WORK_STREAM, "matrix")):
        try:
            await cleanup
        except NotFoundError:
            pass
    await admin.close()


@pytest.mark.parametrize("identity", list(ALLOWED))
async def test_every_identity_can_do_its_job_and_nothing_else(
    identity: str, broker: EmbeddedServer, auth_dir: credentials.Written, provisioned: Client
) -> None:
    nc = await connect(broker.url, name=f"matrix-{identity}", auth=as_identity(auth_dir, identity))
    try:
        for name, op in OPS.items():
            if name in ALLOWED[identity]:
                await asyncio.wait_for(op(nc), 10)  # works
                continue
            with pytest.raises(PermissionDenied) as denied:
                await asyncio.wait_for(op(nc), 10)
            error = denied.value
            assert error.identity == identity, name
            assert error.subject in str(error) and f"identity {identity!r} may not" in str(error), name
    finally:
        await nc.close()


async def test_what_nothing_waits_on_is_reported_naming_identity_and_subject(
    broker: EmbeddedServer, auth_dir: credentials.Written, provisioned: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A subscription to another identity's replies or to the work subjects, an ack of another consumer."""
    nc = await connect(broker.url, name="snooper", auth=as_identity(auth_dir, "env-math"))
    assert isinstance(nc, GuardedClient)
    ack = "$JS.ACK.GYM_WORK.agent-simple_agent.1.1.1.0.0"
    try:
        with caplog.at_level(logging.WARNING, logger="gymbus.broker"):
            await nc.subscribe("_INBOX.admin.>")
            await nc.subscribe("gym.>")
            await nc.publish(ack, b"+ACK")
            deadline = asyncio.get_running_loop().time() + 10
            while len(nc.denials) < 3 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)
    finally:
        await nc.close()
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "identity 'env-math' may not subscribe to _INBOX.admin.>" in said
    assert "identity 'env-math' may not subscribe to gym.>" in said
    assert (
        "identity 'env-math' may not acknowledge messages of consumer agent-simple_agent on stream GYM_WORK "
        f"({ack})" in said
    )


async def test_a_worker_identity_finds_the_topology_an_admin_provisioned(
    broker: EmbeddedServer, auth_dir: credentials.Written, provisioned: Client
) -> None:
    nc = await connect(broker.url, name="worker", auth=as_identity(auth_dir, "env-math"))
    try:
        js = nc.jetstream()
        await topology.ensure(js)  # may not update streams: checks they exist
        assert await topology.ensure_consumer(js, "tool", "math") == "tool-math"
        with pytest.raises(PermissionDenied, match="run `gymbus init` as admin first"):
            await topology.ensure_consumer(js, "tool", "unprovisioned")
    finally:
        await nc.close()


async def test_a_worker_finding_an_agent_consumer_of_an_older_version_says_to_run_init(
    broker: EmbeddedServer, auth_dir: credentials.Written, provisioned: Client
) -> None:
    """An admin-made agent consumer that takes only the Starts' subject would never deliver a Resume:
    the worker refuses to start on it, naming the missing subject and the fix, and `gymbus init`
    (the admin's `ensure_consumer`) brings it up to date."""
    admin = provisioned.jetstream()
    old = topology.consumer("agent", "simple_agent")
    old.filter_subject, old.filter_subjects = topology.agent_subject("simple_agent"), None
    await admin.delete_consumer(topology.WORK_STREAM, "agent-simple_agent")
    await admin.add_consumer(topology.WORK_STREAM, config=old)
    nc = await connect(broker.url, name="worker", auth=as_identity(auth_dir, "agent-simple_agent"))
    try:
        with pytest.raises(PermissionDenied) as denied:
            await topology.ensure_consumer(nc.jetstream(), "agent", "simple_agent")
        assert "gym.agent.simple_agent.resume" in str(denied.value)
        assert "run `gymbus init` as admin to update it" in str(denied.value)
        await topology.ensure_consumer(admin, "agent", "simple_agent")
        assert await topology.ensure_consumer(nc.jetstream(), "agent", "simple_agent") == "agent-simple_agent"
    finally:
        await nc.close()


async def test_an_unknown_key_is_refused_at_connect(
    broker: EmbeddedServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A key the server does not list never gets in, and the client says so at once: a refused identity
    is not retried as an unreachable broker would be."""
    stranger = credentials.write(tmp_path / "other", AGENTS, ENVS)
    refused = rf"the broker at {broker.url} refused identity admin \(authorization violation\)"
    with pytest.raises(BrokerUnavailable, match=refused):
        await asyncio.wait_for(connect(broker.url, name="stranger", auth=as_identity(stranger, "admin")), 15)


def test_seeds_are_private_and_kept_and_the_server_block_holds_only_public_keys(tmp_path: Path) -> None:
    first = credentials.write(tmp_path, AGENTS, ENVS)
    seed = first.seeds["env-math"]
    assert seed == tmp_path / "env-math" / "env-math.nk" and oct(seed.stat().st_mode & 0o777) == "0o600"
    again = credentials.write(tmp_path, [*AGENTS, "other_agent"], ENVS)
    assert again.created == ["agent-other_agent"] and seed.read_bytes() == again.seeds["env-math"].read_bytes()
    conf = again.server_conf.read_text()
    assert seed.read_text().strip() not in conf and credentials.public_key(seed) in conf
    assert '"gym.agent.other_agent"' in conf  # env-math may now send Resumes to the new agent
    old = seed.read_bytes()
    rotated = credentials.write(tmp_path, AGENTS, ENVS, rotate=True)
    assert rotated.seeds["env-math"].read_bytes() != old
    assert rotated.created == [i.name for i in identities(AGENTS, ENVS)]


async def test_tls_with_certificates_made_here(
    tmp_path: Path, auth_dir: credentials.Written, caplog: pytest.LogCaptureFixture
) -> None:
    """TLS on the client port (and nkeys inside it): a client that trusts the CA connects, one that does not fails."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = {"ca.pem": ca.cert_pem, "server.pem": cert.cert_chain_pems[0], "server.key": cert.private_key_pem}
    for name, blob in files.items():
        blob.write_to_path(str(tmp_path / name))
    tls = credentials.TlsFiles(cert=tmp_path / "server.pem", key=tmp_path / "server.key")
    with EmbeddedServer(tmp_path / "broker", auth_conf=auth_dir.server_conf, tls=tls) as server:
        url = server.url.replace("nats://", "tls://")
        env = {"NATS_NKEY": str(auth_dir.seeds["admin"]), "NATS_TLS_CA": str(tmp_path / "ca.pem")}
        nc = await connect(url, name="tls", auth=client_auth(env))
        try:
            await topology.ensure(nc.jetstream())
            assert nc.connected_url is not None and nc.connected_url.scheme == "tls"
        finally:
            await nc.close()
        # a client without the CA never gets in; it says why (the first connection's retries are bounded elsewhere)
        with pytest.raises(BrokerUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            untrusting = as_identity(auth_dir, "admin")
            await connect(url, name="untrusting", auth=untrusting, connect_timeout_s=2)
