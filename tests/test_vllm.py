"""The model tier against a real vLLM (CPU build) serving the tiny scripted model (runtime/model/tiny.py):
it thinks, calls the calculator twice and answers, so tool calls, reasoning and token ids are real.

One server for the module, started with the model's own generation config (``top_k: 20``,
``temperature: 0.7``, ``repetition_penalty: 1.05``: what gymbus must override and name), processed
logprobs, Hermes tool calls and 1024 tokens of context. Skipped without vLLM (see runtime/model/cpu_vllm.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from runtime.model import cpu_vllm as vllm_server
from runtime.model import sampling, tiny, translate
from runtime.model.client import register
from runtime.testing import Harness
from tests.recording_proxy import RecordingProxy

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not vllm_server.available(), reason=vllm_server.SKIP_REASON),
]

ROW = {"responses_create_params": {"input": [{"role": "user", "content": tiny.PROMPT}]}, "expected_answer": "42"}
FIGURES: dict[str, Any] = {}


def row(**params: Any) -> dict[str, Any]:
    from functions.math.env import ENVIRONMENT

    create = {**ROW["responses_create_params"], "tools": ENVIRONMENT.tool_specs(), **params}
    return {**ROW, "responses_create_params": create}


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[vllm_server.VllmServer]:
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    server = vllm_server.VllmServer(vllm_server.server_args(vllm_server.model("scripted"), "--logprobs-mode",
                                                            "processed_logprobs"), log)  # fmt: skip
    try:
        FIGURES["ready_s"] = round(server.wait_ready(), 1)
        yield server
    finally:
        server.stop()
        print(f"vLLM figures: {json.dumps(FIGURES)}")


@pytest.fixture
async def proxy(vllm: vllm_server.VllmServer) -> AsyncIterator[RecordingProxy]:
    p = RecordingProxy(vllm.root)
    await p.start()
    yield p
    await p.stop()


async def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return dict(await resp.json())


async def run_one(h: Harness, url: str, run_id: str, api: str = "auto", **options: Any) -> Any:
    await register(h.js, "policy", [url], api=api, reasoning="think_tags")
    await h.worker("simple_agent")
    await h.worker("math")
    await h.submit(h.start(row(), run_id=run_id, **options))
    [result] = await h.results(run_id, 1, timeout=300)
    return result


def assert_scripted(result: Any) -> None:
    assert result.reward == 1.0, (result.failure_kind, result.failure_reason)
    calls = [json.loads(i["arguments"])["expression"] for i in result.output if i["type"] == "function_call"]
    outputs = [i["output"] for i in result.output if i["type"] == "function_call_output"]
    thoughts = [i for i in result.output if i["type"] == "reasoning"]
    assert calls == [tiny.EXPR_1, tiny.EXPR_2] and outputs == ["42", "42"] and len(thoughts) == 3


async def test_chat_rollout_token_ids_are_what_vllm_returned(
    vllm: Any, harness: Harness, proxy: RecordingProxy
) -> None:
    """A full rollout with real tool calls over Chat Completions; each turn's prompt ids, generated ids
    and logprobs are the bytes vLLM sent, and the logprobs are the sampled distribution's."""
    result = await run_one(harness, proxy.url, "chat", api="chat", return_token_ids=True)
    assert_scripted(result)
    exchanges = proxy.on("/v1/chat/completions")
    assert len(result.turns) == 3 == len(exchanges)
    for turn, x in zip(result.turns, exchanges, strict=True):
        said = json.loads(x.response)
        content = said["choices"][0]["logprobs"]["content"]
        assert turn.prompt_token_ids == said["prompt_token_ids"]
        assert turn.generation_token_ids == said["choices"][0]["token_ids"]
        assert turn.generation_log_probs == [c["logprob"] for c in content]
        assert turn.logprobs_mode == "processed_logprobs" and not turn.constrained
        sent = json.loads(x.request)
        assert {k: sent[k] for k in sampling.NEUTRAL} == sampling.NEUTRAL  # the server's defaults never apply
    assert result.sampling == sampling.NEUTRAL


