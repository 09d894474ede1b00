"""CPU cost of gymbus's tracing per hop, in-process (not a test; run it by hand):

    .venv/bin/python tests/bench_tracing.py           # off, sampled out, recorded to traces.jsonl

One "hop" is what a worker adds around an agent step: the CONSUMER span (and its queue sibling),
the GenAI model-call span, the PRODUCER span of the message it emits, and the outcome; the model,
NATS and the handler itself are left out, so the figure is the tracing layer alone. Spans are
exported (JSON lines to a temp file) inside the timed loop, so export cost is included.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

from broker.schemas import Session, Usage
from runtime.engine.transitions import Delivery
from runtime.model.client import ModelOutput
from runtime.telemetry import genai, spans, tracing

N = 5000
SESSION = Session(
    session_id="bench.0.0", run_id="bench", task_index=0, agent="a", env="e", model="policy", step=1, phase="model",
    params={},
)  # fmt: skip
OUTPUT = ModelOutput([{"type": "message", "content": "42"}], Usage(input_tokens=9), {}, None, "completed")


async def respond(items: object, params: object, session: object) -> ModelOutput:
    return OUTPUT


async def one_hop(model: genai.TracedModel, headers: dict[str, str]) -> None:
    now = time.time()
    d = Delivery(published_at=now - 0.001, received_at=now, headers=dict(headers))
    hop = spans.hop("gym.agent.a", "agent-a", d, 512)
    hop.message("resume", "bench.0.0")
    await model([], {"temperature": 1.0, "top_p": 1.0}, SESSION)
    with spans.sending("gym.tool.e", dict(headers), "bench.0.0:2"):
        pass
    spans.settled("ack")
    hop.end()


async def measure(headers: dict[str, str]) -> str:
    """Wall and CPU time (all threads: the exporter's too) per hop; CPU is the figure that holds on a busy box."""
    model = genai.TracedModel(respond)
    for _ in range(500):
        await one_hop(model, headers)
    tracing.flush()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(N):
        await one_hop(model, headers)
    tracing.flush()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return f"{cpu / N * 1e6:6.1f} us CPU/hop ({wall / N * 1e6:.1f} us wall)"


def main() -> None:
    print(f"tracing off (no exporter configured): {asyncio.run(measure({}))}")
    with tempfile.TemporaryDirectory() as tmp:
        tracing.configure("bench", Path(tmp) / "traces.jsonl")
        root = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}  # not sampled
        print(f"tracing on, rollout sampled out:      {asyncio.run(measure(root))}")
        sampled = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
        print(f"tracing on, recorded to traces.jsonl: {asyncio.run(measure(sampled))}")
        size = os.path.getsize(Path(tmp) / "traces.jsonl")
        print(f"traces.jsonl: {size / (N + 500):.0f} bytes/hop")


if __name__ == "__main__":
    main()
