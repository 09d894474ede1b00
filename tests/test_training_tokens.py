"""What a trainer gets from the model tier, against the simulated policy over real HTTP (the same
paths run against a real vLLM in tests/test_vllm.py): token-exact trajectories, the logprobs mode of
each turn, the sampling probe, thoughts sent back as written, and one /responses probe per replica."""

from __future__ import annotations

import asyncio
import json
from contextlib import ExitStack
from typing import Any

import aiohttp
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from conftest import MATH_TASKS
from runtime.model import sampling
from runtime.model.client import register
from runtime.model.serving import InThread
from runtime.model.simulated_tokens import decode
from runtime.model.simulator import SimConfig, Simulator, load_answer_key
from runtime.testing import Harness


def with_tools(row: dict[str, Any]) -> dict[str, Any]:
    from functions.math.env import ENVIRONMENT

    return {**row, "responses_create_params": {**row["responses_create_params"], "tools": ENVIRONMENT.tool_specs()}}


async def rescore(url: str, ids: list[int]) -> list[float | None]:
    """Each token's logprob given the ones before it (``prompt_logprobs``), as a trainer would recompute."""
    body = {"model": "policy", "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 1.0}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/completions", json=body) as resp:
        answer = await resp.json()
    out: list[float | None] = []
    for t, entry in zip(ids, answer["choices"][0]["prompt_logprobs"], strict=True):
        out.append(None if entry is None else float(entry[str(t)]["logprob"]))
    return out


async def test_token_exact_trajectory_is_the_turns_spliced(harness: Harness, math_rows: list[dict]) -> None:
    """A two-turn rollout with token_exact: the trajectory is the first prompt, each turn's sampled ids
    and the tokenized tool result between them; each turn's prompt is the trajectory up to its
    generation; re-scoring the trajectory reproduces every sampled token's logprob."""
    url = await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent")
    await harness.worker("math")
    await harness.submit(harness.start(with_tools(math_rows[0]), run_id="exact", token_exact=True))
    [result] = await harness.results("exact", 1)

    assert result.reward == 1.0 and len(result.turns) == 2, result.failure_reason
    traj = result.trajectory
    assert traj is not None
    t1, t2 = result.turns
    (s1, e1), (s2, e2) = traj.generated
    assert traj.token_ids[:s1] == t1.prompt_token_ids and traj.token_ids[s1:e1] == t1.generation_token_ids
    assert traj.token_ids[:s2] == t2.prompt_token_ids and traj.token_ids[s2:e2] == t2.generation_token_ids
    between = traj.token_ids[e1:s2]  # what is not the model's: the tool result and the turn markers
    assert e2 == len(traj.token_ids) and t2.prompt_token_ids[: len(t1.prompt_token_ids)] == t1.prompt_token_ids
    assert result.output[1]["type"] == "function_call_output" and result.output[1]["output"] in decode(between)
    assert traj.log_probs == t1.generation_log_probs + t2.generation_log_probs
    assert sum(traj.loss_mask()) == len(traj.log_probs)
    scores = await rescore(url, traj.token_ids)
    for (start, end), lps in zip(traj.generated, (t1.generation_log_probs, t2.generation_log_probs), strict=True):
        assert scores[start:end] == lps
    assert {t.logprobs_mode for t in result.turns} == {"processed_logprobs"}


async def test_logprobs_mode_is_recorded_per_turn(harness: Harness, math_rows: list[dict]) -> None:
    """Per-turn token ids say which logprobs they carry: probed once per replica (raw here)."""
    with ExitStack() as stack:
        sim = Simulator(load_answer_key([MATH_TASKS]), SimConfig(accuracy=1.0, logprobs_mode="raw_logprobs"))
        server = stack.enter_context(InThread(sim.app()))
        await register(harness.js, "policy", [f"{server.url}/v1"])
        await harness.worker("simple_agent")
        await harness.worker("math")
        await harness.submit(harness.start(with_tools(math_rows[0]), run_id="mode", return_token_ids=True))
        [result] = await harness.results("mode", 1)
    assert [t.logprobs_mode for t in result.turns] == ["raw_logprobs", "raw_logprobs"]
    assert not any(t.constrained for t in result.turns)