async def test_responses_rollout_gives_the_model_its_own_turns(
    vllm: Any, harness: Harness, proxy: RecordingProxy
) -> None:
    """The same rollout over /v1/responses with reasoning in think tags: the last call's prompt, as vLLM
    rendered it, holds each earlier thought as written, and equals the Chat path's rendering of the
    same conversation token for token."""
    result = await run_one(harness, proxy.url, "responses", api="responses")
    assert_scripted(result)
    last = json.loads(proxy.on("/v1/responses")[-1].request)
    shown = await post(f"{vllm.url}/responses", {**last, "max_output_tokens": 1, "enable_response_messages": True})
    rendered = shown["input_messages"][0]
    for thought in [i for i in result.output if i["type"] == "reasoning"][:2]:
        assert f"<think>{thought['summary'][0]['text']}</think>" in rendered["message"]
    chat = translate.request_to_chat(last, "think_tags")
    tokenized = await post(
        f"{vllm.root}/tokenize",
        {"model": "policy", "messages": chat["messages"], "tools": chat["tools"], "add_generation_prompt": True},
    )
    assert rendered["tokens"] == tokenized["tokens"]
    FIGURES["responses_vs_chat_prompt_tokens"] = [len(rendered["tokens"]), len(tokenized["tokens"])]


async def test_responses_is_probed_once_per_replica(vllm: Any, harness: Harness, proxy: RecordingProxy) -> None:
    """api auto against a replica without /v1/responses (hidden by the proxy): 6 rollouts start at
    once, one probe is sent, every call then goes to Chat Completions."""
    proxy.hide.add("/v1/responses")
    await register(harness.js, "policy", [proxy.url], reasoning="think_tags")
    await harness.worker("simple_agent", concurrency=16)
    await harness.worker("math")
    for i in range(6):
        await harness.submit(harness.start(row(), run_id="probe", task_index=i))
    results = await harness.results("probe", 6, timeout=300)
    assert len(results) == 6 and all(r.reward == 1.0 for r in results), [r.failure_reason for r in results]
    assert len(proxy.on("/v1/responses")) == 1 and len(proxy.on("/v1/chat/completions")) == 18


async def test_context_length_ends_the_rollout_with_its_kind(vllm: Any, harness: Harness) -> None:
    """A prompt over the server's 1024 tokens ends as context_length, with vLLM's reason."""
    await register(harness.js, "policy", [vllm.url], reasoning="think_tags")
    await harness.worker("simple_agent")
    await harness.worker("math")
    long = {"responses_create_params": {"input": "what is 6*7 " * 700}, "expected_answer": "42"}
    await harness.submit(harness.start(long, run_id="long"))
    [result] = await harness.results("long", 1, timeout=120)
    assert result.failure_kind == "context_length" and result.reward is None
    assert "1024" in (result.failure_reason or ""), result.failure_reason


async def test_sampling_overrides_are_named(vllm: Any) -> None:
    """The server applies its model's generation config to what a request leaves out: the probe names
    each parameter, and tells that the logprobs are processed."""
    async with aiohttp.ClientSession() as http:
        found = await sampling.probe(http, vllm.url, "policy")
    assert found.logprobs_mode == "processed_logprobs", found.error
    assert {"temperature", "top_k", "repetition_penalty"} <= set(found.overridden), found.overridden
    assert not {"top_p", "min_p"} & set(found.overridden)
    FIGURES["overridden"] = found.overridden


