"""GenAI spans: a ``chat <model>`` span around every model call and an ``execute_tool <name>`` span
around every tool call, with the GenAI semantic-convention attributes (names in `runtime.telemetry.semconv`).

Prompts, outputs, tool arguments and tool results are recorded only when the user opts in
(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true or span_only), in the semconv message shape.
The model client only sends the trace context (``traceparent``): the worker wraps it in `TracedModel`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry.instrumentation.utils import suppress_http_instrumentation
from opentelemetry.trace import SpanKind, Tracer

from runtime.items import text_of
from runtime.telemetry import semconv, tracing
from runtime.telemetry.spans import record_error

if TYPE_CHECKING:
    from broker.schemas import FunctionCall, Session
    from runtime.model.client import ModelOutput

T = TypeVar("T")


class TracedModel:
    """Wraps the model client: a GenAI ``chat <model>`` span around every call."""

    def __init__(self, respond: Callable[..., Coroutine[Any, Any, ModelOutput]]) -> None:
        self._respond = respond

    def __call__(
        self, items: list[dict[str, Any]], params: dict[str, Any], session: Session, *args: Any, **kwargs: Any
    ) -> Coroutine[Any, Any, ModelOutput]:
        tracer = tracing.TRACER
        if tracer is None or tracing.in_unsampled():  # tracing off, or a rollout not sampled: no span, and
            # the client's own awaitable without a coroutine of ours around it (its HTTP call is not
            # instrumented either: runtime/model/client.py `ModelClient._http`)
            return self._respond(items, params, session, *args, **kwargs)
        return self._traced(tracer, items, params, session, *args, **kwargs)

    async def _traced(
        self,
        tracer: Tracer,
        items: list[dict[str, Any]],
        params: dict[str, Any],
        session: Session,
        *args: Any,
        **kwargs: Any,
    ) -> ModelOutput:
        model = params.get("model") or session.model
        with tracer.start_as_current_span(f"{semconv.CHAT} {model}", kind=SpanKind.CLIENT) as span:
            recording = span.is_recording()
            if recording:
                span.set_attributes(_request_attributes(model, params, session.session_id))
                if tracing.CAPTURE_CONTENT:
                    span.set_attribute(semconv.GEN_AI_INPUT_MESSAGES, json.dumps(messages(items)))
            try:
                if recording:
                    out = await self._respond(items, params, session, *args, **kwargs)
                else:  # a rollout not sampled: its HTTP call gets no span either (the aiohttp instrumentation
                    # built one, unrecorded, with its attributes and metrics: 12 % of an agent worker's CPU in
                    # a run sampled at 0.1 %); the client still sends the trace context, marked not sampled
                    with suppress_http_instrumentation():
                        out = await self._respond(items, params, session, *args, **kwargs)
            except BaseException as exc:
                record_error(span, exc)
                raise
            if span.is_recording():
                span.set_attributes({**_sampling_attributes(getattr(out, "sampling", {})), **_response_attributes(out)})
                if tracing.CAPTURE_CONTENT:
                    span.set_attribute(semconv.GEN_AI_OUTPUT_MESSAGES, json.dumps(messages(out.items)))
            return out


def _request_attributes(model: str, params: dict[str, Any], sid: str) -> dict[str, Any]:
    return {
        semconv.GEN_AI_OPERATION_NAME: semconv.CHAT,
        semconv.GEN_AI_PROVIDER_NAME: semconv.GEN_AI_PROVIDER,
        semconv.GEN_AI_REQUEST_MODEL: model,
        semconv.GEN_AI_CONVERSATION_ID: sid,
        semconv.OPENINFERENCE_SPAN_KIND: semconv.KIND_LLM,
        semconv.SESSION_ID: sid,
        **_sampling_attributes(params),
    }


def _sampling_attributes(params: dict[str, Any]) -> dict[str, Any]:
    """The sampling parameters among ``params`` (the task's, then those the client actually sent)."""
    attrs: dict[str, Any] = {}
    for key, name in semconv.SAMPLING_ATTRIBUTES.items():
        value = params.get(key)
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            attrs[name] = [value] if key == "stop" else value
        elif key == "stop" and isinstance(value, list):
            attrs[name] = [str(v) for v in value]
    return attrs


def _response_attributes(out: ModelOutput) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        semconv.GEN_AI_USAGE_INPUT_TOKENS: out.usage.input_tokens,
        semconv.GEN_AI_USAGE_OUTPUT_TOKENS: out.usage.output_tokens,
    }
    reason = finish_reason(getattr(out, "finish_reason", None), out.items)
    if reason:
        attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = [reason]
    return attrs


def finish_reason(raw: str | None, items: list[dict[str, Any]]) -> str | None:
    """A Chat finish reason as is; a Responses ``status`` mapped to one (stop, tool_calls, length)."""
    if raw == "completed":
        return "tool_calls" if any(i.get("type") == "function_call" for i in items) else "stop"
    if raw == "incomplete":
        return "length"
    return raw


def messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses items in the GenAI semconv message shape (recorded only when content capture is on)."""
    out = []
    for item in items:
        parts: list[dict[str, Any]]
        match item.get("type", "message"):
            case "message":
                role, parts = item.get("role", "user"), [{"type": "text", "content": text_of(item.get("content"))}]
            case "function_call":
                role = "assistant"
                parts = [
                    {
                        "type": "tool_call",
                        "id": item.get("call_id"),
                        "name": item.get("name"),
                        "arguments": item.get("arguments"),
                    }
                ]
            case "function_call_output":
                role = "tool"
                parts = [{"type": "tool_call_response", "id": item.get("call_id"), "response": item.get("output")}]
            case "reasoning":
                role, parts = "assistant", [{"type": "reasoning", "content": text_of(item.get("summary"))}]
            case _:
                continue
        out.append({"role": role, "parts": parts})
    return out


async def tool_call(session_id: str, call: FunctionCall, run: Awaitable[T]) -> T:
    """Await ``run`` (one tool call) inside an ``execute_tool <name>`` span."""
    tracer = tracing.TRACER
    if tracer is None or tracing.in_unsampled():
        return await run
    with tracer.start_as_current_span(f"{semconv.EXECUTE_TOOL} {call.name}") as span:
        if span.is_recording():
            span.set_attributes(
                {
                    semconv.GEN_AI_OPERATION_NAME: semconv.EXECUTE_TOOL,
                    semconv.GEN_AI_TOOL_NAME: call.name,
                    semconv.GEN_AI_TOOL_TYPE: "function",
                    semconv.GEN_AI_TOOL_CALL_ID: call.call_id,
                    semconv.GEN_AI_CONVERSATION_ID: session_id,
                    semconv.OPENINFERENCE_SPAN_KIND: semconv.KIND_TOOL,
                    semconv.SESSION_ID: session_id,
                }
            )
            if tracing.CAPTURE_CONTENT:
                span.set_attribute(semconv.GEN_AI_TOOL_CALL_ARGUMENTS, call.arguments)
        try:
            result = await run
        except BaseException as exc:
            record_error(span, exc)
            raise
        if tracing.CAPTURE_CONTENT and span.is_recording():
            span.set_attribute(semconv.GEN_AI_TOOL_CALL_RESULT, str(result))
        return result
