"""The test's OTLP receiver decodes what a real OpenTelemetry exporter sends (so trace checks can trust it)."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.otlp_receiver import OtlpReceiver


def test_receiver_keeps_spans_exported_over_otlp_http(monkeypatch: pytest.MonkeyPatch) -> None:
    with OtlpReceiver() as receiver:
        # configured as compose configures every service: a base endpoint, the exporter adds /v1/traces
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        provider = TracerProvider(resource=Resource.create({"service.name": "gymbus-test"}))
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
        tracer = provider.get_tracer("test")
        with tracer.start_as_current_span("rollout") as parent, tracer.start_as_current_span("chat policy"):
            trace_id = format(parent.get_span_context().trace_id, "032x")
        provider.shutdown()
    assert receiver.services() == {"gymbus-test"}
    spans = {s.name: s for s in receiver.spans}
    assert set(spans) == {"rollout", "chat policy"}
    assert spans["chat policy"].trace_id == spans["rollout"].trace_id == trace_id
    assert spans["chat policy"].parent_span_id == spans["rollout"].span_id
