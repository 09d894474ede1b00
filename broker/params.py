"""The Responses create body a Start carries (``responses_create_params``), and the sampling parameters.

A Start keeps the body as a plain object (it passes to the model as it is, minus ``input``), and the
agent worker checks it against `CreateParams` before any model call, so a typo (``temprature``) or a
value of the wrong type fails at once with its path. The fields are those of the OpenAI Responses
API's create body, plus the sampling parameters vLLM adds (`Sampling`); ``null`` means "not set"
everywhere (rows exported from the OpenAI SDK carry every field, most of them null). Inside
``input`` items and ``tools`` entries any other key is allowed, as the Responses API allows it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

NonNegative = Annotated[float, Meta(ge=0)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]
Fraction = Annotated[float, Meta(ge=0, le=1)]


class Sampling(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """Sampling parameters: every one gymbus sends explicitly (the server's generation config never applies)."""

    temperature: NonNegative | None = None
    """Sampling temperature."""
    top_p: Fraction | None = None
    """Nucleus sampling: the smallest set of tokens whose probability adds up to this."""
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    """Most tokens the model may generate in one call."""
    top_k: int | None = None
    """Sample among the k most likely tokens (vLLM; -1 or 0: all)."""
    min_p: Fraction | None = None
    """Drop tokens less likely than this fraction of the most likely one (vLLM)."""
    seed: int | None = None
    """Sampling seed (vLLM)."""
    stop: str | list[str] | None = None
    """Stop generating at any of these strings (vLLM)."""
    frequency_penalty: Penalty | None = None
    """Penalise tokens by how often they appeared so far (vLLM)."""
    presence_penalty: Penalty | None = None
    """Penalise tokens that appeared so far (vLLM)."""
    repetition_penalty: Annotated[float, Meta(gt=0)] | None = None
    """Multiplicative penalty on repeated tokens (vLLM; 1 is none)."""

    def given(self) -> dict[str, Any]:
        """The parameters that are set."""
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}


class InputItem(msgspec.Struct, kw_only=True):
    """A Responses input item: a message (``role`` and ``content``), a ``function_call``, a
    ``function_call_output``, a ``reasoning`` item, ... Other keys are the item type's own."""

    type: str | None = None
    """The item type; a message may leave it out and give its ``role``."""
    role: str | None = None
    """A message's author: ``user``, ``system``, ``developer`` or ``assistant``."""


class ToolSpec(msgspec.Struct, kw_only=True):
    """A tool the model may call: a function tool is ``type: function`` with ``name``, ``description``
    and its ``parameters`` as a JSON Schema. Other keys are the tool type's own."""

    type: str
    """``function`` for a function tool."""
    name: str | None = None
    """The function's name."""
    description: str | None = None
    """What the function does, for the model."""
    parameters: dict[str, Any] | None = None
    """The function's arguments, as a JSON Schema object."""


class CreateParams(Sampling, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An OpenAI Responses create body: ``input`` (a string, or items), ``tools``, sampling parameters.
    A field gymbus cannot honour (streaming, server-side conversation state) must be null or false."""

    input: str | list[InputItem]
    """The prompt: a string (one user message), or Responses input items."""
    instructions: str | None = None
    """A system (developer) message put before the input."""
    tools: list[ToolSpec] | None = None
    """Tools offered to the model. Left out, the environment's tools are offered (unless the run's
    defaults say ``env_tools: false``); ``[]`` offers none."""
    tool_choice: str | dict[str, Any] | None = None
    """``auto``, ``none``, ``required``, or a specific tool."""
    parallel_tool_calls: bool | None = None
    """Whether the model may call several tools in one turn."""
    max_tool_calls: Annotated[int, Meta(ge=1)] | None = None
    """Most tool calls in one response."""
    text: dict[str, Any] | None = None
    """Text output options, e.g. ``{"format": {"type": "json_schema", ...}}``."""
    reasoning: dict[str, Any] | None = None
    """Reasoning options, e.g. ``{"effort": "high"}``."""
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    """Most likely tokens to return at each position."""
    include: list[str] | None = None
    """Extra output data to include."""
    truncation: Literal["auto", "disabled"] | None = None
    """What the server does when the input exceeds the context window."""
    metadata: dict[str, Any] | None = None
    """Key-value pairs attached to the request."""
    model: str | None = None
    """The served model name to ask for (else the Start's ``model``)."""
    user: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    moderation: Any = None
    context_management: Any = None
    store: bool | None = None
    """Ignored: gymbus never asks the server to store a response."""
    stream: Literal[False] | None = None
    """gymbus reads whole responses: false or null."""
    stream_options: dict[str, Any] | None = None
    background: Literal[False] | None = None
    """gymbus waits for each response: false or null."""
    previous_response_id: None = None
    """gymbus keeps the conversation itself: null."""
    conversation: None = None
    """gymbus keeps the conversation itself: null."""
    prompt: None = None
    """Stored prompt templates are not supported: null."""


SAMPLING_FIELDS = frozenset(Sampling.__struct_fields__)
