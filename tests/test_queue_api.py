"""The queue is the API: a producer that publishes raw JSON with any NATS client gets the rollout
`gymbus collect` gets for the same row, and its mistakes come back at the first hop, with the path of
the field (README, "Publishing from any language"). Real broker, real workers, the simulated policy."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from nats.js.api import PubAck

from broker import functions, inspect, topology
from broker.schemas import Result, encoder, result_decoder
from broker.wireschema import schema
from conftest import MATH_TASKS, ROOT
from runtime.model.sampling import NEUTRAL
from runtime.runs.collect import collect
from runtime.runs.config import load_config
from runtime.runs.tasks import build_start, read_tasks
from runtime.testing import Harness

DEFAULTS = {"sampling": {"temperature": 0.5, "max_output_tokens": 256}, "options": {"max_steps": 3}}


def raw_start(row: dict[str, Any], run_id: str, task: int, rollout: int = 0, **fields: Any) -> dict[str, Any]:
    """A Start as a producer in another language writes it: the row as it is."""
    meta = {k: v for k, v in row.items() if k != "responses_create_params"}
    return {
        "kind": "start",
        "run_id": run_id,
        "task_index": task,
        "rollout_index": rollout,
        "agent": "simple_agent",
        "env": "math",
        "responses_create_params": row["responses_create_params"],
        "meta": meta,
        **fields,
    }


async def publish(
    h: Harness, body: dict[str, Any] | bytes, msg_id: str, subject: str = "gym.agent.simple_agent", **headers: str
) -> PubAck:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await h.js.publish(subject, data, headers={"Nats-Msg-Id": msg_id, **headers})


async def put_manifest(h: Harness, run_id: str, expected: int, defaults: dict[str, Any]) -> None:
    kv = await h.js.key_value(topology.RUNS)
    manifest = {"run_id": run_id, "expected": expected, "defaults": defaults}
    await kv.put(topology.manifest_key(run_id), json.dumps(manifest).encode())


async def math_stack(h: Harness, accuracy: float = 1.0, **sim: Any) -> None:
    await h.simulate(MATH_TASKS, accuracy=accuracy, **sim)
    await h.worker("simple_agent")
    await h.worker("math")


def comparable(r: Result) -> dict[str, Any]:
    """What makes a rollout what it is, without its identity, clock times and generated ids."""
    out = json.loads(encoder.encode(r))
    for key in ("session_id", "run_id", "timings"):
        out.pop(key)
    text = re.sub(r'"call_\d+"', '"call"', json.dumps(out["output"]))
    out["output"] = json.loads(re.sub(r'"(resp|msg|fc)_[0-9a-z_]+"', '"id"', text))
    out["calls"] = (r.timings.model_calls, r.timings.tool_calls)
    return out


def test_collect_publishes_each_row_as_it_is() -> None:
    """collect's Start carries the row and nothing of the run's settings: those are in the manifest."""
    cfg = load_config(ROOT / "configs" / "quickstart.yaml")
    task = read_tasks(MATH_TASKS, limit=1)[0]
    assert task.row is not None
    sent = json.loads(encoder.encode(build_start(cfg, "r", task, 1, 0)))
    assert sent == {**raw_start(task.row, "r", 0, 1), "model": cfg.model.name}


async def test_a_raw_producer_gets_the_rollouts_collect_gets(harness: Harness, tmp_path: Path) -> None:
    """The same rows and the same manifest give the same rollouts: tools offered by the environment's
    registration, sampling and options from the run's defaults, the same answers and rewards."""
    await math_stack(harness, accuracy=0.5, seed=7)
    config = tmp_path / "run.yaml"
    run = {"input": str(MATH_TASKS), "limit": 4, "repeats": 2, "agent": "simple_agent", "env": "math"}
    config.write_text(json.dumps({**run, "sampling": DEFAULTS["sampling"], "limits": DEFAULTS["options"]}))
    cfg = load_config(config, nats=harness.broker.url, output=str(tmp_path))
    summary = await collect(cfg, run_id="via-collect", quiet=True)
    assert len(summary.results) == 8

    await put_manifest(harness, "raw", 8, DEFAULTS)
    rows = [t.row for t in read_tasks(MATH_TASKS, limit=4)]
    for task, row in enumerate(rows):
        for rollout in range(2):
            assert row is not None
            await publish(harness, raw_start(row, "raw", task, rollout), f"raw.{task}.{rollout}:start:0")
    raw = {(r.task_index, r.rollout_index): r for r in await harness.results("raw", 8)}
    gathered = {(r.task_index, r.rollout_index): r for r in await harness.results("via-collect", 8)}
    assert {k: comparable(r) for k, r in raw.items()} == {k: comparable(r) for k, r in gathered.items()}
    some = next(iter(raw.values()))
    # what was sent: the run's defaults over the neutral values of every other sampling parameter
    assert some.sampling == {**NEUTRAL, "temperature": 0.5, "top_p": 1.0, "max_output_tokens": 256}
    assert all(r.output[0]["type"] == "function_call" for r in raw.values())  # the environment's tools
    assert {r.reward for r in raw.values()} == {0.0, 1.0}  # accuracy 0.5: both outcomes compared


