"""Every span name and attribute name gymbus records, in one place.

Pinned to the OpenTelemetry semantic conventions as of v1.37 (messaging and GenAI are both at
"Development" status, so names are written out here rather than imported from the incubating
``opentelemetry.semconv._incubating`` modules, whose names move between releases). Our own
attributes live under ``gymbus.``.

Span layout of one rollout (one trace):

    invoke_agent <agent>                   the rollout: submission to Result (collect)
      send gym.agent.<agent>               PRODUCER: the Start published
      process gym.<role>.<fn>[.resume]     CONSUMER: one hop (agent step, tools, verification);
                                           its wait in the stream is gymbus.queue.wait_s
        chat <model>                       CLIENT: one model call (GenAI)
          POST                             CLIENT: its HTTP request (aiohttp instrumentation)
        execute_tool <tool>                one tool call (GenAI)
        verify <env>                       the verifier
        send gym.<...>                     PRODUCER: the message this hop emits (or the Result)
"""

from __future__ import annotations

# ---- span names (operation + target) ---------------------------------------------------------------
INVOKE_AGENT = "invoke_agent"
SEND = "send"
PROCESS = "process"
QUEUE = "queue"
"""Not recorded: ``gymbus traces`` draws each hop's wait (gymbus.queue.wait_s) as a ``queue`` row."""
CHAT = "chat"
EXECUTE_TOOL = "execute_tool"
VERIFY = "verify"

# ---- messaging (semconv messaging spans) ------------------------------------------------------------
MESSAGING_SYSTEM = "messaging.system"
MESSAGING_SYSTEM_NATS = "nats"
MESSAGING_OPERATION_TYPE = "messaging.operation.type"  # send | receive | process
MESSAGING_OPERATION_NAME = "messaging.operation.name"
MESSAGING_DESTINATION_NAME = "messaging.destination.name"
MESSAGING_CONSUMER_GROUP_NAME = "messaging.consumer.group.name"
MESSAGING_MESSAGE_ID = "messaging.message.id"
MESSAGING_MESSAGE_CONVERSATION_ID = "messaging.message.conversation_id"
MESSAGING_MESSAGE_BODY_SIZE = "messaging.message.body.size"

# ---- GenAI (semconv gen-ai spans) -----------------------------------------------------------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_PROVIDER = "openai"
"""The API gymbus speaks (OpenAI-compatible HTTP), as the OpenAI instrumentation reports it for any
compatible server (vLLM, SGLang, the simulated policy); ``server.address`` on the HTTP span says which."""
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_REQUEST_STOP_SEQUENCES = "gen_ai.request.stop_sequences"
GEN_AI_REQUEST_FREQUENCY_PENALTY = "gen_ai.request.frequency_penalty"
GEN_AI_REQUEST_PRESENCE_PENALTY = "gen_ai.request.presence_penalty"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"  # opt-in: content
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"  # opt-in: content
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"  # opt-in: content
GEN_AI_TOOL_CALL_RESULT = "gen_ai.tool.call.result"  # opt-in: content

SAMPLING_ATTRIBUTES = {
    "temperature": GEN_AI_REQUEST_TEMPERATURE,
    "top_p": GEN_AI_REQUEST_TOP_P,
    "top_k": GEN_AI_REQUEST_TOP_K,
    "max_output_tokens": GEN_AI_REQUEST_MAX_TOKENS,
    "seed": GEN_AI_REQUEST_SEED,
    "stop": GEN_AI_REQUEST_STOP_SEQUENCES,
    "frequency_penalty": GEN_AI_REQUEST_FREQUENCY_PENALTY,
    "presence_penalty": GEN_AI_REQUEST_PRESENCE_PENALTY,
}
"""Responses create-body key -> the GenAI request attribute it is recorded as."""

# ---- OpenInference (what Phoenix and other GenAI-aware backends read beside the gen_ai.* names) ------
# Added, never instead of the OpenTelemetry names: a span kind per span (the rollout an agent, a model
# call an LLM, a tool call a tool, the verifier an evaluator, a hop a chain) and the rollout's session.
# Token counts, model and status such backends take from the gen_ai.* attributes and the span status.
OPENINFERENCE_SPAN_KIND = "openinference.span.kind"
SESSION_ID = "session.id"
KIND_AGENT, KIND_LLM, KIND_TOOL, KIND_EVALUATOR, KIND_CHAIN = "AGENT", "LLM", "TOOL", "EVALUATOR", "CHAIN"

# ---- general ----------------------------------------------------------------------------------------
ERROR_TYPE = "error.type"
SERVICE_NAME = "service.name"
SERVICE_INSTANCE_ID = "service.instance.id"

# ---- gymbus ----------------------------------------------------------------------------------------
RUN_ID = "gymbus.run.id"
TASK_INDEX = "gymbus.task.index"
ROLLOUT_INDEX = "gymbus.rollout.index"
ATTEMPT = "gymbus.rollout.attempt"
ENV_NAME = "gymbus.env.name"
REWARD = "gymbus.reward"
FAILURE_REASON = "gymbus.failure.reason"
MESSAGE_KIND = "gymbus.message.kind"  # start | nudge (a Start a resume sent again) | resume | seed | tools | verify
DELIVERY_COUNT = "gymbus.delivery.count"
QUEUE_WAIT = "gymbus.queue.wait_s"
"""Seconds the message waited in the stream before this hop took it (published -> received)."""
OUTCOME = "gymbus.outcome"  # ack | retry | fail
