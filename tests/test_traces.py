"""Spans reach the user: traces.jsonl and `gymbus traces` with no collector, OTLP/HTTP with one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from conftest import ROOT
from runtime.model.serving import InThread
from runtime.profiling import breakdown as traces
from runtime.telemetry import spanfile


def gymbus(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYMBUS_TRACES"))}
    cmd = [sys.executable, "-m", "runtime", *args]
    done = subprocess.run(
        cmd, cwd=ROOT, env={**clean, "COLUMNS": "160", **env}, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    return done


def test_quickstart_writes_traces_and_the_slowest_waterfall_prints(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    gymbus("collect", "configs/quickstart.yaml", "-n", "4", "-r", "2", "-o", str(out), "--run-id", "qs", "-q")
    run_dir = out / "qs"
    spans = spanfile.load(run_dir / "traces.jsonl")
    services = {s.service for s in spans}
    assert services == {"gymbus-collect", "gymbus-simple_agent", "gymbus-math", "gymbus-simulated-policy"}
    rollouts = traces.rollouts(spans)
    assert len(rollouts) == 8 and all(r.root.name == "invoke_agent simple_agent" for r in rollouts)
    assert all(r.root.parent_id is None and len(r.children[None]) == 1 for r in rollouts), "no orphan spans"

    hops = {row.hop: row for row in traces.breakdown_of(run_dir)}
    assert hops["rollout"].count == 8 and hops["model call"].count == 16 and hops["tool call"].count == 8
    for hop in ("queue: agent", "queue: tool", "agent step", "tool step", "verify", "publish"):
        assert hops[hop].count > 0 and hops[hop].p50_s >= 0
    assert "verify step" not in hops and hops["verify"].count == 8  # math verifies in the agent's last turn
    assert hops["rollout"].share > 0.97  # the root covers the trace, but for the last worker's ack after the Result

    shown = gymbus("traces", str(run_dir), "--slowest", "1").stdout
    slowest = traces.slowest(rollouts, 1)[0]
    assert "per-hop latency over 8 rollouts" in shown and "model call" in shown
    assert f"rollout {slowest.session_id}" in shown
    for row in ("invoke_agent simple_agent", "queue gym.agent.simple_agent", "chat policy", "execute_tool calculator"):
        assert row in shown
    assert "█" in shown

    as_json = json.loads(gymbus("traces", str(run_dir), "--json", "-n", "2").stdout)
    assert as_json["rollouts"] == 8 and len(as_json["slowest"]) == 2
    assert as_json["slowest"][0]["duration_s"] >= as_json["slowest"][1]["duration_s"]

    report = (run_dir / "report.html").read_text()  # the HTML report embeds the same breakdown
    assert "Where the time went (traces)" in report and "From the spans of 8 rollouts" in report
    assert "<td>model call</td><td>16</td>" in report


class Receiver:
    """An OTLP/HTTP trace receiver: decodes every POST /v1/traces body (protobuf)."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.content_types: set[str] = set()

    async def traces(self, request: Request) -> Response:
        self.content_types.add(request.headers.get("content-type", ""))
        req = ExportTraceServiceRequest()
        req.ParseFromString(await request.body())
        self.requests.append(req)
        return Response(b"", media_type="application/x-protobuf")

    def spans(self) -> list[tuple[str, str, bytes, bytes]]:
        """(service, span name, trace id, parent span id) of every span received."""
        out = []
        for req in self.requests:
            for rs in req.resource_spans:
                attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    out.extend((attrs["service.name"], s.name, s.trace_id, s.parent_span_id) for s in ss.spans)
        return out


def test_spans_arrive_at_an_otlp_endpoint(tmp_path: Path) -> None:
    receiver = Receiver()
    app = Starlette(routes=[Route("/v1/traces", receiver.traces, methods=["POST"])])
    out = tmp_path / "runs"
    with InThread(app) as server:
        gymbus(
            "collect", "configs/quickstart.yaml", "-n", "2", "-r", "1", "-o", str(out), "--run-id", "otlp", "-q",
            OTEL_EXPORTER_OTLP_ENDPOINT=server.url, OTEL_BSP_SCHEDULE_DELAY="100",
        )  # fmt: skip
    assert receiver.content_types == {"application/x-protobuf"}
    spans = receiver.spans()
    by_service = defaultdict(set)
    for service, name, _, _ in spans:
        by_service[service].add(name)
    assert "invoke_agent simple_agent" in by_service["gymbus-collect"]
    assert {"process gym.agent.simple_agent", "chat policy", "POST", "verify math"} <= by_service["gymbus-simple_agent"]
    assert {"process gym.tool.math", "execute_tool calculator"} <= by_service["gymbus-math"]
    assert "POST /v1/responses" in by_service["gymbus-simulated-policy"]
    roots = [trace_id for _, name, trace_id, parent in spans if not parent]
    assert len(roots) == 2 and {t for _, _, t, _ in spans} == set(roots), "two rollouts, two traces"
    assert not (out / "otlp" / "traces.jsonl").exists(), "with a collector, no local file"
