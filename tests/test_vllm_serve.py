"""`gymbus model serve` starting real vLLM replicas (CPU build, the scripted tiny model) as Ray actors on
a local Ray cluster; rollouts through the models bucket; one replica's server killed mid-run.
Skipped without vLLM (see runtime/model/cpu_vllm.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from runtime.model import cpu_vllm as vllm_server
from runtime.testing import Harness
from tests.test_launcher import entry_when, serve_config, start_serving
from tests.test_vllm import row

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(not vllm_server.available(), reason=vllm_server.SKIP_REASON),
]


def server_pid(url: str) -> int:
    """The pid of the process listening on the port of ``url``."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return int(conn.pid)
    raise AssertionError(f"nothing listens on {url}")


async def test_model_serve_starts_vllm_on_ray_and_survives_a_killed_replica(harness: Harness, tmp_path: Path) -> None:
    """2 vLLM replicas as Ray actors are registered with processed logprobs and neutral sampling; 16
    rollouts with token ids run through the bucket; one replica's server is SIGKILLed mid-run: it is
    taken out of the entry and every rollout still ends with the scripted reward."""
    model = vllm_server.model("scripted")
    config = serve_config(
        tmp_path,
        name="policy",
        replicas=2,
        vllm={
            "model": str(model),
            "max_model_len": 1024,
            "tool_call_parser": "hermes",
            "extra_args": ["--dtype", "float32"],
        },
        host="127.0.0.1",
        cpus_per_replica=1,
        gpus_per_replica=0,
        check_interval_s=1.0,
        startup_timeout_s=900,
        env={**vllm_server.CPU_ENV, "PYTHONPATH": str(Path(__file__).parent.parent)},
        client={"attempts": 6, "reasoning": "think_tags"},
    )
    t0 = time.monotonic()
    proc = start_serving(config, harness.broker.url, tmp_path)
    try:
        entry = await entry_when(harness, lambda e: len(e.endpoints) == 2, proc, timeout=900)
        ready_s = time.monotonic() - t0
        assert entry.api == "chat" and entry.logprobs_mode == "processed_logprobs"
        assert entry.sampling == {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}

        await harness.worker("simple_agent", concurrency=16)  # no --model-url: the models bucket, watched
        await harness.worker("math")
        for i in range(16):
            await harness.submit(harness.start(row(), run_id="served", task_index=i, return_token_ids=True))
        while len(await harness.read("gym.result.served")) < 3:
            await asyncio.sleep(0.1)
        victim = entry.endpoints[0]
        os.killpg(os.getpgid(server_pid(victim)), signal.SIGKILL)  # vLLM dies; its Ray actor lives on
        results = await harness.results("served", 16, timeout=600)
        await entry_when(harness, lambda e: victim not in e.endpoints, proc, timeout=120)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=180)
        log = (tmp_path / "model-serve.log").read_text()
        print(log[-3000:])
    assert code == 0
    assert len(results) == 16 and all(r.reward == 1.0 for r in results), [r.failure_reason for r in results]
    assert {t.logprobs_mode for r in results for t in r.turns} == {"processed_logprobs"}
    assert "overrides" not in log  # --generation-config vllm: the probe finds nothing to warn about
    print(json.dumps({"model_serve_ready_s": round(ready_s, 1), "python": sys.version.split()[0]}))
