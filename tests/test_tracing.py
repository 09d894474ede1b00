"""One trace per rollout across every hop: real worker processes, a real broker, real HTTP.

The test process records its own spans (the rollout's root, the simulated policy's server spans)
with an in-memory exporter; the worker subprocesses write theirs to a JSONL file. Both are read
back as the same records and must form one trace with the right parent/child structure.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from broker import functions, topology
from broker.publish import publish_raw
from broker.schemas import FunctionCall, Start, encoder, session_id
from conftest import MATH_TASKS, ROOT
from runtime.engine.records import new_session
from runtime.engine.registry import register
from runtime.engine.transitions import Delivery
from runtime.model.client import Endpoints, ModelClient, ModelOutput
from runtime.runs import rollouts
from runtime.runs.config import RunConfig
from runtime.runs.keys import Attempts, Live
from runtime.runs.plan import prepare
from runtime.sdk import load
from runtime.telemetry import genai, semconv, spanfile, spans, tracing
from runtime.telemetry.spanfile import SpanRecord
from runtime.telemetry.spans import RolloutSpans
from runtime.testing import Harness, wait_until
from tests.recording_proxy import Exchange, RecordingProxy


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({semconv.SERVICE_NAME: "gymbus-test"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.install(provider)
    yield memory
    tracing.uninstall()


@pytest.fixture
def memory(exporter: InMemorySpanExporter) -> InMemorySpanExporter:
    exporter.clear()
    return exporter


def with_tools(row: dict) -> dict:
    from functions.math.env import ENVIRONMENT

    return {**row, "responses_create_params": {**row["responses_create_params"], "tools": ENVIRONMENT.tool_specs()}}


def spawn(function: str, url: str, traces: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({tracing.TRACES_FILE_ENV: str(traces), "OTEL_BSP_SCHEDULE_DELAY": "100"})
    cmd = [sys.executable, "-m", "runtime", "worker", function, "--nats", url]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def _has(registered: Awaitable[set[tuple[str, str]]], wanted: set[tuple[str, str]]) -> bool:
    return wanted <= await registered


def by_name(spans: list[SpanRecord], prefix: str) -> list[SpanRecord]:
    return sorted((s for s in spans if s.name.startswith(prefix)), key=lambda s: s.start_ns)


def children(spans: list[SpanRecord], parent: SpanRecord) -> list[SpanRecord]:
    return sorted((s for s in spans if s.parent_id == parent.span_id), key=lambda s: s.start_ns)


async def test_one_trace_per_rollout_across_worker_processes(
    harness: Harness, math_rows: list[dict], memory: InMemorySpanExporter, tmp_path: Path
) -> None:
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    traces = tmp_path / "traces.jsonl"
    workers = [spawn(f, harness.broker.url, traces) for f in ("simple_agent", "math")]
    try:
        # A Start taken before math has registered runs as for an unknown environment (a seed step,
        # the verify hop): the trace's shape below is that of a rollout whose environment is known
        wanted = {("agent", "simple_agent"), ("env", "math")}
        await wait_until(lambda: _has(functions.registered(harness.js), wanted), "both workers registered")
        start = harness.start(with_tools(math_rows[0]), agent="simple_agent", env="math", run_id="tr1")
        sid = session_id("tr1", 0, 0)
        roots = RolloutSpans()
        with roots.submitting(start, sid):
            await harness.submit(start)
        [result] = await harness.results("tr1", 1, timeout=60)
        roots.finish(result)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            assert w.wait(timeout=30) == 0, w.stderr.read().decode() if w.stderr else ""
    assert result.reward == 1.0

    spans = [spanfile.record(s) for s in memory.get_finished_spans()] + spanfile.load(traces)
    assert {s.trace_id for s in spans} == {spans[0].trace_id}, "exactly one trace"
    assert {s.service for s in spans} >= {"gymbus-test", "gymbus-simple_agent", "gymbus-math"}
    [root] = [s for s in spans if s.parent_id is None]
    assert root.name == "invoke_agent simple_agent" and root.service == "gymbus-test"
    assert root.attributes[semconv.GEN_AI_CONVERSATION_ID] == sid
    assert root.attributes[semconv.REWARD] == 1.0
    assert root.attributes[semconv.OPENINFERENCE_SPAN_KIND] == "AGENT"

    hops = [s.name for s in children(spans, root)]
    assert hops == [
        "send gym.agent.simple_agent",
        "process gym.agent.simple_agent",
        "process gym.tool.math",
        "process gym.agent.simple_agent.resume",  # math verifies in the agent's last turn (verify_inline)
    ]
    for hop in by_name(spans, "process "):
        a = hop.attributes
        assert hop.kind == "consumer" and hop.parent_id == root.span_id
        assert a[semconv.MESSAGING_SYSTEM] == "nats" and a[semconv.MESSAGING_OPERATION_TYPE] == "process"
        assert a[semconv.MESSAGING_DESTINATION_NAME] == hop.name.split(" ")[1]
        assert a[semconv.MESSAGING_CONSUMER_GROUP_NAME] in ("agent-simple_agent", "tool-math")
        assert a[semconv.MESSAGING_MESSAGE_CONVERSATION_ID] == sid and a[semconv.OUTCOME] == "ack"
        assert a[semconv.OPENINFERENCE_SPAN_KIND] == "CHAIN" and a[semconv.SESSION_ID] == sid  # GenAI-aware UIs
        assert a[semconv.QUEUE_WAIT] >= 0

    first, second = by_name(spans, "process gym.agent")
    for turn, finish in ((first, "tool_calls"), (second, "stop")):
        chat, *_, send = children(spans, turn)
        assert chat.name == "chat policy" and chat.kind == "client" and send.kind == "producer"
        a = chat.attributes
        assert a[semconv.GEN_AI_OPERATION_NAME] == "chat" and a[semconv.GEN_AI_PROVIDER_NAME] == "openai"
        assert a[semconv.GEN_AI_REQUEST_MODEL] == "policy" and a[semconv.GEN_AI_CONVERSATION_ID] == sid
        assert a[semconv.GEN_AI_REQUEST_TEMPERATURE] == 1.0 and a[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] > 0
        assert a[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == [finish]
        assert a[semconv.OPENINFERENCE_SPAN_KIND] == "LLM" and a[semconv.SESSION_ID] == sid
        assert semconv.GEN_AI_INPUT_MESSAGES not in a, "content is recorded only when opted in"
        *probe, http = children(spans, chat)  # aiohttp instrumentation, in the worker process
        assert len(probe) == (turn is first)  # the first call on a replica also asks it once for /responses
        [server] = children(spans, http)  # the simulated policy (in this process), via traceparent over HTTP
        assert http.kind == "client" and server.kind == "server" and server.service == "gymbus-test"
    assert [s.name for s in children(spans, first)][1] == "send gym.tool.math"

    [tools] = by_name(spans, "process gym.tool.math")
    tool, send = children(spans, tools)
    assert tool.name == "execute_tool calculator" and send.name == "send gym.agent.simple_agent.resume"
    assert tool.attributes[semconv.GEN_AI_TOOL_NAME] == "calculator"
    assert tool.attributes[semconv.GEN_AI_TOOL_CALL_ID] == result.output[0]["call_id"]

    _, verify, publish = children(spans, second)
    assert verify.name == "verify math" and verify.attributes[semconv.REWARD] == 1.0
    assert verify.attributes[semconv.OPENINFERENCE_SPAN_KIND] == "EVALUATOR"
    assert tool.attributes[semconv.OPENINFERENCE_SPAN_KIND] == "TOOL"
    assert publish.name == "send gym.result.tr1" and publish.kind == "producer"


async def test_a_start_without_trace_context_still_makes_one_trace(
    harness: Harness, math_rows: list[dict], memory: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A foreign publisher sends no traceparent: the first hop becomes the rollout's root."""
    monkeypatch.setattr(tracing, "CAPTURE_CONTENT", True)
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent", verify_inline=False)  # verification as a hop of its own, too
    await harness.worker("math")
    start = harness.start(with_tools(math_rows[1]), run_id="tr2")
    await publish_raw(harness.js, "gym.agent.simple_agent", encoder.encode(start), {"Nats-Msg-Id": "foreign-1"})
    [result] = await harness.results("tr2", 1)
    await harness.stop_workers()
    assert result.reward == 1.0

    spans = [spanfile.record(s) for s in memory.get_finished_spans()]
    assert len({s.trace_id for s in spans}) == 1
    [root] = [s for s in spans if s.parent_id is None]
    assert root.name == "process gym.agent.simple_agent"
    hops = [s.name for s in children(spans, root) if s.name.startswith("process")]
    assert hops == ["process gym.tool.math", "process gym.agent.simple_agent.resume", "process gym.verify.math"]
    [verify_hop] = by_name(spans, "process gym.verify.math")
    verify, publish = children(spans, verify_hop)
    assert verify.name == "verify math" and verify.attributes[semconv.REWARD] == 1.0
    assert publish.name == "send gym.result.tr2" and publish.kind == "producer"

    # opted in: prompts, outputs and tool arguments/results are on the spans
    first_chat = by_name(spans, "chat policy")[0]
    sent = json.loads(first_chat.attributes[semconv.GEN_AI_INPUT_MESSAGES])
    assert sent[0]["role"] == "user" and "boxed" in sent[0]["parts"][0]["content"]
    said = json.loads(first_chat.attributes[semconv.GEN_AI_OUTPUT_MESSAGES])
    assert said[0]["parts"][0]["type"] == "tool_call" and said[0]["parts"][0]["name"] == "calculator"
    [tool] = by_name(spans, "execute_tool")
    assert tool.attributes[semconv.GEN_AI_TOOL_CALL_RESULT] == str(math_rows[1]["expected_answer"])


