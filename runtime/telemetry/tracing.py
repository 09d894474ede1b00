"""OpenTelemetry setup: where spans go, configured by the standard ``OTEL_*`` variables.

    OTLP       on when OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set, or when
               OTEL_TRACES_EXPORTER names ``otlp``; protocol from OTEL_EXPORTER_OTLP_PROTOCOL
               (http/protobuf by default, grpc with the ``gymbus[grpc]`` extra)
    console    when OTEL_TRACES_EXPORTER names ``console``
    JSONL      when a traces file is given (GYMBUS_TRACES_FILE, or ``gymbus collect``'s run folder
               when no OTLP endpoint is set): the local default, read by ``gymbus traces``
    nothing    tracing is off and costs nothing (no provider, every span helper returns at once);
               so is OTEL_SDK_DISABLED=true

Shutdown. Every process exports its last spans before it exits (after SIGTERM and a drain, at the
end of ``gymbus collect``), within GYMBUS_TRACES_FLUSH_S seconds (5): the SDK's own exit hook has
no bound a supervisor can rely on, and by the time it runs asyncio has given SIGTERM back its
default action, so a second SIGTERM (a supervisor stopping processes one after another) killed the
process in the middle of its last export. The final flush ignores SIGTERM and ends in time.

Sampling follows OTEL_TRACES_SAMPLER (default parentbased_always_on): the rollout's root decides
and every hop follows. Under a sampler that follows its parent (every ``parentbased_*``), a rollout
not sampled costs nothing more: a message, a model call or a request whose ``traceparent`` says "not
sampled" builds no span at all, not even an unrecorded one (`FOLLOWS_PARENT`, `not_sampled`).
Resource attributes come from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, defaulting
``service.name`` to the process's role (``gymbus-collect``, ``gymbus-math``, ...).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Tracer

from runtime.errors import UsageError
from runtime.telemetry import semconv

log = logging.getLogger("gymbus.tracing")

TRACES_FILE_ENV = "GYMBUS_TRACES_FILE"
FLUSH_ENV = "GYMBUS_TRACES_FLUSH_S"
"""Longest a process waits for its last spans to be exported when it exits (default 5 s)."""
CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_PROBES_UNTRACED = "OTEL_PYTHON_STARLETTE_EXCLUDED_URLS"


class TracingError(UsageError, ValueError):
    """The OTEL_* configuration cannot be served (e.g. a protocol whose exporter is not installed)."""


TRACER: Tracer | None = None
"""gymbus's tracer, or None while tracing is off (the span helpers check this first)."""
CAPTURE_CONTENT = False
"""Record prompts, outputs and tool arguments/results on spans (opt-in, they may hold PII)."""
FOLLOWS_PARENT = False
"""Whether the sampler drops every span under a parent that was not sampled (set by `install`): then
the span helpers skip such a rollout's spans altogether. Building them unrecorded, with their
contexts, the aiohttp and ASGI instrumentation's hooks and metrics, took about a fifth of an agent
worker's CPU in a run traced at 0.1 %."""
_provider: Any = None
_file: Any = None


def enabled() -> bool:
    return TRACER is not None


