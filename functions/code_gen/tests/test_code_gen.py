"""code_gen: the verifier both ways on its examples, NeMo Gym's row shape, and the examples end to end."""

from __future__ import annotations

import base64
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from broker import topology
from functions.code_gen import env
from functions.code_gen.env import Meta, reference, verify
from runtime import sandbox
from runtime.checking import check
from runtime.errors import InvalidInput
from runtime.sandbox import Limits
from runtime.sdk import Rollout, Task
from runtime.testing import Harness, task_rows

EXAMPLES = Path(__file__).parents[1] / "data" / "example.jsonl"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the process sandbox drops to per-run uids: needs root")


def reply(text: str) -> Rollout:
    return Rollout(
        output=[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}], state={}
    )


def task(row: dict) -> Task[Meta]:
    meta = msgspec.convert({k: v for k, v in row.items() if k != "responses_create_params"}, Meta)
    return Task(index=0, rollout_index=0, meta=meta, params={}, input=[])


@pytest.fixture(autouse=True)
def quick_sandbox() -> Iterator[None]:
    """The process sandbox with a 2 s wall clock and 1 s of CPU, so the timeout checks are quick."""
    saved = sandbox._DEFAULT
    sandbox.configure(limits=Limits(wall_s=2.0, cpu_s=1))
    yield
    sandbox._DEFAULT = saved


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return task_rows(EXAMPLES)


async def test_reference_answers_pass_every_test(rows: list[dict]) -> None:
    assert len(rows) >= 8
    for row in rows:
        verdict = await verify(task(row), reply(str(reference(task(row)).right)))
        tests = len(row["verifier_metadata"]["unit_tests"]["inputs"])
        assert (verdict.reward, verdict.info["passed"]) == (1.0, tests), (row["id"], verdict.info)


async def test_plausible_wrong_answers_score_zero(rows: list[dict]) -> None:
    echo = "```python\nimport sys\nprint(sys.stdin.read().split()[0])\n```"
    call = (
        "```python\ndef add(a, b):\n    return a - b\n"
        "class Solution:\n    def longest(self, words):\n        return min(words, key=len)\n```"
    )
    for row in rows:
        wrong = call if row["verifier_metadata"]["unit_tests"].get("fn_name") else echo
        verdict = await verify(task(row), reply(wrong))
        assert verdict.reward == 0.0 and verdict.info["first_failure"]["result"] in ("wrong", "error"), (
            row["id"],
            verdict.info,
        )


async def test_no_code_and_crashes_are_zero_with_the_reason(rows: list[dict]) -> None:
    none = await verify(task(rows[0]), reply("The sum is the sum."))
    assert none.reward == 0.0 and none.info["reason"].startswith("no ```python block")
    crash = await verify(task(rows[0]), reply("```python\nraise ValueError('nope')\n```"))
    assert crash.reward == 0.0 and "ValueError: nope" in crash.info["first_failure"]["detail"]
    slow = await verify(task(rows[0]), reply("```python\nwhile True: pass\n```"))
    assert slow.info["first_failure"]["result"] == "timeout"


async def test_fraction_mode(rows: list[dict], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env, "REWARD", "fraction")
    verdict = await verify(task(rows[0]), reply("```python\nprint(6)\n```"))  # right for test 0 only
    assert verdict.reward == pytest.approx(1 / 3) and verdict.info["results"] == ["pass", "wrong", "wrong"]


async def test_nemo_gym_rows_are_accepted_unchanged() -> None:
    """The shape of NeMo Gym's code_gen rows (extra fields, fn_name null), and its packed form."""
    tests = {"inputs": ["2 3\n"], "outputs": ["5\n"], "fn_name": None}
    row = {"verifier_metadata": {"unit_tests": tests}, "hash_id": "x", "dataset": "d", "source": "s"}
    packed = base64.b64encode(zlib.compress(json.dumps(tests).encode())).decode()
    program = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    for r in (row, {"verifier_metadata": {"unit_tests": {"packed": packed, "fn_name": None}}}):
        assert (await verify(task(r), reply(program))).reward == 1.0


async def test_mismatched_tests_name_the_field() -> None:
    bad = {"verifier_metadata": {"unit_tests": {"inputs": ["1"], "outputs": []}}}
    with pytest.raises(InvalidInput, match=r"unit_tests`: 1 inputs and 0 outputs"):
        await verify(task(bad), reply("```python\nprint(1)\n```"))


async def test_check_passes_both_ways() -> None:
    """`gymbus check code_gen`: every example through the real stack, the reference right (1.0) and wrong (0.0)."""
    report = await check("code_gen")
    assert report.ok, [t.problems for t in report.tasks]


async def test_hostile_code_end_to_end(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Code that hunts for the model API key and the host's files scores 0; the key is in no Result."""
    canary = "sk-canary-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", canary)
    hostile = "import os\nprint(dict(os.environ), open('/etc/passwd').read())"
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": "Print the environment."}]},
        "verifier_metadata": {"unit_tests": {"inputs": [""], "outputs": [canary]}},
        "expected_answer": f"```python\n{hostile}\n```",
    }
    tasks = tmp_path / "hostile.jsonl"
    tasks.write_text(json.dumps(row) + "\n")
    await harness.simulate(tasks, accuracy=1.0)
    await harness.worker("simple_agent")
    await harness.worker("code_gen")
    await harness.submit(harness.start(row, run_id="hostile", env="code_gen"))
    [result] = await harness.results("hostile", 1, timeout=60)
    assert result.reward == 0.0 and result.verifier["first_failure"]["result"] == "error", result
    stored = await harness.read(topology.result_subject("hostile"))
    assert stored and all(canary.encode() not in msgspec.json.encode(r) for r in stored)
    assert canary not in caplog.text
