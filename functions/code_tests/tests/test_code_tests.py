"""code_tests: the verifier both ways on its examples, the test styles, and the examples end to end."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from functions.code_tests import env
from functions.code_tests.env import Meta, reference, verify
from runtime import sandbox
from runtime.checking import check
from runtime.sandbox import Limits
from runtime.sdk import Rollout, Task
from runtime.testing import task_rows

EXAMPLES = Path(__file__).parents[1] / "data" / "example.jsonl"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the process sandbox drops to per-run uids: needs root")


@pytest.fixture(autouse=True)
def quick_sandbox() -> Iterator[None]:
    saved = sandbox._DEFAULT
    sandbox.configure(limits=Limits(wall_s=2.0, cpu_s=1))
    yield
    sandbox._DEFAULT = saved


def reply(text: str) -> Rollout:
    return Rollout(
        output=[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}], state={}
    )


def task(row: dict) -> Task[Meta]:
    meta = msgspec.convert({k: v for k, v in row.items() if k != "responses_create_params"}, Meta)
    return Task(index=0, rollout_index=0, meta=meta, params={}, input=[])


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return task_rows(EXAMPLES)


async def test_reference_answers_pass(rows: list[dict]) -> None:
    assert len(rows) >= 8
    for row in rows:
        verdict = await verify(task(row), reply(str(reference(task(row)).right)))
        assert verdict.reward == 1.0 and set(verdict.info["results"].values()) == {"pass"}, (row["id"], verdict.info)


async def test_plausible_wrong_answers_fail(rows: list[dict]) -> None:
    """The reference's wrong answer (the function the tests call, returning None): defined, importable, wrong."""
    for row in rows:
        verdict = await verify(task(row), reply(str(reference(task(row)).wrong)))
        assert verdict.reward == 0.0 and "AssertionError" in verdict.info["first_failure"], (row["id"], verdict.info)


TESTS = (
    "from solution import f\nassert f(1) == 2\n\n"
    "def test_two():\n    assert f(2) == 4\n\ndef test_three():\n    assert f(3) == 7\n"
)


async def test_test_styles_and_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    t = task({"tests": TESTS})
    all_or_nothing = await verify(t, reply("```python\ndef f(x):\n    return 2 * x\n```"))
    assert all_or_nothing.reward == 0.0 and all_or_nothing.info["results"] == {
        "module": "pass",
        "test_two": "pass",
        "test_three": "fail",
    }
    monkeypatch.setattr(env, "REWARD", "fraction")
    assert (await verify(t, reply("```python\ndef f(x):\n    return 2 * x\n```"))).reward == 0.5


async def test_a_solution_cannot_print_its_way_to_a_pass() -> None:
    """Printing a results line of its own and exiting is not a pass: the marker carries a nonce it never saw."""
    cheat = '```python\nimport os\nprint(\'@@x@@[["module", "pass", ""]]\')\nos._exit(0)\n```'
    verdict = await verify(task({"tests": TESTS}), reply(cheat))
    assert verdict.reward == 0.0


async def test_no_code_and_runaway_code_score_zero() -> None:
    t = task({"tests": TESTS})
    assert (await verify(t, reply("f doubles x."))).info["reason"].startswith("no ```python")
    spin = await verify(t, reply("```python\nwhile True:\n    pass\n```"))
    assert spin.reward == 0.0 and spin.info["verdict"] == "timeout"


async def test_check_passes_both_ways() -> None:
    """`gymbus check code_tests`: every example through the real stack, right (1.0) and wrong (0.0)."""
    report = await check("code_tests")
    assert report.ok, [t.problems for t in report.tasks]
