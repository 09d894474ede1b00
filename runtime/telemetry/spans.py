"""The spans of a rollout: one trace across every hop, whichever process runs it.

Propagation. Every message of a rollout carries the rollout's W3C trace context (``traceparent``,
``tracestate``) in its headers: the Start gets it from `sending` (the root span is current while
collect publishes it), the session record keeps the Start's headers, and every message the session
emits is published with them. So each hop's CONSUMER span is a child of the rollout's root and the
trace stays flat, however many turns it takes. A Start published without trace context (a foreign
publisher) takes the context of its first hop, whose span becomes the trace's root.

Every helper returns at once when tracing is off (`runtime.telemetry.tracing.TRACER` is None) or the
rollout was not sampled (`runtime.telemetry.tracing.not_sampled`: its hop only makes the rollout's
context current, so what it sends carries it), and sets attributes only on recording spans.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from contextvars import Token
from typing import TYPE_CHECKING, Protocol, TypeVar

from opentelemetry import context, propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode

from runtime.telemetry import semconv, tracing

if TYPE_CHECKING:
    from broker.schemas import Result, Start

T = TypeVar("T")
TRACEPARENT = "traceparent"


class DeliveryLike(Protocol):
    @property
    def published_at(self) -> float: ...
    @property
    def received_at(self) -> float: ...
    @property
    def num_delivered(self) -> int: ...
    @property
    def headers(self) -> dict[str, str]: ...


def _ns(unix_s: float) -> int:
    return int(unix_s * 1e9)


@contextmanager
def sending(subject: str, headers: dict[str, str], msg_id: str) -> Iterator[None]:
    """A PRODUCER span around one publish; a message without trace context gets the current one. With
    no span current (a resume's nudge, sent from outside any hop), the span is of the message's trace."""
    tracer = tracing.TRACER
    if tracer is None:
        yield
        return
    parent = None
    if TRACEPARENT not in headers:
        propagate.inject(headers)
    elif not trace.get_current_span().get_span_context().is_valid:
        parent = propagate.extract(headers)
    if tracing.in_unsampled() if parent is None else tracing.not_sampled(headers[TRACEPARENT]):
        yield
        return
    with tracer.start_as_current_span(f"{semconv.SEND} {subject}", context=parent, kind=SpanKind.PRODUCER) as span:
        if span.is_recording():
            span.set_attributes(
                {
                    semconv.MESSAGING_SYSTEM: semconv.MESSAGING_SYSTEM_NATS,
                    semconv.MESSAGING_OPERATION_TYPE: "send",
                    semconv.MESSAGING_OPERATION_NAME: "send",
                    semconv.MESSAGING_DESTINATION_NAME: subject,
                    semconv.MESSAGING_MESSAGE_ID: msg_id,
                }
            )
        yield


class Hop:
    """The CONSUMER span of one message in a worker, current until `end`."""

    __slots__ = ("_token", "span")

    def __init__(self, span: Span, token: Token[Context] | None) -> None:
        self.span = span
        self._token = token

    def message(self, kind: str, session_id: str | None) -> None:
        if self.span.is_recording():
            self.span.set_attribute(semconv.MESSAGE_KIND, kind)
            if session_id:
                self.span.set_attribute(semconv.MESSAGING_MESSAGE_CONVERSATION_ID, session_id)
                self.span.set_attribute(semconv.SESSION_ID, session_id)

    def end(self) -> None:
        if self._token is not None:
            context.detach(self._token)
            self.span.end()


_NO_HOP = Hop(INVALID_SPAN, None)


def hop(subject: str, group: str, d: DeliveryLike, size: int) -> Hop:
    """Start the span of one delivered message. Its wait in the stream is an attribute
    (``gymbus.queue.wait_s``), not a span of its own: a quarter less tracing work per hop."""
    tracer = tracing.TRACER
    if tracer is None:
        return _NO_HOP
    parent = propagate.extract(d.headers)
    if tracing.not_sampled(d.headers.get(TRACEPARENT)):
        return Hop(INVALID_SPAN, context.attach(parent))
    span = tracer.start_span(
        f"{semconv.PROCESS} {subject}", context=parent, kind=SpanKind.CONSUMER, start_time=_ns(d.received_at)
    )
    here = trace.set_span_in_context(span, parent)
    if not trace.get_current_span(parent).get_span_context().is_valid:
        propagate.inject(d.headers, context=here)  # a foreign publisher's Start: the rollout takes this context
    if span.is_recording():
        span.set_attributes(
            {
                semconv.MESSAGING_SYSTEM: semconv.MESSAGING_SYSTEM_NATS,
                semconv.MESSAGING_OPERATION_TYPE: "process",
                semconv.MESSAGING_OPERATION_NAME: "process",
                semconv.MESSAGING_DESTINATION_NAME: subject,
                semconv.MESSAGING_CONSUMER_GROUP_NAME: group,
                semconv.MESSAGING_MESSAGE_BODY_SIZE: size,
                semconv.DELIVERY_COUNT: d.num_delivered,
                semconv.QUEUE_WAIT: max(0.0, d.received_at - d.published_at),
                semconv.OPENINFERENCE_SPAN_KIND: semconv.KIND_CHAIN,
            }
        )
    return Hop(span, context.attach(here))


def settled(outcome: str, kind: str | None = None, reason: str | None = None) -> None:
    """Record how the current hop ended: ack, retry (redelivered later) or fail (the rollout fails)."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute(semconv.OUTCOME, outcome)
    if kind is not None:
        span.set_attribute(semconv.ERROR_TYPE, kind)
        span.set_status(Status(StatusCode.ERROR, reason))


def record_error(span: Span, exc: BaseException) -> None:
    """``error.type`` on a span: the failure kind of a gymbus error, else the exception class."""
    if span.is_recording():
        span.set_attribute(semconv.ERROR_TYPE, getattr(exc, "kind", None) or type(exc).__name__)


async def verification(env: str, session_id: str, run: Awaitable[T]) -> T:
    """Await ``run`` (the verifier) inside a ``verify <env>`` span that records the reward."""
    tracer = tracing.TRACER
    if tracer is None or tracing.in_unsampled():
        return await run
    with tracer.start_as_current_span(f"{semconv.VERIFY} {env}") as span:
        if span.is_recording():
            span.set_attributes(
                {
                    semconv.ENV_NAME: env,
                    semconv.GEN_AI_CONVERSATION_ID: session_id,
                    semconv.OPENINFERENCE_SPAN_KIND: semconv.KIND_EVALUATOR,
                    semconv.SESSION_ID: session_id,
                }
            )
        try:
            verdict = await run
        except BaseException as exc:
            record_error(span, exc)
            raise
        reward = getattr(verdict, "reward", verdict)
        if span.is_recording() and isinstance(reward, (int, float)) and not isinstance(reward, bool):
            span.set_attribute(semconv.REWARD, float(reward))
        return verdict


class RolloutSpans:
    """The root span of each rollout this process submits: from its Start to its Result.

    The root lives in the submitting process (collect) and is ended there when the Result arrives,
    whichever worker finished the rollout; the hops in other processes are its children through
    the trace context the Start carries. A rollout still open when the process stops waiting
    (interrupted run) is ended then, marked unfinished, so its hops still hang off a root.
    """

    def __init__(self) -> None:
        self._open: dict[str, Span] = {}

    @contextmanager
    def submitting(self, start: Start, session_id: str) -> Iterator[None]:
        """Open the rollout's root and keep it current while its Start is published."""
        tracer = tracing.TRACER
        if tracer is None:
            yield
            return
        span = tracer.start_span(
            f"{semconv.INVOKE_AGENT} {start.agent}",
            kind=SpanKind.CLIENT,
            attributes={
                semconv.GEN_AI_OPERATION_NAME: semconv.INVOKE_AGENT,
                semconv.GEN_AI_AGENT_NAME: start.agent,
                semconv.GEN_AI_PROVIDER_NAME: semconv.GEN_AI_PROVIDER,
                semconv.GEN_AI_REQUEST_MODEL: start.model,
                semconv.GEN_AI_CONVERSATION_ID: session_id,
                semconv.ENV_NAME: start.env,
                semconv.RUN_ID: start.run_id,
                semconv.TASK_INDEX: start.task_index,
                semconv.ROLLOUT_INDEX: start.rollout_index,
                semconv.ATTEMPT: start.attempt,
                semconv.OPENINFERENCE_SPAN_KIND: semconv.KIND_AGENT,
                semconv.SESSION_ID: session_id,
            },
        )
        self._open[session_id] = span
        with trace.use_span(span, end_on_exit=False):
            yield

    def finish(self, r: Result, received_at: float | None = None) -> None:
        """End the rollout's root when its Result is received."""
        span = self._open.pop(r.session_id, None)
        if span is None:
            return
        if span.is_recording():
            span.set_attributes(
                {
                    semconv.GEN_AI_USAGE_INPUT_TOKENS: r.usage.input_tokens,
                    semconv.GEN_AI_USAGE_OUTPUT_TOKENS: r.usage.output_tokens,
                }
            )
            if r.reward is not None:
                span.set_attribute(semconv.REWARD, r.reward)
            if r.failure_kind:
                span.set_attribute(semconv.ERROR_TYPE, r.failure_kind)
                span.set_attribute(semconv.FAILURE_REASON, r.failure_reason or "")
                span.set_status(Status(StatusCode.ERROR, r.failure_reason))
        span.end(end_time=_ns(received_at or time.time()))

    def abandon(self) -> None:
        """End the roots of rollouts still running when this process stops waiting for them."""
        for span in self._open.values():
            span.set_attribute(semconv.OUTCOME, "unfinished")
            span.end()
        self._open.clear()
