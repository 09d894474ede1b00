"""code_gen: competitive programming. The reply's program runs against the row's unit tests in the sandbox.

Rows are NeMo Gym's code_gen rows, accepted unchanged: ``verifier_metadata.unit_tests`` holds
``inputs`` and ``outputs`` (stdin and the expected stdout of each test; or, with ``fn_name``, one
JSON argument per input line and the JSON result), or NeMo Gym's compressed ``packed`` form. The
program is the last ```python block of the final answer. Outputs are compared line by line, trailing
whitespace ignored. The reward is 1.0 iff every test passes, or the fraction passed with
``GYMBUS_CODE_GEN_REWARD=fraction``; the verifier info lists each test's result.

A test the program fails (wrong output, crash, timeout, memory, too much output) is a verdict; a
sandbox that cannot run it fails the rollout with ``sandbox_error`` (retried), never a reward.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import zlib
from typing import Any

import msgspec

from functions.code_gen.extract import extract_code, fenced
from runtime.errors import InvalidInput
from runtime.sandbox import Outcome, default
from runtime.sdk import Environment, Reference, Rollout, Task, Verdict

REWARD_MODES = ("all", "fraction")
REWARD = os.environ.get("GYMBUS_CODE_GEN_REWARD", "all")
if REWARD not in REWARD_MODES:
    raise ValueError(f"GYMBUS_CODE_GEN_REWARD={REWARD!r}: choose all (1.0 iff every test passes) or fraction")


class UnitTests(msgspec.Struct, frozen=True):
    inputs: list[str] = []
    outputs: list[str] = []
    fn_name: str | None = None
    """Call-based tests: call this function (or ``Solution().<fn_name>``) with one JSON argument per input line."""
    packed: str | None = None
    """NeMo Gym's compressed form: base64 of zlib of {"inputs": [...], "outputs": [...]}."""


class VerifierMetadata(msgspec.Struct, frozen=True):
    unit_tests: UnitTests


class Meta(msgspec.Struct, frozen=True):
    verifier_metadata: VerifierMetadata
    expected_answer: str | None = None
    """A reference solution (gymbus's examples carry one; NeMo Gym's rows need none)."""


CALL_HARNESS = """import json, sys
import solution
args = [json.loads(line) for line in sys.stdin.read().splitlines() if line.strip()]
target = getattr(solution.Solution(), {name!r}) if hasattr(solution, "Solution") else getattr(solution, {name!r})
print(json.dumps(target(*args)))
"""


def tests_of(meta: Meta) -> UnitTests:
    tests = meta.verifier_metadata.unit_tests
    if tests.packed is not None:
        try:
            unpacked = json.loads(zlib.decompress(base64.b64decode(tests.packed)))
            tests = UnitTests(unpacked["inputs"], unpacked["outputs"], tests.fn_name)
        except (ValueError, KeyError, TypeError, zlib.error) as exc:
            raise InvalidInput(
                f"task field `$.meta.verifier_metadata.unit_tests.packed` cannot be unpacked: {exc}"
            ) from None
    if len(tests.inputs) != len(tests.outputs) or not tests.inputs:
        raise InvalidInput(
            f"task field `$.meta.verifier_metadata.unit_tests`: {len(tests.inputs)} inputs and "
            f"{len(tests.outputs)} outputs; give one expected output per input (at least one)"
        )
    return tests


def same_output(got: str, expected: str, call_based: bool) -> bool:
    if call_based:
        try:
            return json.loads(got.strip().splitlines()[-1]) == json.loads(expected)
        except (ValueError, IndexError):
            return got.strip() == expected.strip()
    return _lines(got) == _lines(expected)


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.strip("\n").splitlines()]
    return lines


async def _check(code: str, tests: UnitTests, i: int) -> tuple[str, Outcome]:
    """One test: ``pass``, ``wrong``, or the sandbox verdict that stopped the program."""
    if tests.fn_name:
        files = {"solution.py": code}
        outcome = await default().run(CALL_HARNESS.format(name=tests.fn_name), files, stdin=tests.inputs[i])
    else:
        outcome = await default().run(code, stdin=tests.inputs[i])
    if not outcome.ok:
        return outcome.verdict, outcome
    return ("pass" if same_output(outcome.stdout, tests.outputs[i], bool(tests.fn_name)) else "wrong"), outcome


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """1.0 iff the program passes every unit test (or the fraction passed); per-test results in the info."""
    tests = tests_of(task.meta)
    code = extract_code(rollout.text)
    if code is None:
        return Verdict(0.0, {"extracted_code": None, "reason": "no ```python block in the final answer"})
    n = len(tests.inputs)
    if REWARD == "fraction":
        checked = await asyncio.gather(*(_check(code, tests, i) for i in range(n)))
    else:
        checked = []
        for i in range(n):  # all-or-nothing: the first failure decides
            checked.append(await _check(code, tests, i))
            if checked[-1][0] != "pass":
                break
    results = [r for r, _ in checked]
    passed = results.count("pass")
    info: dict[str, Any] = {"extracted_code": code, "tests": n, "passed": passed, "results": results[:200]}
    failed = next(((i, o) for i, (r, o) in enumerate(checked) if r != "pass"), None)
    if failed is not None:
        i, outcome = failed
        info["first_failure"] = {"test": i, "result": results[i], "detail": outcome.summary(300)}
    reward = passed / n if REWARD == "fraction" else float(passed == n)
    return Verdict(reward, info)


def reference(task: Task[Meta]) -> Reference:
    """Right: the task's reference solution; wrong: a program that runs but echoes its input's first
    token (call-based: the function, returning None)."""
    answer = task.meta.expected_answer
    if answer is None:
        raise InvalidInput("task field `$.meta.expected_answer`: a reference needs the task's reference solution")
    fn = task.meta.verifier_metadata.unit_tests.fn_name
    wrong = (
        f"def {fn}(*args):\n    return None\nclass Solution:\n    def {fn}(self, *args):\n        return None"
        if fn
        else "import sys\nprint(sys.stdin.read().split()[0])"
    )
    right = answer if "```" in answer else fenced(answer)
    return Reference(right=f"Here is my program:\n{right}", wrong=f"Here is my program:\n{fenced(wrong)}")


ENVIRONMENT = Environment(name="code_gen", meta=Meta, verify=verify, reference=reference, accepts=["code_gen"])
