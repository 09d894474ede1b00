"""Bad input at every edge reaches the user as a failed Result naming what was wrong; the run goes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.schemas import Options
from conftest import MATH_TASKS
from runtime.runs.collect import collect
from runtime.runs.config import load_config
from runtime.testing import Harness
from tests import fault_suite as fs


async def test_oversized_task_row_fails_and_the_run_goes_on(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in MATH_TASKS.read_text().splitlines()[:2]]
    rows[1]["responses_create_params"]["input"] = "x" * (9 * 2**20)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps({"input": str(tasks), "agent": "simple_agent", "env": "math", "output": str(tmp_path)}))
    summary = await collect(load_config(cfg), run_id="big", quiet=True)
    by_task = {r.task_index: r for r in summary.results.values()}
    assert by_task[0].failure_kind is None and by_task[0].reward is not None
    assert by_task[1].failure_kind == "invalid_input" and by_task[1].reward is None
    assert "task row 1 is 9.0 MiB" in (by_task[1].failure_reason or "")


async def test_transcript_outgrowing_a_message_fails_as_context_length(harness: Harness) -> None:
    """A tool returns 9 MiB: the session no longer fits one message; the rollout ends with its reason."""
    await harness.simulate(fs.MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent")
    await harness.worker(fs.FAULTS_ENV)
    await fs.submit(harness, fs.starts("huge", 2, env="faults", faults={1: "huge"}))
    results = {r.task_index: r for r in await harness.results("huge", 2)}
    assert results[0].reward == 1.0
    assert results[1].failure_kind == "context_length" and results[1].reward is None
    assert "MiB message limit" in (results[1].failure_reason or "")


def _offer(start: object, tool: dict) -> object:
    import msgspec

    params = {**start.responses_create_params, "tools": [tool]}  # type: ignore[attr-defined]
    return msgspec.structs.replace(start, responses_create_params=params)  # type: ignore[type-var]


UNKNOWN_TOOL = {"type": "function", "name": "search", "parameters": {"type": "object", "properties": {}}}
WRONG_SCHEMA = {
    "type": "function",
    "name": "calculator",
    "parameters": {"type": "object", "properties": {"expression": {"type": "number"}}, "required": ["expression"]},
}


@pytest.mark.parametrize(
    "tool,phrase",
    [(UNKNOWN_TOOL, "unknown tool 'search'"), (WRONG_SCHEMA, "$.expression")],
    ids=["unknown-tool", "schema-failing-arguments"],
)
@pytest.mark.parametrize("policy", ["return_error", "fail"])
async def test_invalid_tool_calls_follow_the_run_policy(harness: Harness, tool: dict, phrase: str, policy: str) -> None:
    """return_error: the model reads the error and the rollout goes on; fail: invalid_input naming the call."""
    await harness.simulate(fs.MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent")
    await harness.worker("math")
    [start] = fs.starts("calls", 1, invalid_tool_calls=policy)
    await harness.submit(_offer(start, tool))  # type: ignore[arg-type]
    [result] = await harness.results("calls", 1)
    if policy == "fail":
        assert result.failure_kind == "invalid_input" and result.reward is None
        assert phrase in (result.failure_reason or "") and "tool call 0" in (result.failure_reason or "")
    else:
        assert result.failure_kind is None and result.reward == 1.0
        assert phrase in result.output[1]["output"]


@pytest.mark.parametrize("retry", [None, []], ids=["default-policy", "retry-nothing"])
async def test_retry_policy_is_per_run(harness: Harness, retry: list | None) -> None:
    """tool_error is redelivered until the budget is spent by default; a run with ``retry: []`` fails at once."""
    await harness.simulate(fs.MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent")
    await harness.worker(fs.FAULTS_ENV)
    [start] = fs.starts("policy", 1, env="faults", faults={0: "tool"}, retry=retry)
    await harness.submit(start)
    [result] = await harness.results("policy", 1)
    assert result.failure_kind == "tool_error"
    gave_up = f"gave up after {harness.limits.max_deliver} deliveries"
    assert (gave_up in (result.failure_reason or "")) == (retry is None)


def test_retry_policy_is_checked_in_the_config(tmp_path: Path) -> None:
    from runtime.errors import ConfigError

    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps({"input": "x", "agent": "a", "env": "e", "limits": {"retry": ["tool_error", "oops"]}}))
    with pytest.raises(ConfigError, match=r"\$\.limits\.retry\[1\]"):
        load_config(cfg)
    cfg.write_text(json.dumps({"input": "x", "agent": "a", "env": "e", "limits": {"invalid_tool_calls": "fail"}}))
    assert load_config(cfg).limits.options() == Options(invalid_tool_calls="fail")