async def _gathers(harness: Harness, cfg: RunConfig, run: str, roots: RolloutSpans) -> Attempts:
    """What one `gymbus collect` of ``run`` publishes (a new run, or a resume), with its roots."""
    plan = await prepare(cfg, run)
    js = harness.js
    attempts = await rollouts.plan(js, plan.expected, iter(plan.expected), run, False, time.time())
    await rollouts.publish_starts(js, cfg, run, {t.index: t for t in plan.tasks}, attempts, roots)
    return attempts


async def test_a_resume_nudges_a_rollout_in_flight_within_its_trace(
    harness: Harness, memory: InMemorySpanExporter
) -> None:
    """A second collect of a run finds its rollout in flight: the Start it sends again (a nudge)
    carries the rollout's trace context, opens no root of its own, and its hop is one more span of the
    rollout's one trace, marked ``nudge``, beside the hops its Result counts."""
    h, run = harness, "trnudge"
    await h.simulate(MATH_TASKS, accuracy=1.0)
    cfg = RunConfig(input=str(MATH_TASKS), agent="simple_agent", env="math", nats=h.broker.url, limit=1)
    sid = session_id(run, 0, 0)
    await register(h.js, load("math"))
    await topology.ensure_consumer(h.js, "tool", "math")  # as `gymbus init` does: its Tools wait for it
    await h.worker("simple_agent")
    first = RolloutSpans()
    assert not (await _gathers(h, cfg, run, first)).live
    await wait_until(lambda: _at_step(h, sid, 1), "the first turn's Tools published")

    again = RolloutSpans()  # another process: the run's resume
    attempts = await _gathers(h, cfg, run, again)
    assert attempts.live == {(0, 0): Live(1, attempts.live[(0, 0)].trace)}
    assert spans.TRACEPARENT in attempts.live[(0, 0)].trace

    def nudged() -> list[SpanRecord]:
        found = [spanfile.record(s) for s in memory.get_finished_spans()]
        return [s for s in found if s.attributes.get(semconv.MESSAGE_KIND) == "nudge"]

    await wait_until(lambda: _ready(bool(nudged())), "the nudge's hop")
    await h.worker("math")
    [result] = await h.results(run, 1, timeout=30)
    first.finish(result)
    again.finish(result)  # it holds no root of this rollout: nothing to end
    assert result.reward == 1.0 and result.attempt == 0

    recorded = [spanfile.record(s) for s in memory.get_finished_spans()]
    assert len({s.trace_id for s in recorded}) == 1, "the nudge made a trace of its own"
    [root] = [s for s in recorded if s.parent_id is None]
    assert root.name == "invoke_agent simple_agent" and root.attributes[semconv.REWARD] == 1.0
    [nudge] = nudged()
    assert nudge.name == "process gym.agent.simple_agent" and nudge.parent_id == root.span_id
    assert nudge.attributes[semconv.OUTCOME] == "ack"
    assert not by_name(children(recorded, nudge), "chat "), "a nudge never calls the model again"
    hops = [s for s in by_name(recorded, "process ") if s.span_id != nudge.span_id]
    assert len(hops) == result.timings.hops