def configure(service: str, traces_file: str | Path | None = None) -> bool:
    """Install a tracer provider for this process from the environment; False if nothing would
    receive spans. Called again (another run in the same process), it re-points the JSONL file."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    path = traces_file or os.environ.get(TRACES_FILE_ENV) or None
    if _provider is None:
        exporters = _env_exporters()
        if not exporters and not path:
            return False
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=_resource(service))
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        install(provider)
        atexit.register(shutdown)  # after the provider's own hook, so it runs first (see `shutdown`)
    if path:
        write_file(path)
    return True


def install(provider: Any) -> None:
    """Record gymbus spans with ``provider`` (an SDK TracerProvider) and instrument aiohttp clients."""
    global TRACER, CAPTURE_CONTENT, FOLLOWS_PARENT, _provider
    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor

    from broker import publish
    from runtime.telemetry import spans

    _provider = provider
    publish.instrument(spans.sending)
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):  # the global can be set once
        trace.set_tracer_provider(provider)
    TRACER = provider.get_tracer("gymbus")
    CAPTURE_CONTENT = os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() in ("true", "span_only", "span_and_event")
    instrumentor = AioHttpClientInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(tracer_provider=provider)
    FOLLOWS_PARENT = _drops_unsampled_children(provider)


def _drops_unsampled_children(provider: Any) -> bool:
    """Ask the provider's sampler about a span under a remote parent that was not sampled."""
    from opentelemetry.sdk.trace.sampling import Decision
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    sampler = getattr(provider, "sampler", None)
    if sampler is None:
        return False
    parent = SpanContext(trace_id=1, span_id=1, is_remote=True, trace_flags=TraceFlags(TraceFlags.DEFAULT))
    context = trace.set_span_in_context(NonRecordingSpan(parent))
    return bool(sampler.should_sample(context, 1, "probe").decision == Decision.DROP)


def not_sampled(traceparent: str | None) -> bool:
    """Whether a message or request with this ``traceparent`` belongs to a trace not sampled, under a
    sampler that then records nothing of it (W3C: ``version-trace_id-parent_id-flags``, bit 0 of the
    flags is "sampled")."""
    if not FOLLOWS_PARENT or not traceparent or len(traceparent) < 55 or traceparent[-3] != "-":
        return False
    try:
        return not int(traceparent[-2:], 16) & 1
    except ValueError:
        return False


def in_unsampled() -> bool:
    """Whether the current context is a trace not sampled, under which the sampler records nothing."""
    if not FOLLOWS_PARENT:
        return False
    ctx = trace.get_current_span().get_span_context()
    return ctx.is_valid and not ctx.trace_flags.sampled


def write_file(path: str | Path | None) -> None:
    """Append this process's spans to ``path`` (None: stop writing them to a file)."""
    global _file
    if _provider is None:
        return
    if _file is None:
        if path is None:
            return
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from runtime.telemetry.spanfile import JsonlSpanExporter

        _file = JsonlSpanExporter(path)
        _provider.add_span_processor(BatchSpanProcessor(_file))
    elif _file.path != (Path(path) if path else None):
        _provider.force_flush()
        _file.reopen(path)


def flush(timeout_s: float = 10.0) -> bool:
    """Export every finished span now (before a file is read, or the process exits), waiting at most
    ``timeout_s``; False if the export did not finish in time (the SDK's force_flush has no bound)."""
    if _provider is None:
        return True
    return _bounded(_provider.force_flush, timeout_s)


def shutdown(timeout_s: float | None = None) -> bool:
    """The process's last export, then the exporters closed, within ``timeout_s`` (default
    $GYMBUS_TRACES_FLUSH_S, 5 s) whatever the backend does; SIGTERM is ignored meanwhile (the
    process is exiting anyway). Runs at exit for every process `configure` set up."""
    global TRACER, _provider, _file
    provider = _provider
    if provider is None:
        return True
    if timeout_s is None:
        timeout_s = _flush_bound()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    atexit.unregister(provider.shutdown)  # its join on a stuck export would wait 30 s per processor
    deadline = time.monotonic() + timeout_s
    flushed = _bounded(provider.force_flush, timeout_s)
    closed = _bounded(provider.shutdown, max(0.1, deadline - time.monotonic()))
    if not flushed:
        log.warning("traces: the last spans were not exported within %gs (%s); they are lost", timeout_s, FLUSH_ENV)
    TRACER, _provider, _file = None, None, None
    return flushed and closed


def _flush_bound() -> float:
    raw = os.environ.get(FLUSH_ENV, "").strip()
    try:
        return max(0.0, float(raw)) if raw else 5.0
    except ValueError:
        log.warning("%s=%r is not a number of seconds; using 5", FLUSH_ENV, raw)
        return 5.0


