"""Telemetry: one OpenTelemetry trace per rollout, across every process.

    tracing.py      setup from the OTEL_* variables; traces.jsonl for local runs
    semconv.py      every span and attribute name
    spans.py        hop spans (PRODUCER/CONSUMER), verification spans, rollout roots
    genai.py        GenAI spans of model calls and tool calls
    spanfile.py     the traces.jsonl exporter and reader (`gymbus traces` reads it: profiling.breakdown)
"""