async def test_env_tools_off_in_the_manifest_offers_no_tools(harness: Harness, math_rows: list[dict]) -> None:
    await math_stack(harness)
    await put_manifest(harness, "bare", 1, {"env_tools": False})
    await publish(harness, raw_start(math_rows[0], "bare", 0), "bare.0.0:start:0")
    [result] = await harness.results("bare", 1)
    assert [i["type"] for i in result.output] == ["message"] and result.reward == 1.0


MISTAKES = [
    ({"options": {"max_step": 3}}, "unknown field `max_step` - at `$.options`"),
    ({"responses_create_params": {"input": "6*7?", "temprature": 1}}, "`temprature` - at `$.responses_create_params`"),
    ({"responses_create_params": {"input": "6*7?", "stream": True}}, "- at `$.responses_create_params.stream`"),
    ({"meta": {"answer": "42"}}, "'expected_answer' is a required property - at `$.meta`"),
    ({"agent": "other_agent"}, "names agent 'other_agent' but was published to gym.agent.simple_agent"),
    ({"env": "nosuch"}, "unknown environment 'nosuch'"),
]


@pytest.mark.parametrize("change,says", MISTAKES, ids=[s.split(" - ")[0][:30] for _, s in MISTAKES])
async def test_a_mistake_fails_at_once_with_its_path_before_any_model_call(
    harness: Harness, math_rows: list[dict], monkeypatch: pytest.MonkeyPatch, change: dict[str, Any], says: str
) -> None:
    monkeypatch.setenv("GYMBUS_REGISTRATION_WAIT_S", "1")
    await math_stack(harness)
    t0 = time.monotonic()
    await publish(harness, {**raw_start(math_rows[0], "oops", 0), **change}, "oops.0.0:start:0")
    [result] = await harness.results("oops", 1, timeout=20)
    assert result.failure_kind == "invalid_input" and result.reward is None
    assert says in (result.failure_reason or ""), result.failure_reason
    assert time.monotonic() - t0 < 10
    assert harness.sim is not None and harness.sim.calls == 0


async def test_a_message_naming_no_run_is_dead_lettered_where_its_producer_reads(harness: Harness) -> None:
    """Not JSON, or a task row pasted as a Start: no run to send a Result to, so the rejection goes to
    gym.dead.<agent> at once, keyed by the producer's own message id, with the reason and the fix."""
    await math_stack(harness)
    row = json.loads(MATH_TASKS.read_text().splitlines()[0])
    await publish(harness, b"What is 6*7?", "mine-1")
    await publish(harness, row, "mine-2")
    letters = await _wait_for(lambda: harness.read("gym.dead.simple_agent", stream=topology.DEAD_STREAM), 2)
    by_id = {json.loads(m.data)["msg_id"]: json.loads(m.data) for m in letters}
    assert by_id["mine-1"]["failure_kind"] == "invalid_input" and "JSON" in by_id["mine-1"]["error"]
    assert "task row, not a Start" in by_id["mine-2"]["error"] and "under meta" in by_id["mine-2"]["error"]
    assert by_id["mine-2"]["payload"] == json.dumps(row)


