"""The settings that make "nothing lost" hold, asserted (RELIABILITY.md, end of §7)."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from nats.js.api import AckPolicy, StorageType

from broker import inspect, topology
from broker.connect import connect
from broker.publish import PUBLISH_TIMEOUT_S, publish_raw
from broker.schemas import Session
from broker.server import SYNC_ENV, BrokerError, EmbeddedServer, render_config, sync_setting
from broker.sessions import SessionStore, StateConflict
from conftest import ROOT
from runtime.testing import Harness, wait_until
from tests.faultproxy import FaultProxy


def test_shipped_server_config_fsyncs_every_write() -> None:
    conf = (ROOT / "configs" / "nats-server.conf").read_text()
    settings = {m[0]: m[1].strip() for m in re.findall(r"^\s*(\w+)\s*:\s*([^#\n]+)", conf, re.M)}
    assert settings["sync_interval"] == "always"
    assert settings["max_payload"] == "8MB"
    assert "store_dir" in settings  # JetStream on, file storage


def test_embedded_server_runs_with_the_same_settings(tmp_path: Path) -> None:
    with EmbeddedServer(tmp_path, http_port=-1) as server:
        varz = json.load(urllib.request.urlopen(f"{server.monitor_url}/varz", timeout=5))
    assert varz["jetstream"]["config"]["sync_always"] is True
    assert varz["max_payload"] == topology.MAX_MSG_SIZE
    major, minor, patch = (int(x) for x in varz["version"].split("-")[0].split("."))
    assert (major, minor, patch) >= (2, 12, 3), "Jepsen's NATS 2.12.1 findings are fixed from 2.12.3"


def test_relaxed_fsync_is_explicit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GYMBUS_BROKER_SYNC is the one way to relax the embedded broker's fsync, and a bad value is named."""
    monkeypatch.delenv(SYNC_ENV, raising=False)
    assert sync_setting() == "always" and "sync_interval: always" in render_config(tmp_path)
    monkeypatch.setenv(SYNC_ENV, "20ms")
    assert sync_setting() == "20ms" and "sync_interval: 20ms" in render_config(tmp_path)
    assert sync_setting("always") == "always" and sync_setting(sync_always=False) == "default"
    assert "sync_interval" not in render_config(tmp_path, sync="default")
    with pytest.raises(BrokerError, match="GYMBUS_BROKER_SYNC='fast'"):
        sync_setting("fast")


async def test_streams_and_consumers_are_configured_for_redelivery(harness: Harness) -> None:
    limits = harness.limits
    for name in (topology.WORK_STREAM, topology.RESULTS_STREAM, topology.DEAD_STREAM, topology.ADVISORY_STREAM):
        info = await harness.js.stream_info(name)
        assert info.config.storage == StorageType.FILE, name
    await topology.ensure_consumer(harness.js, "agent", "probe", limits)
    c = (await harness.js.consumer_info(topology.WORK_STREAM, "agent-probe")).config
    assert c.ack_policy == AckPolicy.EXPLICIT
    assert c.ack_wait == limits.ack_wait_s and c.max_deliver == limits.max_deliver
    assert 0 < c.max_ack_pending <= 4096
    horizon = limits.ack_wait_s * limits.max_deliver + 30 * limits.max_deliver  # ack waits + capped backoffs
    for name in (topology.WORK_STREAM, topology.RESULTS_STREAM):
        window = (await harness.js.stream_info(name)).config.duplicate_window
        assert window >= horizon, f"{name}: duplicate window {window}s < redelivery horizon {horizon}s"


async def test_clients_reconnect_forever_and_ping_often(harness: Harness) -> None:
    nc = await connect(harness.broker.url)
    try:
        assert nc.options["max_reconnect_attempts"] == -1
        assert nc.options["ping_interval"] <= 10
    finally:
        await nc.close()


async def test_sessions_and_results_survive_a_broker_kill(tmp_path: Path) -> None:
    """kill -9 and a restart on the same store keep every acknowledged session write and Result."""
    async with Harness(tmp_path / "broker") as h:
        store = h.store
        for i in range(20):
            await store.create(_session(f"keep.{i}.0"))
        await asyncio.to_thread(h.broker.restart)
        for i in range(20):
            assert await store.get(f"keep.{i}.0") is not None


async def test_a_cas_write_whose_ack_was_lost_is_not_taken_for_a_conflict(harness: Harness) -> None:
    """The broker stores a session write but its ack never arrives: the retry must see its own write
    (a conflict there would leave the rollout with nobody to emit its next message)."""
    proxy = await FaultProxy(harness.broker.port).start()
    nc = await connect(proxy.url)
    try:
        store = SessionStore(nc.jetstream())
        s = _session("cas.0.0")
        rev = await store.create(s)
        s.step = 1
        key = f"$KV.{topology.SESSIONS}.cas.0.0"
        proxy.watch(key)
        proxy.set("mute")  # requests reach the broker, answers are held
        write = asyncio.create_task(store.update(s, last=rev))
        # the first attempt timed out (after PUBLISH_TIMEOUT_S) and its retry went out, yet it was stored
        await wait_until(_sent_twice(proxy, key), f"a retried write to {key}", timeout=PUBLISH_TIMEOUT_S + 30)
        stored = await harness.store.get("cas.0.0")
        assert stored is not None and stored[0].step == 1
        proxy.set("pass")
        assert await asyncio.wait_for(write, 30) == stored[1]
        with pytest.raises(StateConflict):  # a genuinely stale writer still loses
            await store.update(s, last=rev)
    finally:
        await nc.close()
        await proxy.stop()


def _sent_twice(proxy: FaultProxy, subject: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return proxy.published(subject) >= 2

    return check


def _session(sid: str) -> Session:
    run_id, task, _ = sid.rsplit(".", 2)
    return Session(
        session_id=sid,
        run_id=run_id,
        task_index=int(task),
        agent="a",
        env="e",
        model="m",
        step=0,
        phase="model",
        params={},
    )


async def test_a_timed_out_publish_is_retried_with_the_same_message_id(harness: Harness) -> None:
    """The broker stores a publish whose ack is lost: the retry (same Nats-Msg-Id) is dropped as a duplicate."""
    proxy = await FaultProxy(harness.broker.port).start()
    nc = await connect(proxy.url)
    try:
        proxy.watch("gym.result.once")
        proxy.set("mute")
        sent = asyncio.create_task(publish_raw(nc.jetstream(), "gym.result.once", b"{}", {"Nats-Msg-Id": "once:1"}))
        # the first attempt timed out (after PUBLISH_TIMEOUT_S): its retry went out
        await wait_until(_sent_twice(proxy, "gym.result.once"), "a retried publish", timeout=PUBLISH_TIMEOUT_S + 30)
        proxy.set("pass")
        ack = await asyncio.wait_for(sent, 30)
    finally:
        await nc.close()
        await proxy.stop()
    assert ack.duplicate, "the retry found the first attempt stored"
    assert await inspect.count(harness.js, topology.RESULTS_STREAM, "gym.result.once") == 1
