"""Sampling parameters: every one that decides the distribution is sent, and what a server does with
the ones it is not sent is checked.

A vLLM server applies the model's ``generation_config.json`` to every parameter a request leaves out
(unless it runs with ``--generation-config vllm``), so a rollout recorded as "temperature 1.0" may have
been sampled with ``top_k: 20``. gymbus therefore sends `NEUTRAL` values for every parameter unless
the deployment or the task sets one (``None`` there means: do not send it, for servers that reject
vLLM's extensions), and records what it sent in each Result's ``sampling``.

`probe` asks a server what it does with a parameter left out, using ``/v1/completions`` with one
generated token and its top logprobs: a request with every parameter explicit is the reference, and
a request leaving one out that answers differently names that parameter as overridden by the server.
The same probe tells which logprobs the server returns: if halving the temperature changes nothing,
they are raw (the model's), else processed (the distribution sampled from). Presence and frequency
penalties count generated tokens only, so a one-token probe cannot see them; they are sent anyway.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import aiohttp

log = logging.getLogger("gymbus.sampling")

NEUTRAL: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
"""Sent unless the deployment or the task says otherwise: the distribution is the model's own."""

KEYS = (*NEUTRAL, "max_output_tokens", "seed", "stop")
"""Request fields that are sampling parameters (recorded in the Result's ``sampling``)."""

PROBED = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
"""What a one-token probe can tell apart (penalties on generated tokens need more than one)."""
PROBE_PROMPT = "The"
PROBE_TOP = 20
_TOLERANCE = 1e-4


def resolve(deployment: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """What one call sends: `NEUTRAL`, then the deployment's defaults, then the task's own values; a
    ``None`` removes a parameter (not sent)."""
    merged = {**NEUTRAL, **deployment, **{k: params[k] for k in KEYS if k in params}}
    return {k: v for k, v in merged.items() if v is not None}


@dataclass
class Probe:
    """What a server does with parameters a request leaves out, and which logprobs it returns."""

    logprobs_mode: str = ""
    """``processed_logprobs``, ``raw_logprobs``, or "" when the server could not be probed."""
    overridden: list[str] = field(default_factory=list)
    """Parameters whose server default is not the neutral value."""
    error: str = ""

    def warnings(self, url: str) -> list[str]:
        return [
            f"model endpoint {url} overrides {name} when a request leaves it out (its generation config; "
            f"run vLLM with --generation-config vllm): gymbus sends {name}={NEUTRAL[name]!r} unless told otherwise"
            for name in self.overridden
        ]


async def probe(http: aiohttp.ClientSession, url: str, model: str, timeout_s: float = 30.0) -> Probe:
    """Probe the server at ``url`` (an OpenAI base URL); a server without ``/completions`` or logprobs
    gives an empty probe with its ``error``."""
    try:
        reference = await _top(http, url, model, dict(NEUTRAL), timeout_s)
        cooler = await _top(http, url, model, {**NEUTRAL, "temperature": 0.5}, timeout_s)
        overridden = []
        for name in PROBED:
            sent = {k: v for k, v in NEUTRAL.items() if k != name}
            if not _same(reference, await _top(http, url, model, sent, timeout_s)):
                overridden.append(name)
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError, IndexError) as exc:
        return Probe(error=f"{type(exc).__name__}: {exc}")
    mode = "raw_logprobs" if _same(reference, cooler) else "processed_logprobs"
    if mode == "raw_logprobs":
        overridden = [n for n in overridden if n == "repetition_penalty"]  # raw logprobs show no other
    return Probe(logprobs_mode=mode, overridden=overridden)


async def logprobs_mode(
    http: aiohttp.ClientSession, url: str, model: str, timeout_s: float = 30.0, headers: dict[str, str] | None = None
) -> str:
    """Which logprobs the server returns (two requests, with ``headers``), or "" if it cannot be told."""
    try:
        reference = await _top(http, url, model, dict(NEUTRAL), timeout_s, headers)
        cooler = await _top(http, url, model, {**NEUTRAL, "temperature": 0.5}, timeout_s, headers)
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError, IndexError):
        return ""
    return "raw_logprobs" if _same(reference, cooler) else "processed_logprobs"


async def _top(
    http: aiohttp.ClientSession,
    url: str,
    model: str,
    sampling: dict[str, Any],
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> dict[str, float]:
    body = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "logprobs": PROBE_TOP, "seed": 0, **sampling}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with http.post(f"{url}/completions", json=body, timeout=timeout, headers=headers) as resp:
        if resp.status != 200:
            raise ValueError(f"POST {url}/completions answered HTTP {resp.status}")
        answer = await resp.json()
    top = answer["choices"][0]["logprobs"]["top_logprobs"][0]
    return {str(k): float(v) for k, v in top.items() if v is not None and math.isfinite(float(v))}


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    """Equal top logprobs: the same tokens (top-k cuts change the set) and values within tolerance."""
    if set(a) != set(b):
        return False
    return all(abs(a[k] - b[k]) <= _TOLERANCE for k in a)
