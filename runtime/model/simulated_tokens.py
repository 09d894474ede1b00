"""The SIMULATED policy's token routes (not a model): what the client's token-level paths need of vLLM.

- ``POST /tokenize``: ``messages`` (+ ``tools``, ``add_generation_prompt``) rendered by a toy chat
  template (each message ``<|role|>text`` then the end-of-turn id `EOT` and a newline; tool calls
  re-rendered as sorted JSON, unlike how they are generated) and tokenized one id per byte; or a
  ``prompt`` string (``<|im_end|>`` is `EOT`).
- ``POST /v1/completions``: a token-id (or string) prompt, decoded and parsed back into the
  conversation; the answer is the simulator's decision written the Hermes way
  (``<tool_call>{json}</tool_call>``) and closed with `EOT`. Every token's logprob is a seeded draw
  from the hash of everything before it, so ``prompt_logprobs`` of a trajectory reproduce the
  logprobs of its sampled tokens, as a real model's do. One generated token with top logprobs (the
  sampling probe) gets a toy distribution processed by the request's sampling parameters, the
  simulator's ``generation_defaults`` filling in those left out; ``raw_logprobs`` mode skips that.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

if TYPE_CHECKING:
    from runtime.model.simulator import Simulator

EOT = 2
EOT_TEXT = "<|im_end|>"
OFFSET = 100
_ROLE = re.compile(r"<\|(system|user|assistant|tool|tools)\|>")
_TOY = [OFFSET + b for b in dict.fromkeys(b"Theabcdfgijklmnopqrs")][:20]


def encode(text: str) -> list[int]:
    out: list[int] = []
    for i, part in enumerate(text.split(EOT_TEXT)):
        if i:
            out.append(EOT)
        out += [OFFSET + b for b in part.encode()]
    return out


def decode(ids: list[int]) -> str:
    raw, out = bytearray(), []
    for t in ids:
        if t == EOT:
            out.append(raw.decode(errors="replace") + EOT_TEXT)
            raw = bytearray()
        elif t >= OFFSET:
            raw.append(t - OFFSET)
    return "".join(out) + raw.decode(errors="replace")


def template(messages: list[dict[str, Any]], tools: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
    from runtime.model.simulator import turn_text

    ids: list[int] = []
    if tools:
        ids += [*encode(f"<|tools|>{json.dumps(tools, sort_keys=True)}"), EOT, *encode("\n")]
    for m in messages:
        ids += [*encode(f"<|{m.get('role', 'user')}|>{turn_text(m)}"), EOT, *encode("\n")]
    return ids + (encode("<|assistant|>") if generation_prompt else [])


def conversation(text: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A rendered prompt back to (messages, tools), as far as the simulator needs them."""
    parts = _ROLE.split(text)
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    for role, body in zip(parts[1::2], parts[2::2], strict=False):
        body = body.replace(EOT_TEXT, "").rstrip("\n")
        if role == "tools":
            tools = json.loads(body)
        elif body or role != "assistant":
            messages.append({"role": role, "content": body})
    return messages, tools


def logprob(seed: int, context: bytes, token: int) -> float:
    """The simulator's logprob of ``token`` after ``context`` (a digest of the ids before it)."""
    digest = hashlib.blake2b(context + token.to_bytes(4, "big") + seed.to_bytes(8, "big"), digest_size=8).digest()
    return -3.0 * int.from_bytes(digest, "big") / 2**64


def scored(seed: int, ids: list[int]) -> list[float]:
    """Each token's logprob given the ones before it (a rolling digest: linear in the length)."""
    out, context = [], b""
    for t in ids:
        out.append(logprob(seed, context, t))
        context = hashlib.blake2b(context + t.to_bytes(4, "big"), digest_size=16).digest()
    return out


def routes(sim: Simulator) -> list[Route]:
    async def tokenize(request: Request) -> Response:
        body = await request.json()
        if "messages" in body:
            tools = body.get("tools") or []
            ids = template(body["messages"], tools, bool(body.get("add_generation_prompt", True)))
        else:
            ids = encode(str(body.get("prompt", "")))
        size = sim.config.max_prompt_tokens or 1 << 20
        return JSONResponse({"count": len(ids), "max_model_len": size, "tokens": ids})

    async def completions(request: Request) -> Response:
        fault = await sim._fault(await request.body())
        if fault is not None:
            return fault
        body = await request.json()
        prompt = body.get("prompt", "")
        ids = encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        limit = sim.config.max_prompt_tokens
        if limit and len(ids) > limit:
            message = f"This model's maximum context length is {limit} tokens. You requested {len(ids)} tokens."
            return JSONResponse({"error": {"message": message, "type": "BadRequestError", "code": 400}}, 400)
        if body.get("max_tokens") == 1 and body.get("logprobs"):
            return JSONResponse(_probe_answer(sim, body, ids))
        return JSONResponse(await _generate(sim, body, ids, request.headers.get("x-gymbus-session", "")))

    return [Route("/tokenize", tokenize, methods=["POST"]), Route("/v1/completions", completions, methods=["POST"])]