async def _at_step(h: Harness, sid: str, step: int) -> bool:
    s = await h.session(sid)
    return s is not None and s.step >= step


async def _ready(value: bool) -> bool:
    return value


async def _call_through_proxy(
    harness: Harness, start: Start, trace_id: int, sampled: bool
) -> tuple[ModelOutput, list[Exchange]]:
    """One model call of ``start``'s rollout, in a trace ``trace_id`` sampled or not, to the simulated
    policy through a recording proxy: what the call returned, and what the proxy saw."""
    proxy = RecordingProxy((await harness.simulate(MATH_TASKS, accuracy=1.0)).removesuffix("/v1"))
    client = ModelClient(Endpoints(static=await proxy.start()))
    session = new_session(start, 0, Delivery(published_at=1.0))
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else 0)
    parent = NonRecordingSpan(SpanContext(trace_id, 0xB7AD6B7169203331, is_remote=True, trace_flags=flags))
    try:
        with trace.use_span(parent):
            out = await genai.TracedModel(client)(session.items, session.params, session)
    finally:
        await client.close()
        await proxy.stop()
    return out, proxy.exchanges


@pytest.mark.parametrize("sampled", [False, True])
async def test_a_model_call_sends_the_trace_context_whether_or_not_the_rollout_is_sampled(
    harness: Harness, math_rows: list[dict], memory: InMemorySpanExporter, counting: Counting, sampled: bool
) -> None:
    """Not sampled: the call builds no span at all (neither its own nor an HTTP one: its instrumentation
    is skipped) and still sends the trace context, marked not sampled, so a model server that traces
    follows the decision instead of starting a trace of its own for every call. Sampled: the context
    sent is the HTTP span's."""
    trace_id = 0x0AF7651916CD43DD8448EB211C80319C
    start = harness.start(math_rows[0], agent="simple_agent", env="math")
    out, exchanges = await _call_through_proxy(harness, start, trace_id, sampled)
    assert out.items and [x.path for x in exchanges] == ["/v1/responses", "/v1/responses"]  # the probe, the call
    sent = [x.headers["traceparent"].split("-") for x in exchanges]
    assert all(t[1] == f"{trace_id:032x}" and t[3] == ("01" if sampled else "00") for t in sent)
    ours = [spanfile.record(s) for s in memory.get_finished_spans() if s.context.trace_id == trace_id]
    if not sampled:
        assert ours == [] and counting.calls == 0
        return
    # each call's own HTTP span (aiohttp is instrumented once per process, for the provider given
    # first, which in a full test run may be another module's: its spans need not be recorded here)
    [chat] = by_name(ours, "chat policy")
    assert len({t[2] for t in sent}) == 2 and chat.span_id not in {t[2] for t in sent}