async def test_sampling_probe_names_what_a_server_overrides() -> None:
    """A server that applies its own defaults to parameters left out is named parameter by parameter;
    one that does not is clean; raw logprobs are told apart from processed ones."""
    key = load_answer_key([MATH_TASKS])
    overriding = Simulator(key, SimConfig(generation_defaults={"temperature": 0.7, "top_k": 5, "min_p": 0.2}))
    neutral = Simulator(key, SimConfig())
    raw = Simulator(key, SimConfig(logprobs_mode="raw_logprobs"))
    with InThread(overriding.app()) as a, InThread(neutral.app()) as b, InThread(raw.app()) as c:
        async with aiohttp.ClientSession() as http:
            found = await asyncio.gather(*(sampling.probe(http, f"{s.url}/v1", "policy") for s in (a, b, c)))
    assert found[0].overridden == ["temperature", "top_k", "min_p"] and found[0].logprobs_mode == "processed_logprobs"
    assert "top_k" in found[0].warnings("http://x/v1")[1]
    assert found[1].overridden == [] and found[1].logprobs_mode == "processed_logprobs"
    assert found[2].logprobs_mode == "raw_logprobs"


async def test_thoughts_go_back_over_responses_as_written(harness: Harness, math_rows: list[dict]) -> None:
    """reasoning: think_tags over /responses: the second call's input carries the first turn's thought
    inside the assistant text, as the model wrote it, not as a summary-only reasoning item."""
    with ExitStack() as stack:
        sim = Simulator(load_answer_key([MATH_TASKS]), SimConfig(accuracy=1.0, reasoning="tags"), record=True)
        server = stack.enter_context(InThread(sim.app()))
        await register(harness.js, "policy", [f"{server.url}/v1"], api="responses", reasoning="think_tags")
        await harness.worker("simple_agent")
        await harness.worker("math")
        await harness.submit(harness.start(with_tools(math_rows[0]), run_id="think"))
        [result] = await harness.results("think", 1)
    assert result.reward == 1.0 and result.output[0]["type"] == "reasoning"
    second = json.loads(sim.received[1])["input"]
    assert not any(i.get("type") == "reasoning" for i in second)
    thought = [i for i in second if i.get("role") == "assistant"]
    assert thought and thought[0]["content"][0]["text"].startswith("<think>Let me work through")


async def test_responses_is_probed_once_per_replica(harness: Harness, math_rows: list[dict]) -> None:
    """32 rollouts start at once on a replica without /responses (api auto): one probe, then Chat."""
    sim = Simulator(load_answer_key([MATH_TASKS]), SimConfig(accuracy=1.0, latency_ms=50))
    asked: list[bytes] = []

    async def no_responses(request: Request) -> JSONResponse:
        asked.append(await request.body())
        return JSONResponse({"detail": "Not Found"}, 404)

    routes = [r for r in sim.app().routes if getattr(r, "path", "") != "/v1/responses"]
    app = Starlette(routes=[*routes, Route("/v1/responses", no_responses, methods=["POST"])])
    with InThread(app) as server:
        await register(harness.js, "policy", [f"{server.url}/v1"])
        await harness.worker("simple_agent", concurrency=64)
        await harness.worker("math")
        for i in range(32):
            start = harness.start(with_tools(math_rows[i % len(math_rows)]), run_id="probe", task_index=i)
            await harness.submit(start)
        results = await harness.results("probe", 32, timeout=60)
    assert len(results) == 32 and all(r.reward == 1.0 for r in results)
    assert len(asked) == 1 and msgspec.json.decode(asked[0]) == {}


async def test_a_run_warns_about_a_server_that_overrides_sampling(caplog: Any) -> None:
    """Checking a run's model endpoint (gymbus collect/submit with model.base_url) names each parameter
    the server would override, and records it with the logprobs mode in the run's metadata."""
    from runtime.runs.models import check_endpoints

    sim = Simulator(load_answer_key([MATH_TASKS]), SimConfig(generation_defaults={"repetition_penalty": 1.1}))
    with InThread(sim.app()) as server:
        url = f"{server.url}/v1"
        checked = await check_endpoints([url], "policy")
    assert checked["sampling_overridden"] == {url: ["repetition_penalty"]}
    assert checked["logprobs_mode"] == {url: "processed_logprobs"}
    assert any("overrides repetition_penalty" in r.getMessage() for r in caplog.records)
