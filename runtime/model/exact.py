"""Token-exact rollouts on a stock vLLM (``Options.token_exact``): the whole rollout is one token sequence.

Chat Completions re-renders the conversation at every turn: the model's earlier output is decoded,
parsed into messages, put back through the chat template and tokenized again, so turn N's prompt does
not start with turn N-1's prompt and generation (a tool call gains newlines, a thought is dropped, a
word is split differently). Training on such per-turn ids is off-policy. Here, instead:

1. the first prompt is the chat template's rendering of the input (vLLM ``POST /tokenize`` with the
   messages, the tools and ``add_generation_prompt``);
2. each turn is generated from token ids (``POST /v1/completions`` with the ids as ``prompt``,
   ``return_token_ids`` and ``logprobs``); the text is parsed here (``<think>`` tags, Hermes
   ``<tool_call>`` JSON) into Responses items;
3. the next prompt is the previous prompt and generation, exactly, plus only what is new: the whole
   conversation is rendered and tokenized, and everything after the end-of-turn token that closes the
   model's last turn (the deployment's ``end_of_turn``) is appended. A generation that stopped
   without it (length) gets it from the template, as non-model content.

So the generated spans of the trajectory are exactly what was sampled, with the logprobs the server
returned for them. The items the trajectory covers are fingerprinted: an agent that changes them
(compaction, dropped reasoning) makes the next turn fail with ``history_changed``.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING, Any

import msgspec

from broker.schemas import Session, Trajectory, Turn
from runtime.errors import HistoryChanged, ModelError
from runtime.model import sampling, tokens, translate

if TYPE_CHECKING:
    from runtime.model.client import ModelClient
    from runtime.model.endpoints import Endpoint, Pool

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_COMPLETION_KEYS = {"max_output_tokens": "max_tokens"}


def digest(items: list[dict[str, Any]]) -> str:
    return hashlib.sha256(msgspec.json.encode(translate.strip_training(items))).hexdigest()


async def call(
    client: ModelClient, pool: Pool, body: dict[str, Any], session: Session
) -> tuple[translate.Reply, Turn, Trajectory]:
    """One token-exact turn of ``session`` on its replica (failures are model errors, not retried here:
    a new attempt of the turn would sample again)."""
    items: list[dict[str, Any]] = body["input"]
    prev = session.trajectory
    if prev is not None and (len(items) < prev.n_items or digest(items[: prev.n_items]) != prev.digest):
        raise HistoryChanged(
            f"token_exact: the first {prev.n_items} items of the conversation changed since the model's last "
            "turn (compaction or dropped reasoning?), so its token ids cannot be spliced; keep earlier items as "
            "they are, or run without token_exact"
        )
    resp, prompt, mode = await _generate(client, pool, body, session)
    choice = (resp.get("choices") or [{}])[0]
    generated = [int(t) for t in choice.get("token_ids") or []]
    logprobs = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
    echoed = resp.get("prompt_token_ids") or choice.get("prompt_token_ids")
    if echoed is not None and list(echoed) != prompt:
        raise ModelError("token_exact: the server's prompt_token_ids differ from the token ids sent")
    if len(logprobs) != len(generated):
        raise ModelError(f"token_exact: {len(generated)} generated ids but {len(logprobs)} logprobs")
    text = (choice.get("text") or "").replace(pool.entry.end_of_turn, "")
    reply = parse(text, session, choice.get("finish_reason"), len(prompt), len(generated))
    turn = Turn(
        prompt_token_ids=prompt, generation_token_ids=generated, generation_log_probs=logprobs, logprobs_mode=mode
    )
    turn.constrained = tokens.constrained(body)
    start = len(prompt)
    trajectory = Trajectory(
        token_ids=prompt + generated,
        generated=[*(prev.generated if prev else []), [start, start + len(generated)]],
        log_probs=[*(prev.log_probs if prev else []), *logprobs],
        n_items=len(items) + len(reply.items),
        digest=digest(items + reply.items),
    )
    return reply, turn, trajectory


async def _generate(
    client: ModelClient, pool: Pool, body: dict[str, Any], session: Session
) -> tuple[dict[str, Any], list[int], str]:
    """Render, splice and generate on the session's replica; a transient failure (connection, 5xx,
    timeout) is tried again on another replica, up to the deployment's attempts."""
    from runtime.model.client import _RETRIED, _describe

    entry, tried, errors = pool.entry, set[str](), list[str]()
    for _ in range(entry.attempts):
        async with pool.lease(session.session_id, tried) as ep:
            try:
                prompt = await _prompt(client, ep, pool, body, session.trajectory)
                request = _completion(body, prompt)
                resp = await client._post(ep.url, "/completions", request, session.session_id, entry.timeout_s)
                mode = await client.logprobs_mode(ep, entry, body["model"])
            except _RETRIED as exc:
                reason = _describe(exc, entry.timeout_s)
                errors.append(f"{ep.url}: {reason}")
                tried.add(ep.url)
                pool.failed(ep, reason)
                continue
        pool.succeeded(ep)
        return resp, prompt, mode
    raise ModelError(f"model {pool.model!r}: {len(errors)} attempts failed: " + "; ".join(errors))