@pytest.mark.parametrize("sampled", [False, True])
async def test_the_logprobs_probe_of_a_call_for_token_ids_sends_the_trace_context_too(
    harness: Harness, math_rows: list[dict], memory: InMemorySpanExporter, sampled: bool
) -> None:
    """A call for token ids asks the replica which logprobs it returns (two /completions requests,
    once per process): those requests carry the call's trace context as the call itself does."""
    trace_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736
    start = harness.start(math_rows[0], agent="simple_agent", env="math", return_token_ids=True)
    out, exchanges = await _call_through_proxy(harness, start, trace_id, sampled)
    assert out.turn is not None and out.turn.logprobs_mode == "processed_logprobs"
    assert [x.path for x in exchanges] == ["/v1/chat/completions", "/v1/completions", "/v1/completions"]
    sent = [x.headers["traceparent"].split("-") for x in exchanges]
    assert all(t[1] == f"{trace_id:032x}" and t[3] == ("01" if sampled else "00") for t in sent)


class Counting:
    """How many spans the SDK's tracers build (recorded or not), counted at `Tracer.start_span`."""

    def __init__(self) -> None:
        self.calls = 0


@pytest.fixture
def counting(exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> Counting:
    assert tracing.FOLLOWS_PARENT  # the SDK's default sampler, parentbased_always_on, follows its parent
    counter, start_span = Counting(), SdkTracer.start_span

    def counted(self: SdkTracer, *args: Any, **kwargs: Any) -> Any:
        counter.calls += 1
        return start_span(self, *args, **kwargs)

    monkeypatch.setattr(SdkTracer, "start_span", counted)
    return counter


@pytest.mark.parametrize("sampled", [False, True])
async def test_a_hop_of_a_rollout_not_sampled_builds_no_span_and_passes_its_context_on(
    counting: Counting, sampled: bool
) -> None:
    """Not sampled: neither the hop nor anything under it (a send, a tool call, a verification) builds a
    span, unrecorded or not; the rollout's context is current all the same, so what the hop sends
    carries it. Sampled: each of them is a span."""
    trace_id = 0x5B8AA5A2D2C872E8321CF37308D69DF2
    traceparent = f"00-{trace_id:032x}-051581bf3cb55c13-{'01' if sampled else '00'}"
    hop = spans.hop("gym.tool.math", "tool-math", Delivery(published_at=1.0, headers={"traceparent": traceparent}), 9)
    try:
        assert trace.get_current_span().get_span_context().trace_id == trace_id
        headers: dict[str, str] = {}
        with spans.sending("gym.agent.simple_agent", headers, "s:1"):
            pass
        assert headers["traceparent"].split("-")[1] == f"{trace_id:032x}"
        call = FunctionCall(call_id="c1", name="calculator", arguments='{"expression": "1 + 1"}')
        assert await genai.tool_call("s", call, asyncio.sleep(0, "2")) == "2"
        assert await spans.verification("math", "s", asyncio.sleep(0, 1.0)) == 1.0
    finally:
        hop.end()
    assert counting.calls == (4 if sampled else 0)


@pytest.mark.parametrize("sampled", [False, True])
async def test_a_request_of_a_trace_not_sampled_skips_the_server_instrumentation(
    counting: Counting, sampled: bool
) -> None:
    """A model server's request (the simulated policy's ASGI app) whose trace is not sampled goes past
    the OpenTelemetry middleware, answered as any other."""

    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/v1/models", ok)])
    tracing.instrument_app(app)
    traceparent = f"00-{0x1F:032x}-{0x2E:016x}-{'01' if sampled else '00'}".encode()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "http_version": "1.1", "method": "GET", "scheme": "http", "path": "/v1/models",
        "raw_path": b"/v1/models", "root_path": "", "query_string": b"", "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000), "headers": [(b"host", b"127.0.0.1:8000"), (b"traceparent", traceparent)],
    }  # fmt: skip
    await app(scope, receive, send)
    assert sent[0]["status"] == 200 and sent[-1]["body"] == b"ok"
    assert (counting.calls > 0) if sampled else (counting.calls == 0)