async def test_a_start_for_an_unknown_agent_fails_within_seconds(
    harness: Harness, math_rows: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody consumes gym.agent.nobody: the janitor (in every worker) fails it once it is clear that no
    agent of that name ever registered, in seconds rather than after the orphan wait (120 s)."""
    monkeypatch.setenv("GYMBUS_JANITOR_INTERVAL_S", "0.5")
    monkeypatch.setenv("GYMBUS_UNKNOWN_AFTER_S", "1")
    await math_stack(harness)
    t0 = time.monotonic()
    start = raw_start(math_rows[0], "lost", 0, agent="nobody")
    await publish(harness, start, "lost.0.0:start:0", subject="gym.agent.nobody")
    [result] = await harness.results("lost", 1, timeout=30)
    elapsed = time.monotonic() - t0
    assert result.failure_kind == "invalid_input" and elapsed < 10
    assert "unknown agent 'nobody'" in (result.failure_reason or "")
    assert "gym.agent.nobody" in (result.failure_reason or "") and "simple_agent" in (result.failure_reason or "")


async def test_results_carry_every_field_and_the_producers_headers(harness: Harness, math_rows: list[dict]) -> None:
    await math_stack(harness)
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await publish(harness, raw_start(math_rows[0], "wire", 0), "wire.0.0:start:0", traceparent=trace)
    await publish(harness, raw_start(math_rows[1], "wire", 1, meta={}), "wire.1.0:start:0", traceparent=trace)
    await harness.results("wire", 2)
    validator = jsonschema.Draft202012Validator(schema("result"))
    fields = set(Result.__struct_fields__) | {"kind"}
    async for m in inspect.messages(harness.js, topology.RESULTS_STREAM, "gym.result.wire"):
        body = json.loads(m.data or b"")
        validator.validate(body)
        assert set(body) == fields and set(body["usage"]) == {"input_tokens", "output_tokens"}
        assert body["attempt"] == 0 and body["rollout_index"] == 0
        assert (body["reward"] is None) == (body["failure_kind"] is not None)
        headers = m.headers or {}
        assert headers["traceparent"] == trace
        assert re.fullmatch(rf"{re.escape(body['session_id'])}:\d+", headers["Nats-Msg-Id"])
        result_decoder.decode(m.data or b"")


async def test_an_environment_served_but_not_registered_applies_its_defaults_at_seed(
    harness: Harness, math_rows: list[dict]
) -> None:
    """A fresh deployment whose environment workers are scaled to zero: the consumers exist, no
    registration yet. The Start goes through the environment's seed step, where its worker offers its
    tools and checks the task fields, before the first model call."""
    from broker.provision import provision

    await provision(harness.js, [], ["math"], harness.limits)
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent")
    await publish(harness, raw_start(math_rows[0], "late", 0), "late.0.0:start:0")
    await publish(harness, raw_start(math_rows[1], "late", 1, meta={}), "late.1.0:start:0")
    await _wait_until(lambda: harness.pending("gym.tool.math"), 2)
    assert harness.sim is not None and harness.sim.calls == 0
    await harness.worker("math")
    results = {r.task_index: r for r in await harness.results("late", 2)}
    assert results[0].reward == 1.0 and results[0].output[0]["type"] == "function_call"
    assert results[1].failure_kind == "invalid_input" and "expected_answer" in (results[1].failure_reason or "")
    assert harness.sim.calls == 2  # task 0: the tool call, then the answer; task 1: none
    assert await functions.read(harness.js, "env", "math") is not None


async def _wait_for(read: Any, n: int, timeout: float = 15.0) -> list[Any]:
    deadline = time.monotonic() + timeout
    while len(got := await read()) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return got  # type: ignore[no-any-return]


async def _wait_until(count: Any, n: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while await count() < n:
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_producers_span_is_the_rollouts_parent(harness: Harness, math_rows: list[dict]) -> None:
    """The Start's `traceparent` makes the producer's span the parent of every hop of the rollout."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from runtime.telemetry import tracing

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.install(provider)
    try:
        await math_stack(harness)
        trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        traceparent = f"00-{trace_id}-{span_id}-01"
        await publish(harness, raw_start(math_rows[0], "traced", 0), "traced.0.0:start:0", traceparent=traceparent)
        [result] = await harness.results("traced", 1)
        assert result.reward == 1.0
        provider.force_flush()
        hops = [s for s in memory.get_finished_spans() if s.name.startswith("process gym.")]
        assert len(hops) == 3  # agent, tools, agent (math verifies in the agent's last turn)
        assert {format(s.context.trace_id, "032x") for s in hops} == {trace_id}
        assert {format(s.parent.span_id, "016x") for s in hops if s.parent} == {span_id}
    finally:
        tracing.uninstall()
