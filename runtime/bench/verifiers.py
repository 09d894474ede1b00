"""Per-environment verifier cost: CPU milliseconds per verify, on each environment's example tasks.

    python -m runtime.bench.verifiers [--seconds 0.5] [--json] [--markdown]

For every environment under functions/ with examples, each task is played in-process the way its
reference says (right and wrong, tools run on the seeded state), then its verifier is timed with
``time.process_time`` (CPU, not wall) over repeated calls; each play's figure is the median of its repeats, and the
table gives the median and p90 over an environment's plays (each task weighs the same). Off-loop work runs inline here
(``GYMBUS_OFFLOAD_INLINE=1``) so its CPU is counted; a judge's reply comes from the reference, so a
judged environment's figure is its own work around the model call, not the model's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker.schemas import Session, Usage
from runtime import judges
from runtime.model.client import ModelOutput
from runtime.reference import Call, Reference
from runtime.sdk import Context, Environment, Rollout, Task
from runtime.taskrows import task_of

FUNCTIONS = Path(__file__).resolve().parents[2] / "functions"

FAMILIES: dict[str, tuple[str, str]] = {
    "math": ("binary", "math_with_judge (symbolic part)"),
    "mcqa": ("binary", "mcqa"),
    "string_match": ("binary", "string_match"),
    "arc_agi": ("binary", "arc_agi"),
    "text_to_sql": ("binary", "text_to_sql, bird_sql"),
    "instruction_following": ("continuous", "instruction_following"),
    "structured_outputs": ("continuous", "structured_outputs"),
    "similarity": ("continuous", "wmt_translation"),
    "function_calling": ("continuous", "xlam_fc, single_step_tool_use_with_argument_comparison"),
    "multi_reward": ("compound", "example_tool_call_multireward"),
    "llm_judge": ("judged", "equivalence_llm_judge, math_with_judge"),
    "genrm_compare": ("judged", "genrm_compare"),
    "counter": ("stateful tools", "example_session_state_mgmt"),
    "workplace": ("stateful tools", "workplace_assistant"),
    "wordle": ("multi-step game", "wordle"),
    "blackjack": ("multi-step game", "blackjack"),
}
"""Each environment's reward family and the NeMo Gym resources servers whose rows it takes."""


def _message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


async def play(env: Environment, task: Task[Any], script: Sequence[str | tuple[Call, ...]]) -> Rollout:
    """The rollout a policy playing ``script`` leaves: its output items and the environment's state."""
    state: dict[str, Any] = {}
    ctx = Context("bench.0.0", task, state)
    if env.seed is not None:
        await env.seed(ctx)
    output: list[dict[str, Any]] = []
    for n, turn in enumerate(script):
        if isinstance(turn, str):
            output.append(_message(turn))
            continue
        for k, c in enumerate(turn):
            call_id = f"c{n}_{k}"
            output.append({"type": "function_call", "call_id": call_id, "name": c.name, "arguments": c.as_json()})
            tool = env.by_name.get(c.name) if env.agent != "one_shot" else None
            if tool is not None:
                value = await tool(ctx, c.arguments)
                text = value if isinstance(value, str) else json.dumps(value)
                output.append({"type": "function_call_output", "call_id": call_id, "output": text})
    return Rollout(output=output, state=state)


def _reference(env: Environment, task: Task[Any]) -> Reference | None:
    if env.reference is not None:
        return env.reference(task)
    answer = getattr(task.meta, "expected_answer", None)
    return Reference(right=f"\\boxed{{{answer}}}", wrong="\\boxed{-1}") if answer is not None else None


def _judge(ref: Reference, correct: bool) -> Any:
    """A judge model that answers what the reference says it answers (no model runs in the benchmark)."""

    async def respond(items: list[dict[str, Any]], params: dict[str, Any], session: Session) -> ModelOutput:
        j = ref.judge
        text = j(correct, items) if callable(j) else (j or {}).get(correct, "")
        return ModelOutput([_message(text)], Usage(input_tokens=1, output_tokens=1), {})

    return respond


async def measure(env: Environment, rows: list[dict[str, Any]], seconds: float) -> list[float]:
    """CPU ms of one verify for each play (right and wrong, of every row): the median of its repeats."""
    session = Session(
        session_id="bench.0.0",
        run_id="bench",
        task_index=0,
        agent="a",
        env=env.name,
        model="policy",
        step=1,
        phase="verify",
        params={},
    )
    costs: list[float] = []
    for i, row in enumerate(rows):
        task = task_of(env, row, i, 0)
        ref = _reference(env, task)
        if ref is None:
            continue
        for correct in (True, False):
            rollout = await play(env, task, ref.script(correct))

            judge = _judge(ref, correct)
            deadline = time.monotonic() + seconds / max(1, 2 * len(rows))
            runs: list[float] = []
            while True:
                with judges.bound(None, session) as binding:  # type: ignore[arg-type]
                    binding.respond = judge
                    t0 = time.process_time()
                    await env.verify(task, rollout)
                    runs.append((time.process_time() - t0) * 1000)
                if time.monotonic() > deadline and len(runs) >= 3:
                    break
            costs.append(statistics.median(runs))  # one figure per play: each task weighs the same
    return costs


async def run(seconds: float) -> list[dict[str, Any]]:
    from runtime.routing import catalog
    from runtime.testing import task_rows

    out = []
    for name, env in sorted(catalog().items()):
        examples = FUNCTIONS / name / "data" / "example.jsonl"
        if not examples.is_file():
            continue
        costs = await measure(env, task_rows(examples), seconds)
        if not costs:
            continue
        family, nemo = FAMILIES.get(name, ("-", "-"))
        out.append(
            {
                "env": name,
                "family": family,
                "nemo_gym": nemo,
                "plays": len(costs),
                "cpu_ms_median": round(statistics.median(costs), 4),
                "cpu_ms_p90": round(statistics.quantiles(costs, n=10)[-1], 4) if len(costs) >= 10 else None,
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m runtime.bench.verifiers", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="Timing budget per environment.")
    parser.add_argument("--json", action="store_true", help="One JSON line per environment.")
    parser.add_argument("--markdown", action="store_true", help="The README's table.")
    args = parser.parse_args(argv)
    os.environ["GYMBUS_OFFLOAD_INLINE"] = "1"
    rows = asyncio.run(run(args.seconds))
    if args.json:
        for r in rows:
            print(json.dumps(r))
    elif args.markdown:
        print("| environment | reward family | NeMo Gym counterpart | verify CPU ms, median (p90) |")
        print("| --- | --- | --- | --- |")
        for r in rows:
            p90 = f" ({r['cpu_ms_p90']:.3f})" if r["cpu_ms_p90"] is not None else ""
            print(f"| `{r['env']}` | {r['family']} | {r['nemo_gym']} | {r['cpu_ms_median']:.3f}{p90} |")
    else:
        print(f"{'environment':<24}{'family':<18}{'plays':>9}{'CPU ms p50':>12}{'p90':>10}")
        for r in rows:
            p90 = f"{r['cpu_ms_p90']:.3f}" if r["cpu_ms_p90"] is not None else "-"
            print(f"{r['env']:<24}{r['family']:<18}{r['plays']:>9}{r['cpu_ms_median']:>12.3f}{p90:>10}")


if __name__ == "__main__":
    main()