def _bounded(call: Callable[[], object], timeout_s: float) -> bool:
    """Run ``call`` in a daemon thread and wait at most ``timeout_s`` for it; True if it finished."""
    worker = threading.Thread(target=call, name="gymbus-trace-flush", daemon=True)
    worker.start()
    worker.join(timeout_s)
    return not worker.is_alive()


def otlp_configured() -> bool:
    exporters = _exporter_names()
    return "none" not in exporters and ("otlp" in exporters or any(os.environ.get(v) for v in _OTLP_ENDPOINTS))


def instrument_app(app: Any) -> None:
    """Server spans for a Starlette app (the worker's probes are left out unless
    OTEL_PYTHON_STARLETTE_EXCLUDED_URLS says otherwise: scrapes are not rollout work). A request of a
    trace not sampled skips the instrumentation (`not_sampled`)."""
    if _provider is None:
        return
    os.environ.setdefault(_PROBES_UNTRACED, "metrics,healthz")
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    from opentelemetry.instrumentation.starlette import StarletteInstrumentor

    StarletteInstrumentor.instrument_app(app, tracer_provider=_provider)
    for m in app.user_middleware:
        if m.cls is OpenTelemetryMiddleware:
            m.cls = _skipping_unsampled(OpenTelemetryMiddleware)


def _skipping_unsampled(middleware: type[Any]) -> type[Any]:
    """The instrumentation's ASGI middleware, passing a request of a trace not sampled straight on."""

    class SkipsUnsampled(middleware):
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope.get("type") == "http":
                parent = next((v for k, v in scope.get("headers", ()) if k == b"traceparent"), None)
                if parent is not None and not_sampled(parent.decode("latin-1")):
                    await self.app(scope, receive, send)
                    return
            await super().__call__(scope, receive, send)

    return SkipsUnsampled


def _exporter_names() -> set[str]:
    return {n.strip().lower() for n in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()}


def _env_exporters() -> list[Any]:
    names, out = _exporter_names(), []
    if otlp_configured():
        out.append(_otlp_exporter())
    if "console" in names:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        out.append(ConsoleSpanExporter())
    return out


def _otlp_exporter() -> Any:
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise TracingError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the gRPC exporter: pip install 'gymbus[grpc]'"
            ) from exc
        return OTLPSpanExporter()
    if protocol != "http/protobuf":
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s is not supported here; using http/protobuf", protocol)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter()


def _resource(service: str) -> Any:
    from opentelemetry.sdk.resources import Resource

    attrs: dict[str, Any] = {semconv.SERVICE_INSTANCE_ID: f"{socket.gethostname()}-{os.getpid()}"}
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    if not named:
        attrs[semconv.SERVICE_NAME] = service
    return Resource.create(attrs)


def configure_run(run_dir: Path) -> dict[str, str]:
    """Trace a ``gymbus collect`` run: to OTLP when an endpoint is set, else to ``run_dir/traces.jsonl``.
    Returns the environment its local workers and simulated policy need to write there too."""
    local = not otlp_configured() and "none" not in _exporter_names()
    path = (run_dir / "traces.jsonl").resolve() if local else None
    if not configure("gymbus-collect", path):
        return {}
    return {TRACES_FILE_ENV: str(path)} if path else {}


def end_run() -> None:
    """Flush this process's spans of the run and stop writing them to its file."""
    flush()
    write_file(os.environ.get(TRACES_FILE_ENV) or None)


def uninstall() -> None:
    """Back to tracing off (tests): flush, drop the provider and the aiohttp instrumentation."""
    global TRACER, FOLLOWS_PARENT, _provider, _file
    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor

    flush()
    if _file is not None:
        _file.reopen(None)
    TRACER, _provider, _file = None, None, None
    FOLLOWS_PARENT = False
    AioHttpClientInstrumentor().uninstrument()
