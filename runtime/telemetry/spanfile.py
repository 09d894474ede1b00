"""``traces.jsonl``: finished spans as JSON lines, the local default when no OTLP collector is set.

Several processes append to one file (``gymbus collect``, each worker, the simulated policy). Each
export is written by single ``os.write`` calls on an ``O_APPEND`` descriptor, each call holding whole
lines only, so lines of different processes never interleave (appends to a local file are atomic);
a reader skips a line it cannot parse (a process killed mid-write leaves at most one).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import StatusCode, format_span_id, format_trace_id

from runtime.telemetry import semconv

CHUNK_BYTES = 64 * 1024
"""Most bytes one write call carries (always whole lines)."""


class SpanRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One finished span, as one line of ``traces.jsonl``."""

    trace_id: str
    """32 hex digits; one rollout is one trace."""
    span_id: str
    """16 hex digits."""
    parent_id: str | None = None
    """The parent span's id; None for a trace's root."""
    name: str
    kind: str
    """internal, server, client, producer or consumer."""
    start_ns: int
    """Unix time in nanoseconds."""
    end_ns: int
    service: str = ""
    """``service.name`` of the process that recorded it."""
    status: str = "unset"
    """unset, ok or error."""
    error: str | None = None
    """The status description when ``status`` is error."""
    attributes: dict[str, Any] = {}

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(SpanRecord)


def record(span: ReadableSpan) -> SpanRecord:
    ctx = span.context
    assert ctx is not None
    status = span.status.status_code
    return SpanRecord(
        trace_id=format_trace_id(ctx.trace_id),
        span_id=format_span_id(ctx.span_id),
        parent_id=format_span_id(span.parent.span_id) if span.parent is not None else None,
        name=span.name,
        kind=span.kind.name.lower(),
        start_ns=span.start_time or 0,
        end_ns=span.end_time or 0,
        service=str(span.resource.attributes.get(semconv.SERVICE_NAME, "")),
        status=status.name.lower(),
        error=span.status.description if status is StatusCode.ERROR else None,
        attributes=dict(span.attributes or {}),
    )


def chunks(lines: Iterable[bytes], limit: int = CHUNK_BYTES) -> Iterable[bytes]:
    """Whole lines joined into pieces of at most ``limit`` bytes (a longer line is its own piece)."""
    buf: list[bytes] = []
    size = 0
    for line in lines:
        if buf and size + len(line) > limit:
            yield b"".join(buf)
            buf, size = [], 0
        buf.append(line)
        size += len(line)
    if buf:
        yield b"".join(buf)


class JsonlSpanExporter(SpanExporter):
    """Appends spans to a JSON-lines file; ``reopen`` points it at another file (None: drop spans)."""

    def __init__(self, path: str | Path | None) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self.reopen(path)

    def reopen(self, path: str | Path | None) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self.path = Path(path) if path else None
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = (_encoder.encode(record(s)) + b"\n" for s in spans)
        with self._lock:
            if self._fd is None:
                return SpanExportResult.SUCCESS
            try:
                for piece in chunks(lines):
                    os.write(self._fd, piece)
            except OSError:
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.reopen(None)


def load(path: str | Path) -> list[SpanRecord]:
    """Every span in a ``traces.jsonl``, skipping lines that do not parse."""
    return list(iter_spans(path))


def iter_spans(path: str | Path, max_traces: int | None = None) -> Iterator[SpanRecord]:
    """The spans of a ``traces.jsonl`` one line at a time, skipping lines that do not parse; with
    ``max_traces``, only those of the first that many traces met in the file (a sample whose size,
    unlike the file's, does not grow with the run)."""
    traces: set[str] = set()
    with open(path, "rb") as fh:
        for line in fh:
            try:
                span = _decoder.decode(line)
            except msgspec.DecodeError:
                continue
            if max_traces is not None and span.trace_id not in traces:
                if len(traces) >= max_traces:
                    continue
                traces.add(span.trace_id)
            yield span