async def _prompt(
    client: ModelClient, ep: Endpoint, pool: Pool, body: dict[str, Any], prev: Trajectory | None
) -> list[int]:
    """The turn's prompt: the first rendering, or the history's ids plus the new content spliced after
    the end-of-turn token that closes the model's last turn."""
    items = body["input"]
    full = await _tokenize(client, ep, body, items, generation_prompt=True)
    if prev is None:
        return full
    covered = await _tokenize(client, ep, body, items[: prev.n_items], generation_prompt=False)
    eot = await end_of_turn(client, ep, pool.entry.end_of_turn, body["model"])
    closing = covered.count(eot)
    positions = [i for i, t in enumerate(full) if t == eot]
    if closing == 0 or len(positions) < closing:
        raise ModelError(
            f"token_exact: the chat template's rendering has no end-of-turn token {pool.entry.end_of_turn!r} "
            "after the model's last turn (set the deployment's end_of_turn to the token that closes a turn)"
        )
    new = full[positions[closing - 1] + 1 :]
    closed = bool(prev.token_ids) and prev.token_ids[-1] == eot  # else the turn was cut (length): close it
    return prev.token_ids + (new if closed else [eot, *new])


async def _tokenize(
    client: ModelClient, ep: Endpoint, body: dict[str, Any], items: list[dict[str, Any]], generation_prompt: bool
) -> list[int]:
    messages = translate.items_to_messages(translate.strip_training(items), body.get("instructions"), "think_tags")
    request: dict[str, Any] = {
        "model": body["model"],
        "messages": messages,
        "add_generation_prompt": generation_prompt,
        "add_special_tokens": False,
    }
    if body.get("tools"):
        request["tools"] = [translate.tool_to_chat(t) for t in body["tools"]]
    if body.get("chat_template_kwargs"):
        request["chat_template_kwargs"] = body["chat_template_kwargs"]
    answer = await client._post(_root(ep.url), "/tokenize", request, "", 60.0)
    return [int(t) for t in answer["tokens"]]


async def end_of_turn(client: ModelClient, ep: Endpoint, token: str, model: str) -> int:
    """The id of the end-of-turn token on this replica (asked once per process)."""
    key = f"eot:{token}"
    if key not in ep.facts:
        import asyncio

        async def ask() -> int:
            answer = await client._post(
                _root(ep.url), "/tokenize", {"model": model, "prompt": token, "add_special_tokens": False}, "", 60.0
            )
            ids = answer["tokens"]
            if len(ids) != 1:
                raise ModelError(f"token_exact: end_of_turn {token!r} is {len(ids)} tokens of this model, not one")
            return int(ids[0])

        ep.facts[key] = asyncio.create_task(ask())
    return int(await ep.facts[key])


def _completion(body: dict[str, Any], prompt: list[int]) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model": body["model"],
        "prompt": prompt,
        "logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    for key in sampling.KEYS:
        if key in body:
            request[_COMPLETION_KEYS.get(key, key)] = body[key]
    return request


def parse(text: str, session: Session, finish: str | None, start: int, n: int) -> translate.Reply:
    """Generated text -> Responses items: ``<think>`` tags, then Hermes tool calls."""
    thought, rest = translate.split_think(text)
    items: list[dict[str, Any]] = [translate.reasoning_item(thought)] if thought else []
    calls = _TOOL_CALL.findall(rest)
    said = rest.split("<tool_call>", 1)[0].strip() if calls else rest
    if said:
        items.append(translate.message_item(said))
    for i, raw in enumerate(calls):
        try:
            call = json.loads(raw.strip())
            name, args = str(call["name"]), call.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            items.append(translate.message_item(f"<tool_call>{raw}"))  # not a call: the model's text
            continue
        arguments = args if isinstance(args, str) else json.dumps(args)
        call_id = f"call_{session.session_id}_{session.turns_taken}_{i}"
        items.append(
            {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments, "status": "completed"}
        )
    usage = {"input_tokens": start, "output_tokens": n, "total_tokens": start + n}
    reason = "tool_calls" if calls and finish == "stop" else finish
    return translate.Reply(items, usage, reason)


def _root(url: str) -> str:
    """The server root of an OpenAI base URL (vLLM's /tokenize is not under /v1)."""
    return url[: -len("/v1")] if url.endswith("/v1") else url
