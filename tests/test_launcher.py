"""`gymbus model serve` on a real local Ray cluster (CPU), with the simulated policy as the replica
command; and, where CUDA and vLLM are present, with `vllm serve` and a small model."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import msgspec
import pytest
import yaml
from nats.js.errors import KeyNotFoundError

from broker import topology
from conftest import MATH_TASKS, ROOT
from runtime.model.endpoints import ModelEntry, entry_decoder, model_key
from runtime.runs.collect import collect
from runtime.runs.config import load_config
from runtime.runs.stack import gymbus_command
from runtime.testing import Harness


def serve_config(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump({"log_dir": str(tmp_path / "replica-logs"), **fields}))
    return path


def start_serving(config: Path, nats_url: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    log = open(tmp_path / "model-serve.log", "wb")  # the process writes it
    return subprocess.Popen(
        gymbus_command("model", "serve", str(config), "--nats", nats_url),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


async def entry_when(
    h: Harness, check: Callable[[ModelEntry], bool], proc: subprocess.Popen[bytes], timeout: float
) -> ModelEntry:
    kv = await h.js.key_value(topology.MODELS)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        assert proc.poll() is None, "gymbus model serve exited"
        try:
            entry = entry_decoder.decode((await kv.get(model_key("policy"))).value or b"{}")
        except KeyNotFoundError:
            entry = ModelEntry()
        if check(entry):
            return entry
        await asyncio.sleep(0.2)
    raise AssertionError(f"the models entry never satisfied the check within {timeout}s")


async def health(url: str) -> dict | None:
    root = url.removesuffix("/v1")
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{root}/health", timeout=aiohttp.ClientTimeout(2)) as r:
            return await r.json()
    except (aiohttp.ClientError, TimeoutError):
        return None


@pytest.mark.slow  # Ray's start-up is most of its ~40 s
async def test_model_serve_on_ray(harness: Harness, tmp_path: Path) -> None:
    """2 replicas as Ray actors get registered; a running collect is served by both through the models
    bucket; a replica whose server dies is removed, restarted and registered again on its new URL;
    SIGTERM deregisters the model and stops the replicas."""
    simulate = [sys.executable, "-m", "runtime", "simulate", "--tasks", str(MATH_TASKS), "--accuracy", "1"]
    config = serve_config(
        tmp_path,
        name="policy",
        replicas=2,
        command=[*simulate, "--host", "{host}", "--port", "{port}", "--model", "{name}", "--latency-ms", "20"],
        host="127.0.0.1",
        cpus_per_replica=0.5,
        check_interval_s=0.5,
        client={"attempts": 6},
    )
    proc = start_serving(config, harness.broker.url, tmp_path)
    try:
        entry = await entry_when(harness, lambda e: len(e.endpoints) == 2, proc, timeout=180)
        assert entry.api == "auto" and entry.attempts == 6

        await harness.worker("simple_agent")  # no --model-url: the models bucket, watched
        await harness.worker("math")
        run = tmp_path / "run.yaml"
        run_cfg = {"input": str(MATH_TASKS), "repeats": 2, "agent": "simple_agent", "env": "math"}
        run.write_text(yaml.safe_dump({**run_cfg, "output": str(tmp_path)}))
        summary = await collect(load_config(run, nats=harness.broker.url), run_id="served", quiet=True)
        assert len(summary.results) == 48 and not summary.failures, summary.failures
        assert all(r.reward == 1.0 for r in summary.results.values())
        stats = [await health(url) for url in entry.endpoints]
        assert all(s and s["calls"] > 0 for s in stats), stats

        victim = entry.endpoints[0]
        os.kill(stats[0]["pid"], signal.SIGKILL)  # the replica's server dies; its Ray actor lives on
        await entry_when(harness, lambda e: victim not in e.endpoints, proc, timeout=60)
        again = await entry_when(harness, lambda e: len(e.endpoints) == 2, proc, timeout=120)
        assert victim not in again.endpoints and entry.endpoints[1] in again.endpoints
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        print((tmp_path / "model-serve.log").read_text()[-3000:])
    assert code == 0
    kv = await harness.js.key_value(topology.MODELS)
    with pytest.raises(KeyNotFoundError):
        await kv.get(model_key("policy"))
    assert [await health(url) for url in again.endpoints] == [None, None], "replicas still running"


def _gpu_model() -> str | None:
    """The small model the GPU test serves: $GYMBUS_GPU_TEST_MODEL, or Qwen3-0.6B if it is in the local
    Hugging Face cache (tests never download weights)."""
    if os.environ.get("GYMBUS_GPU_TEST_MODEL"):
        return os.environ["GYMBUS_GPU_TEST_MODEL"]
    hub = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
    return "Qwen/Qwen3-0.6B" if (hub / "models--Qwen--Qwen3-0.6B").is_dir() else None


def _cuda() -> bool:
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs CUDA and vLLM")
@pytest.mark.skipif(_gpu_model() is None, reason="no local small model (set GYMBUS_GPU_TEST_MODEL)")
async def test_vllm_serve_on_gpu(harness: Harness, tmp_path: Path, math_rows: list[dict]) -> None:
    """One `vllm serve` replica through the launcher; a rollout with token ids gets them back."""
    config = serve_config(
        tmp_path,
        name="policy",
        replicas=1,
        vllm={"model": _gpu_model(), "max_model_len": 4096, "gpu_memory_utilization": 0.5},
        host="127.0.0.1",
    )
    proc = start_serving(config, harness.broker.url, tmp_path)
    try:
        await entry_when(harness, lambda e: len(e.endpoints) == 1, proc, timeout=900)
        await harness.worker("simple_agent")
        await harness.worker("math")
        params = {**math_rows[0]["responses_create_params"], "max_output_tokens": 256}
        row = {**math_rows[0], "responses_create_params": params}
        await harness.submit(harness.start(row, run_id="gpu", return_token_ids=True, step_timeout_s=300))
        [result] = await harness.results("gpu", 1, timeout=600)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=180)
    assert result.failure_kind is None, result.failure_reason
    assert result.turns and result.turns[0].prompt_token_ids and result.turns[0].generation_token_ids
    assert len(result.turns[0].generation_token_ids) == len(result.turns[0].generation_log_probs)
    assert json.loads(msgspec.json.encode(result))["sampling"]["top_k"] == -1


def test_vllm_command_and_client_settings_from_the_shipped_config() -> None:
    from runtime.model.launcher import client_settings, gpus, load_serve_config, vllm_command

    cfg = load_serve_config(ROOT / "configs" / "model-serve.yaml")
    cmd = " ".join(vllm_command(cfg))
    assert cmd.startswith("{python} -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-0.6B --host {host}")
    for flag in ("--tensor-parallel-size 1", "--generation-config vllm", "--max-model-len 8192"):
        assert flag in cmd
    assert "--logprobs-mode processed_logprobs" in cmd and "--served-model-name {name}" in cmd
    assert "--enable-auto-tool-choice --tool-call-parser hermes" in cmd and "--reasoning-parser" not in cmd
    settings = client_settings(cfg)
    assert settings["api"] == "chat" and settings["reasoning"] == "think_tags"  # one layer: gymbus parses
    assert settings["sampling"] == {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
    assert settings["logprobs_mode"] == "processed_logprobs"  # recorded with every turn's logprobs
    assert gpus(cfg) == 1
    with_parser = msgspec.structs.replace(cfg, vllm=msgspec.structs.replace(cfg.vllm, reasoning_parser="qwen3"))
    assert client_settings(with_parser)["reasoning"] == "server"  # one layer: vLLM parses


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"vllm": {"model": "m"}, "command": ["x"]}, "exactly one of `vllm`"),
        ({}, "exactly one of `vllm`"),
        ({"command": ["x"], "replica": 2}, "unknown field `replica`"),
        ({"vllm": {"model": "m", "tensor_parallel_size": 0}}, "`$.vllm.tensor_parallel_size`"),
    ],
)
def test_model_serve_rejects_bad_configs(tmp_path: Path, fields: dict, message: str) -> None:
    from typer.testing import CliRunner

    from runtime.cli import app

    result = CliRunner().invoke(app, ["model", "serve", str(serve_config(tmp_path, **fields)), "--nats", "nats://x"])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