async def test_token_exact_trajectory_over_three_turns(vllm: Any, harness: Harness, tmp_path: Path) -> None:
    """token_exact: the trajectory is the first prompt, each turn's sampled ids and the tokenized
    non-model content between them; re-scoring it with prompt logprobs reproduces every sampled
    token's logprob; Chat's re-rendering of the same conversation would not have been this sequence."""
    result = await run_one(harness, vllm.url, "exact", token_exact=True)
    assert_scripted(result)
    traj = result.trajectory
    assert traj is not None and len(result.turns) == 3 == len(traj.generated)
    expected: list[int] = list(result.turns[0].prompt_token_ids)
    for i, (turn, (start, end)) in enumerate(zip(result.turns, traj.generated, strict=True)):
        assert traj.token_ids[:start] == turn.prompt_token_ids
        assert traj.token_ids[start:end] == turn.generation_token_ids
        assert len(expected) == start
        expected += turn.generation_token_ids
        if i + 1 < len(traj.generated):
            between = traj.token_ids[end : traj.generated[i + 1][0]]
            text = (await post(f"{vllm.root}/detokenize", {"model": "policy", "tokens": between}))["prompt"]
            assert "<tool_response>\n42\n</tool_response>" in text and text.rstrip().endswith("assistant")
            expected += between
    assert traj.token_ids == expected and traj.log_probs == [lp for t in result.turns for lp in t.generation_log_probs]
    rescored = await post(
        f"{vllm.url}/completions",
        {"model": "policy", "prompt": traj.token_ids, "max_tokens": 1, "prompt_logprobs": 0, **sampling.NEUTRAL},
    )
    scores = rescored["choices"][0]["prompt_logprobs"]
    diffs = []
    for (start, end), turn in zip(traj.generated, result.turns, strict=True):
        for pos, lp in zip(range(start, end), turn.generation_log_probs, strict=True):
            diffs.append(abs(scores[pos][str(traj.token_ids[pos])]["logprob"] - lp))
    assert max(diffs) < 1e-4, max(diffs)
    tools = row()["responses_create_params"]["tools"]
    chat_view = translate.request_to_chat({"input": _conversation(result), "tools": tools}, "think_tags")
    render = {"model": "policy", "messages": chat_view["messages"], "tools": chat_view["tools"]}
    rerendered = await post(f"{vllm.root}/tokenize", {**render, "add_generation_prompt": True})
    last_start = traj.generated[-1][0]
    assert rerendered["tokens"] != traj.token_ids[:last_start]  # what per-turn Chat ids would have been
    FIGURES["token_exact"] = {
        "trajectory_tokens": len(traj.token_ids),
        "generated_tokens": len(traj.log_probs),
        "turns": len(traj.generated),
        "max_abs_logprob_diff": max(diffs),
        "chat_rerender_tokens": len(rerendered["tokens"]),
        "exact_prompt_tokens": last_start,
    }


def _conversation(result: Any) -> list[dict[str, Any]]:
    """The rollout's conversation up to its last model turn (input items, then everything but the last turn)."""
    items = list(ROW["responses_create_params"]["input"])
    out = list(result.output)
    last_call = max(n for n, i in enumerate(out) if i["type"] == "function_call_output")
    return [{**i, "type": i.get("type", "message")} for i in items] + out[: last_call + 1]


async def test_grpo_example_on_the_tiny_model(vllm: Any) -> None:
    """examples/grpo_minimal.py on this server, token-exact: every rollout scores 1.0 after two real
    calculator calls; each step is generated by the version before it; the trained tokens are sampled ones."""
    from tests.test_examples import example

    steps = await example().train(steps=2, tasks=1, group_size=4, vllm=True, vllm_url=vllm.url)
    assert [s["versions"] for s in steps] == [[0], [1]]
    for s in steps:
        assert s["samples"] == 4 and s["mean_reward"] == 1.0 and s["token_exact"] and s["trained_tokens"] > 0
    FIGURES["grpo_example"] = steps


def test_tiny_models_are_built_once_per_recipe(tmp_path: Path) -> None:
    """Both tiny models build here (no hub) into a folder named by their recipe, reused as it is; the
    random one loads and generates, and shares the scripted one's tokenizer and template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    random_dir = tiny.build("random", tmp_path)
    stamp = (random_dir / "model.safetensors").stat().st_mtime_ns
    assert tiny.build("random", tmp_path) == random_dir  # reused, not rebuilt
    assert (random_dir / "model.safetensors").stat().st_mtime_ns == stamp
    assert random_dir.name == f"random-{tiny.recipe_digest('random')}"
    tok = AutoTokenizer.from_pretrained(random_dir)
    model = AutoModelForCausalLM.from_pretrained(random_dir, dtype=torch.float32)
    ids = tok.apply_chat_template([{"role": "user", "content": tiny.PROMPT}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert out.shape[1] == len(ids) + 8 and tok.chat_template == tiny.TEMPLATE
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
