"""compaction_agent: a tool loop whose history is compacted when it nears the model's context length.

Before each model call the prompt's size is estimated: the conversation's characters times the
tokens per character the last call measured (its ``input_tokens``). Past ``threshold`` of
``context_tokens`` the history after the task's input is compacted by the configured policy:

- ``drop_tool_outputs``: every tool output but the last ``keep_last`` is replaced by a short note;
- ``summarize``: the items before the last ``keep_last`` (never splitting a call from its output)
  are replaced by one user message holding their summary, written by the summarizer model
  (``config.summarizer``, a named model reached through the model tier) from those items as plain
  text messages.

Every compaction is recorded (``agent_info.compactions``: at which turn, by which policy, how many
items and characters, the estimated tokens before and after) and the compacted items carry
``gymbus: {"source": "compaction" | <summarizer>, ...}``. Compaction rewrites the history, so it
cannot run with ``token_exact`` (one token sequence per rollout): such a run is refused before it
starts, and a Start asking for both fails as ``invalid_input``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import msgspec

from runtime.errors import InvalidInput
from runtime.items import message_text
from runtime.sdk import Agent, AgentContext, CallTools, Finish, Fit, Model, Unfit, function_calls, mark

DROPPED = "[tool output dropped by compaction]"
SUMMARY_PROMPT = (
    "You summarize a conversation between a user and an assistant that uses tools, so that the assistant "
    "can continue the task from the summary alone: keep every fact, tool result, decision and open question "
    "it needs. Be concise."
)
ASK_NOW = {"role": "user", "content": "Write the summary of the conversation above now."}
TOKEN_EXACT = (
    "compaction rewrites the conversation, so a rollout's turns are no longer one token sequence a trainer "
    "can splice; run without token_exact, or use an agent that never rewrites history (simple_agent)"
)


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    context_tokens: Annotated[int, msgspec.Meta(ge=64)] = 32768
    """The model's context length in tokens (the model server's --max-model-len)."""
    threshold: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.75
    """Compact when the estimated prompt passes this share of ``context_tokens``."""
    policy: Literal["drop_tool_outputs", "summarize"] = "drop_tool_outputs"
    keep_last: Annotated[int, msgspec.Meta(ge=0)] = 2
    """Tool outputs (drop) or items (summarize) at the end of the history kept as they are."""
    summarizer: str = "summarizer"
    """The model that writes summaries (policy ``summarize``; a model of the run: ``models:``)."""


def models(config: Config) -> list[Model]:
    if config.policy != "summarize":
        return []
    return [Model(config.summarizer, role="summarizer", params={"temperature": 0.0})]


async def step(ctx: AgentContext) -> CallTools | Finish:
    """One turn of a tool loop, compacting the history first when it nears the context length."""
    config: Config = ctx.config
    if getattr(ctx.options, "token_exact", False):
        raise InvalidInput(f"agent 'compaction_agent' cannot run with token_exact: {TOKEN_EXACT}")
    before = estimate(ctx)
    if before > config.threshold * config.context_tokens:
        await compact(ctx, config, before)
    sent = size(ctx.items)
    output = await ctx.respond()
    if ctx.last_usage is not None and ctx.last_usage.input_tokens and sent:
        ctx.state["tokens_per_char"] = ctx.last_usage.input_tokens / sent
    calls = function_calls(output)
    if calls and ctx.turns_taken < ctx.options.max_steps:
        return CallTools(calls)
    return Finish()


def size(items: list[dict[str, Any]]) -> int:
    return len(json.dumps(items, ensure_ascii=False))


def estimate(ctx: AgentContext) -> int:
    """The next prompt's tokens: its characters at the rate the last call measured (4 per token at first)."""
    return int(size(ctx.items) * ctx.state.get("tokens_per_char", 0.25))


async def compact(ctx: AgentContext, config: Config, before: int) -> None:
    start, chars = ctx.n_input, size(ctx.items)
    if config.policy == "drop_tool_outputs":
        n = _drop(ctx.items, start, config.keep_last)
    else:
        n = await _summarize(ctx, config, start)
    if n:
        ctx.info.setdefault("compactions", []).append(
            {
                "turn": ctx.turns_taken,
                "policy": config.policy,
                "items": n,
                "chars": chars - size(ctx.items),
                "estimated_tokens": before,
                "estimated_tokens_after": estimate(ctx),
            }
        )


def _drop(items: list[dict[str, Any]], start: int, keep: int) -> int:
    outputs = [i for i in range(start, len(items)) if items[i].get("type") == "function_call_output"]
    dropped = 0
    for i in outputs[: max(0, len(outputs) - keep)]:
        if items[i].get("output") != DROPPED:
            chars = len(str(items[i].get("output", "")))
            items[i] = mark({**items[i], "output": DROPPED}, "compaction", dropped_chars=chars)
            dropped += 1
    return dropped


async def _summarize(ctx: AgentContext, config: Config, start: int) -> int:
    items = ctx.items
    cut = max(start, len(items) - config.keep_last)
    while start < cut < len(items) and items[cut].get("type") == "function_call_output":
        cut -= 1  # never keep an output without its call
    while cut > start and items[cut - 1].get("type") == "function_call":
        cut -= 1
    if cut - start < 2:
        return 0
    summarizer = models(config)[0]
    segment = as_text(items[start:cut])
    text = (await summarizer.ask([{"role": "system", "content": SUMMARY_PROMPT}, *segment, ASK_NOW])).strip()
    if not text:  # a summarizer that says nothing: keep the history as it is
        return 0
    summary = {"type": "message", "role": "user", "content": f"Summary of the conversation so far:\n{text}"}
    n = cut - start
    items[start:cut] = [mark(summary, summarizer.name, compaction=True, replaced_items=n)]
    return n


def as_text(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items as plain text messages any model server takes: a run of calls is one assistant message,
    a tool output a user message; reasoning is left out."""
    out: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "function_call":
            said = f"[called {item.get('name')}({item.get('arguments')})]"
            if out and out[-1]["role"] == "assistant" and out[-1]["content"].startswith("[called "):
                out[-1]["content"] += " " + said
            else:
                out.append({"role": "assistant", "content": said})
        elif kind == "function_call_output":
            out.append({"role": "user", "content": f"[tool output] {item.get('output')}"})
        elif kind == "message" and (text := message_text(item)):
            out.append({"role": "assistant" if item.get("role") == "assistant" else "user", "content": text})
    return out


def check(fit: Fit) -> None:
    """token_exact (a model-tier option: one token sequence per rollout) cannot survive a rewrite."""
    if getattr(fit.options, "token_exact", False):
        raise Unfit("limits.token_exact: true", TOKEN_EXACT)


AGENT = Agent(name="compaction_agent", step=step, config=Config, models=models, check=check)
