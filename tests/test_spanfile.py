"""traces.jsonl: many processes append to one file; the reader rebuilds rollouts and their hops."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pytest import approx

from conftest import ROOT
from runtime.profiling import breakdown as traces
from runtime.telemetry import semconv, spanfile
from runtime.telemetry.spanfile import SpanRecord

WRITER = """
import sys
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from runtime.telemetry.spanfile import JsonlSpanExporter
provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(JsonlSpanExporter(sys.argv[1]), max_export_batch_size=512))
tracer = provider.get_tracer("w")
for i in range(3000):
    tracer.start_span("span " + sys.argv[2], attributes={"pad": "x" * (i % 400)}).end()
provider.shutdown()
"""


def test_concurrent_writers_never_interleave_lines(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(n)], cwd=ROOT, stderr=subprocess.PIPE)
        for n in range(4)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read().decode() if p.stderr else ""
    lines = path.read_bytes().splitlines()
    spans = spanfile.load(path)
    assert len(lines) == len(spans) == 4 * 3000, "every line is one whole span"
    assert sorted({s.name for s in spans}) == ["span 0", "span 1", "span 2", "span 3"]


def span(name: str, span_id: str, parent: str | None, start_ms: float, end_ms: float, **kw: object) -> SpanRecord:
    ms = 1_000_000
    return SpanRecord(
        trace_id="t1",
        span_id=span_id,
        parent_id=parent,
        name=name,
        kind=str(kw.pop("kind", "internal")),
        start_ns=int(start_ms * ms),
        end_ns=int(end_ms * ms),
        attributes=dict(kw.pop("attributes", {})),  # type: ignore[call-overload]
    )


def test_breakdown_counts_hops_and_their_queue_waits() -> None:
    chat = {semconv.GEN_AI_OPERATION_NAME: "chat"}
    spans = [
        span("invoke_agent simple_agent", "r", None, 0, 100, kind="client"),
        span("process gym.agent.a", "p1", "r", 10, 40, kind="consumer", attributes={semconv.QUEUE_WAIT: 0.01}),
        span("chat policy", "c1", "p1", 12, 32, kind="client", attributes=chat),
        span("send gym.verify.e", "s1", "p1", 35, 38, kind="producer"),
        span("process gym.verify.e", "p2", "r", 60, 100, kind="consumer", attributes={semconv.QUEUE_WAIT: 0.02}),
        span("verify e", "v", "p2", 61, 91),
        SpanRecord(trace_id="lone", span_id="x", name="GET /health", kind="server", start_ns=0, end_ns=5),
    ]
    [rollout] = traces.rollouts(spans)  # the lone server span is no rollout
    assert rollout.root.name == "invoke_agent simple_agent" and rollout.duration_s == 0.1
    rows = {r.hop: r for r in traces.breakdown([rollout])}
    assert list(rows) == [
        "rollout", "queue: agent", "queue: verify", "agent step", "model call", "verify step", "verify", "publish"
    ]  # fmt: skip
    assert rows["queue: verify"].total_s == approx(0.02) and rows["model call"].mean_s == approx(0.02)
    assert rows["agent step"].share == approx(0.3) and rows["agent step"].per_rollout_s == approx(0.03)
    [queue] = [s for s in rollout.spans if s.name == "queue gym.agent.a"]
    assert (queue.start_ns, queue.end_ns, queue.parent_id) == (0, 10_000_000, "r")


def test_a_sample_of_traces_keeps_every_span_of_the_first_traces_and_none_of_the_rest(tmp_path: Path) -> None:
    """The report reads a capped sample of a large traces.jsonl: whole traces, the first met."""
    import msgspec

    path = tmp_path / "traces.jsonl"
    spans = [
        msgspec.structs.replace(span("hop", f"{t}-{k}", None, 0, 1), trace_id=f"t{t}")
        for k in range(3)
        for t in range(5)  # the traces' spans interleaved, as processes append them
    ]
    path.write_bytes(b"".join(msgspec.json.encode(s) + b"\n" for s in spans))
    sample = list(spanfile.iter_spans(path, max_traces=2))
    assert sorted(s.span_id for s in sample) == ["0-0", "0-1", "0-2", "1-0", "1-1", "1-2"]
    assert len(list(spanfile.iter_spans(path))) == 15
