"""Token-level output for training: what vLLM returns with ``return_token_ids`` and ``logprobs``.

The request asks for ``return_token_ids`` (the prompt's ids at the top level of the answer,
``prompt_token_ids``, and the generated ids in the choice, ``token_ids``) and for ``logprobs`` with
``return_tokens_as_token_ids`` (each generated token as ``"token_id:<id>"`` with its log-probability).
The ids are taken as the server returned them; decoded text is never re-tokenized. The
generated ids are cross-checked against the logprob tokens, so a server that mixes them up fails
loudly instead of producing misaligned training data.
"""

from __future__ import annotations

from typing import Any

from broker.schemas import Turn
from runtime.errors import ModelError

REQUEST_FIELDS: dict[str, Any] = {
    "return_token_ids": True,
    "logprobs": True,
    "top_logprobs": 0,
    "return_tokens_as_token_ids": True,
}
"""Added to a Chat Completions request when the rollout asks for token ids (``Options.return_token_ids``)."""

_PREFIX = "token_id:"


def turn_from_chat(resp: dict[str, Any]) -> Turn:
    """Prompt ids, generated ids and their logprobs of one Chat Completions answer."""
    choice = (resp.get("choices") or [{}])[0]
    prompt = resp.get("prompt_token_ids") or choice.get("prompt_token_ids")
    content = (choice.get("logprobs") or {}).get("content")
    if prompt is None or content is None:
        raise ModelError(
            "token ids were requested but the server returned no "
            f"{'prompt_token_ids' if prompt is None else 'logprobs'}: it needs vLLM >= 0.10.2 "
            "(return_token_ids, logprobs, return_tokens_as_token_ids)"
        )
    from_logprobs = [_token_id(c.get("token", "")) for c in content]
    generated = choice.get("token_ids")
    if generated is None:
        generated = from_logprobs
    elif list(generated) != from_logprobs:
        raise ModelError(
            f"the server's token_ids ({len(generated)}) and logprob tokens ({len(from_logprobs)}) disagree"
        )
    return Turn(
        prompt_token_ids=list(prompt),
        generation_token_ids=list(generated),
        generation_log_probs=[float(c["logprob"]) for c in content],
    )


def _token_id(token: str) -> int:
    if not token.startswith(_PREFIX):
        raise ModelError(f"logprob token {token!r} is not 'token_id:<id>' (return_tokens_as_token_ids unsupported?)")
    return int(token[len(_PREFIX) :])


def attach(items: list[dict[str, Any]], turn: Turn) -> None:
    """Put the turn's ids and logprobs on the last output item of the call (once per call, as NeMo Gym
    does); `translate.strip_training` removes them before the conversation goes back to a server."""
    if items:
        items[-1].update(
            prompt_token_ids=turn.prompt_token_ids,
            generation_token_ids=turn.generation_token_ids,
            generation_log_probs=turn.generation_log_probs,
        )


def constrained(body: dict[str, Any]) -> bool:
    """Whether a request forces its output (a grammar masks the distribution the server samples from)."""
    choice = body.get("tool_choice")
    forced_tool = choice == "required" or isinstance(choice, dict)
    fmt = ((body.get("text") or {}).get("format") or {}).get("type")
    return forced_tool or fmt in ("json_schema", "json_object")
