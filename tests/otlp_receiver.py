"""An OTLP/HTTP trace receiver for tests: it stands where compose runs the OpenTelemetry collector.

It accepts what any OTLP exporter sends to ``POST /v1/traces`` (protobuf, or JSON for
``http/json``), decodes it with the OTLP protobuf types, and keeps the spans.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from runtime.model.serving import InThread


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str


class OtlpReceiver:
    """Serves ``/v1/traces`` on 127.0.0.1 (a free port, or the one given) and records every span."""

    def __init__(self, port: int = 0) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        self._server = InThread(Starlette(routes=[Route("/v1/traces", self._export, methods=["POST"])]), port=port)
        self.endpoint = self._server.url

    def services(self) -> set[str]:
        with self._lock:
            return {s.service for s in self.spans}

    def __enter__(self) -> OtlpReceiver:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__()

    async def _export(self, request: Request) -> Response:
        body = await request.body()
        message = ExportTraceServiceRequest()
        if request.headers.get("content-type", "").startswith("application/json"):
            json_format.Parse(body, message)
        else:
            message.ParseFromString(body)
        spans = [
            Span(_service(rs.resource.attributes), s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex())
            for rs in message.resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
        ]
        with self._lock:
            self.spans.extend(spans)
        reply = ExportTraceServiceResponse().SerializeToString()
        return Response(reply, media_type="application/x-protobuf")


def _service(attributes: object) -> str:
    for kv in attributes:  # type: ignore[attr-defined]
        if kv.key == "service.name":
            return kv.value.string_value
    return ""
