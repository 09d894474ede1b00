"""math_with_code: the python tool, the verifier both ways, and the examples end to end with tool calls."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from functions.math_with_code.env import ENVIRONMENT, reference
from runtime.checking import check
from runtime.errors import SandboxError
from runtime.sandbox import Sandbox, SandboxConfig, tool
from runtime.sandbox.tool import python
from runtime.sdk import Rollout, Task, Verdict
from runtime.testing import Harness, task_rows

EXAMPLES = Path(__file__).parents[1] / "data" / "example.jsonl"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the process sandbox drops to per-run uids: needs root")


def reply(text: str) -> Rollout:
    return Rollout(
        output=[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}], state={}
    )


def task(row: dict) -> Task:
    meta = msgspec.convert({k: v for k, v in row.items() if k != "responses_create_params"}, ENVIRONMENT.meta)
    return Task(index=0, rollout_index=0, meta=meta, params={}, input=[])


async def test_the_python_tool() -> None:
    assert await python("print(sum(range(10)))") == "45\n"
    assert (await python("x = 1")).startswith("(no output")
    failed = await python("print('partial')\n1/0")
    assert failed.startswith("partial\nerror: exit status 1") and "ZeroDivisionError" in failed
    assert "characters cut" in await python("print('z' * 10000)")
    assert ENVIRONMENT.tool_specs()[0]["parameters"]["required"] == ["code"]


async def test_a_broken_sandbox_is_not_tool_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """An outage fails the rollout (sandbox_error, retried); the model never reads it as its own mistake."""
    monkeypatch.setattr(tool, "default", lambda: Sandbox(SandboxConfig(python="/nonexistent/python3")))
    with pytest.raises(SandboxError):
        await python("print(1)")


async def score(t: Task, r: Rollout) -> float:
    verdict = await ENVIRONMENT.verify(t, r)
    return verdict.reward if isinstance(verdict, Verdict) else verdict


async def test_verifier_both_ways() -> None:
    rows = task_rows(EXAMPLES)
    assert len(rows) >= 8
    for row in rows:
        said = [turn for turn in reference(task(row)).script(True) if isinstance(turn, str)]
        right = await score(task(row), reply(said[-1]))
        wrong = await score(task(row), reply(f"\\boxed{{{int(row['expected_answer']) + 1}}}"))
        assert (right, wrong) == (1.0, 0.0), row


async def test_check_passes_both_ways() -> None:
    """`gymbus check math_with_code`: each example plays python, then answers; right 1.0, wrong 0.0."""
    report = await check("math_with_code")
    assert report.ok, [t.problems for t in report.tasks]


async def test_examples_end_to_end_with_the_tool(harness: Harness) -> None:
    """The simulated policy calls the python tool first, then answers; every example scores 1.0."""
    rows = task_rows(EXAMPLES)
    await harness.simulate(EXAMPLES, accuracy=1.0)
    await harness.worker("simple_agent")
    await harness.worker("math_with_code")
    tools = ENVIRONMENT.tool_specs()
    for i, row in enumerate(rows):
        row = {**row, "responses_create_params": {**row["responses_create_params"], "tools": tools}}
        await harness.submit(harness.start(row, run_id="examples", task_index=i, env="math_with_code"))
    results = await harness.results("examples", len(rows), timeout=90)
    assert all(r.reward == 1.0 for r in results), [(r.task_index, r.failure_reason) for r in results]
    assert all(r.timings.tool_calls == 1 for r in results)
    outputs = [i["output"] for r in results for i in r.output if i.get("type") == "function_call_output"]
    assert len(outputs) == len(rows) and all(o.startswith("(no output") for o in outputs)  # it ran the code "76127"