async def _generate(sim: Simulator, body: dict[str, Any], ids: list[int], session: str) -> dict[str, Any]:
    messages, tools = conversation(decode(ids))
    said = await sim.decide(messages, tools, session, str(body.get("model", "")))
    if "tools" in said:
        text = "".join(f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>" for n, a in said["tools"])
    else:
        text = said["text"]
    if sim.config.reasoning == "tags":
        text = f"<think>Let me work through this step by step.</think>{text}"
    generated = [*encode(text), EOT]
    all_scores = scored(sim.config.seed, ids + generated)
    temperature = float(_param(sim, body, "temperature", 1.0))
    processed = sim.config.logprobs_mode == "processed_logprobs" and temperature > 0
    lps = [lp / temperature if processed else lp for lp in all_scores[len(ids) :]]
    choice: dict[str, Any] = {
        "index": 0,
        "text": text + (EOT_TEXT if not body.get("skip_special_tokens", True) else ""),
        "finish_reason": "stop",
        "stop_reason": None,
        "logprobs": None,
    }
    if body.get("logprobs") is not None:
        choice["logprobs"] = {"tokens": [decode([t]) for t in generated], "token_logprobs": lps}
    if body.get("return_token_ids"):
        choice["token_ids"] = generated
    if body.get("prompt_logprobs") is not None:
        pairs = zip(ids[1:], all_scores[1 : len(ids)], strict=True)
        choice["prompt_logprobs"] = [None, *({str(t): {"logprob": lp}} for t, lp in pairs)]
    answer: dict[str, Any] = {
        "id": f"cmpl-{sim.calls}",
        "object": "text_completion",
        "model": body.get("model", sim.config.model),
        "choices": [choice],
        "usage": {"prompt_tokens": len(ids), "completion_tokens": len(generated)},
    }
    if body.get("return_token_ids"):
        answer["prompt_token_ids"] = ids
    return answer


def _param(sim: Simulator, body: dict[str, Any], name: str, neutral: Any) -> Any:
    if name in body and body[name] is not None:
        return body[name]
    return sim.config.generation_defaults.get(name, neutral)


def _probe_answer(sim: Simulator, body: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    """One token with top logprobs from a toy distribution, processed as vLLM's processed_logprobs."""
    logits = {t: -0.3 * i for i, t in enumerate(_TOY)}
    if sim.config.logprobs_mode == "processed_logprobs":
        logits = _process(sim, body, logits, set(ids))
    norm = math.log(sum(math.exp(v) for v in logits.values()))
    top = {decode([t]): v - norm for t, v in sorted(logits.items(), key=lambda kv: -kv[1])}
    first = next(iter(top))
    logprobs = {"tokens": [first], "token_logprobs": [top[first]], "top_logprobs": [top]}
    return {"choices": [{"index": 0, "text": first, "logprobs": logprobs}]}


def _process(sim: Simulator, body: dict[str, Any], logits: dict[int, float], seen: set[int]) -> dict[int, float]:
    rp = float(_param(sim, body, "repetition_penalty", 1.0))
    logits = {t: (v * rp if v < 0 else v / rp) if t in seen else v for t, v in logits.items()}
    temperature = float(_param(sim, body, "temperature", 1.0)) or 1.0
    logits = {t: v / temperature for t, v in logits.items()}
    top_k = int(_param(sim, body, "top_k", -1))
    ranked = sorted(logits.items(), key=lambda kv: -kv[1])
    if top_k > 0:
        ranked = ranked[:top_k]
    norm = math.log(sum(math.exp(v) for _, v in ranked))
    probs = [(t, math.exp(v - norm)) for t, v in ranked]
    top_p, min_p = float(_param(sim, body, "top_p", 1.0)), float(_param(sim, body, "min_p", 0.0))
    kept, total = [], 0.0
    for t, p in probs:
        if total < top_p and p >= min_p * probs[0][1]:
            kept.append(t)
        total += p
    return {t: logits[t] for t in kept}
