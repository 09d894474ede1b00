"""harness_agent end to end: the example harness (tests/../examples/chat_tools.py) through a real broker,
the recording endpoint, the model tier and the simulated policy; its worker killed mid-run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import msgspec

from conftest import MATH_TASKS
from runtime.crashtest import assert_same_rewards, kill_between_steps
from runtime.model.client import register
from runtime.sdk import Environment, Reference, Rollout, Task
from runtime.testing import Harness, task_rows, wait_until

HERE = Path(__file__).resolve().parent
MCQA = HERE.parents[1] / "mcqa" / "data" / "example.jsonl"


async def run(h: Harness, rows: list[dict[str, Any]], env: str = "math", **options: Any) -> list[Any]:
    for i, row in enumerate(rows):
        await h.submit(h.start(row, agent="harness_agent", env=env, task_index=i, **options))
    return sorted(await h.results("test", len(rows), timeout=60), key=lambda r: r.task_index)


async def test_the_example_harness_is_recorded_and_verified(harness: Harness) -> None:
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("harness_agent")
    await harness.worker("math")
    for r in await run(harness, task_rows(MATH_TASKS)[:3]):
        assert r.reward == 1.0, r.failure_reason
        kinds = [i["type"] for i in r.output]
        assert kinds == ["function_call", "function_call_output", "message"], kinds  # the task's input: not again
        assert r.output[0]["name"] == "calculator" and r.output[1]["output"] == r.verifier["extracted_answer"]
        info = r.agent_info["harness"]
        assert (info["runs"], info["calls"], info["exit_code"]) == (1, 2, 0) and "restarts" not in info
        assert info["stdout"].strip().endswith(f"\\boxed{{{r.verifier['extracted_answer']}}}.")
        assert r.timings.model_calls == 2 and r.timings.tool_calls == 0 and r.usage.input_tokens > 0


async def test_responses_models_and_streaming_are_served(harness: Harness) -> None:
    await harness.simulate(MCQA, env="mcqa", accuracy=1.0)
    await harness.worker("harness_agent")
    await harness.worker("mcqa")
    command = [sys.executable, str(HERE / "api_harness.py")]
    [r] = await run(harness, task_rows(MCQA)[:1], env="mcqa", agent_options={"command": command})
    assert r.reward == 1.0, r.failure_reason
    said = [i for i in r.output if i.get("role") == "user"]
    assert [i["content"] for i in said][-1] == "Say it once more."
    # its first call put a system prompt before the task, its second left it out: both rewrote the history
    assert r.output[0]["gymbus"] == {"source": "harness", "history_rewritten": True}
    assert r.agent_info["harness"]["calls"] == 2 and r.agent_info["harness_history_rewrites"] == 2


class Meta(msgspec.Struct, frozen=True):
    expected_answer: str


async def verify_file(task: Task[Meta], rollout: Rollout) -> bool:
    return rollout.agent_info.get("files", {}).get("answer.txt", "").strip() == task.meta.expected_answer


def reference(task: Task[Meta]) -> Reference:
    return Reference(right="unused", wrong="unused")


FILES = Environment(name="files", meta=Meta, verify=verify_file, reference=reference)


async def test_files_the_harness_leaves_are_verified(harness: Harness) -> None:
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("harness_agent")
    await harness.worker(FILES)
    script = "import sys; open('answer.txt', 'w').write(sys.argv[1])"
    rows = [{"responses_create_params": {"input": "Write 42."}, "expected_answer": "42"}]
    options = {"command": [sys.executable, "-c", script, "42"], "outputs": ["answer.txt", "../escape.txt", "none"]}
    [r] = await run(harness, rows, env="files", agent_options=options)
    assert r.reward == 1.0 and r.agent_info["files"] == {"answer.txt": "42"}


async def test_a_harness_that_fails_is_a_harness_error(harness: Harness) -> None:
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("harness_agent")
    await harness.worker("math")
    script = "import sys; print('cannot go on', file=sys.stderr); sys.exit(3)"
    [r] = await run(harness, task_rows(MATH_TASKS)[:1], agent_options={"command": [sys.executable, "-c", script]})
    assert r.failure_kind == "harness_error" and r.reward is None
    assert "exited with status 3 after 0 model calls: cannot go on" in (r.failure_reason or "")


async def test_a_failing_model_ends_the_rollout_with_its_own_kind(harness: Harness) -> None:
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await register(harness.js, "policy", ["http://127.0.0.1:1/v1"], attempts=1)
    await harness.worker("harness_agent")
    await harness.worker("math")
    [r] = await run(harness, task_rows(MATH_TASKS)[:1])
    assert r.failure_kind == "model_error" and "model 'policy'" in (r.failure_reason or "")


async def test_calls_past_max_steps_stop_the_harness(harness: Harness) -> None:
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("harness_agent")
    await harness.worker("math")
    [r] = await run(harness, task_rows(MATH_TASKS)[:1], max_steps=1)
    assert r.reward == 0.0 and r.agent_info["harness"]["truncated"] and r.agent_info["harness"]["calls"] == 1


class Records:
    """The harness records of the rollouts (KV bucket ``harness``): the most calls a run has made, and
    the pids of the runs seen."""

    def __init__(self) -> None:
        self.pids: set[int] = set()

    async def calls(self, h: Harness, sids: list[str]) -> int:
        try:
            kv = await h.js.key_value("harness")
        except Exception:  # no harness has started yet
            return 0
        calls = 0
        for sid in sids:
            try:
                record = json.loads((await kv.get(sid)).value or b"{}")
            except Exception:
                continue
            self.pids.add(record["pid"])
            calls = max(calls, record.get("calls", 0))
        return calls


async def test_killed_mid_run_the_harness_is_run_again_and_says_so(harness: Harness) -> None:
    await harness.simulate(MATH_TASKS, accuracy=0.5, latency_ms=500)
    await harness.worker("math")
    rows = task_rows(MATH_TASKS)[:4]
    starts = [harness.start(row, agent="harness_agent", env="math", task_index=i) for i, row in enumerate(rows)]
    records = Records()
    clean, killed, kill = await kill_between_steps(harness, "harness_agent", starts, until=records.calls)
    assert_same_rewards(clean, killed)
    assert {r.reward for r in clean} == {0.0, 1.0}
    assert kill.held == 4  # every rollout's one long step was in the dead worker's hands
    for r in killed:
        info = r.agent_info["harness"]
        assert info["runs"] == 2 and info["calls"] == 2, info
        [lost] = info["restarts"]
        assert lost["run"] == 1 and lost["calls"] >= 0 and "worker was lost" in lost["reason"]
    assert records.pids  # the harnesses that ran when the worker was killed

    async def gone() -> bool:  # they died with it (none left running)
        return not any(_alive(pid) for pid in records.pids)

    await wait_until(gone, "the killed worker's harnesses to be gone", 10)


def _alive(pid: int) -> bool:
    """Running (a zombie no one reaped yet is dead: it runs nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z")
