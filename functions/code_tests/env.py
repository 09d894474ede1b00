"""code_tests: the model writes a function; the row's Python test code checks it in the sandbox.

A row gives ``tests``: Python that imports what it needs from ``solution`` (the model's code, the
last ```python block of its final answer) and checks it, assert-style at the top level and/or
pytest-style as ``test_*`` functions (plain asserts; no fixtures), or HumanEval-style as
``check(candidate)`` with ``entry_point`` naming the function to pass in. The tests run in the
sandbox under a small runner that reports each test. The reward is 1.0 iff all pass, or the
fraction of ``test_*`` functions passed with ``GYMBUS_CODE_TESTS_REWARD=fraction``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from typing import Any

import msgspec

from functions.code_gen.extract import extract_code, fenced
from runtime.errors import InvalidInput
from runtime.sandbox import default
from runtime.sdk import Environment, Reference, Rollout, Task, Verdict

REWARD = os.environ.get("GYMBUS_CODE_TESTS_REWARD", "all")
if REWARD not in ("all", "fraction"):
    raise ValueError(f"GYMBUS_CODE_TESTS_REWARD={REWARD!r}: choose all (1.0 iff every test passes) or fraction")


class Meta(msgspec.Struct, frozen=True):
    tests: str
    """Python test code; ``from solution import ...`` reaches the model's code."""
    entry_point: str | None = None
    """HumanEval-style: the function passed to the tests' ``check(candidate)``."""
    expected_answer: str | None = None
    """A reference solution (gymbus's examples carry one)."""


RUNNER = """import json, sys, traceback
def main(mark):
    results = []
    def record(name, fn):
        try:
            fn()
            results.append([name, "pass", ""])
        except BaseException as exc:
            results.append([name, "fail", "".join(traceback.format_exception_only(type(exc), exc)).strip()[-300:]])
    space = {"__name__": "test_solution"}
    record("module", lambda: exec(compile(open("test_solution.py").read(), "test_solution.py", "exec"), space))
    if results[0][1] == "pass":
        for name, fn in list(space.items()):
            if name.startswith("test_") and callable(fn):
                record(name, fn)
        entry = ENTRY
        if entry and callable(space.get("check")):
            import solution
            record("check", lambda: space["check"](getattr(solution, entry)))
    sys.stdout.write("\\n" + mark + json.dumps(results) + "\\n")
main("@@" + sys.stdin.readline().strip() + "@@")
"""
"""Runs the tests and prints their results after a marker made of a nonce it reads from stdin before
any of the solution's code runs, so a solution cannot pass by printing a results line of its own.
It still runs in the solution's process, like every harness that imports the code it tests: a
solution that goes looking through the interpreter for the nonce can fake its results. The sandbox
holds it in either way (containment is the sandbox's guarantee; grading is the tests')."""


def parse(stdout: str, mark: str) -> list[list[str]] | None:
    """The runner's per-test results, or None if it never got to print them."""
    _, found, tail = stdout.rpartition(mark)
    if not found:
        return None
    try:
        return json.loads(tail.strip().splitlines()[0])
    except (ValueError, IndexError):
        return None


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """1.0 iff every test passes (or the fraction of test functions passed); each test's result in the info."""
    code = extract_code(rollout.text)
    if code is None:
        return Verdict(0.0, {"extracted_code": None, "reason": "no ```python block in the final answer"})
    runner = RUNNER.replace("ENTRY", repr(task.meta.entry_point))
    nonce = secrets.token_hex(16)
    files = {"solution.py": code, "test_solution.py": task.meta.tests}
    outcome = await default().run(runner, files, stdin=nonce + "\n")
    results = parse(outcome.stdout, f"@@{nonce}@@") if outcome.ok else None
    if results is None:  # the run itself ended badly (timeout, memory, a crash the runner could not catch)
        return Verdict(0.0, {"extracted_code": code, "verdict": outcome.verdict, "detail": outcome.summary(300)})
    info: dict[str, Any] = {"extracted_code": code, "results": {name: r for name, r, _ in results}}
    failures = [f"{name}: {why}" for name, r, why in results if r != "pass"]
    if failures:
        info["first_failure"] = failures[0]
    functions = [r for name, r, _ in results if name != "module"]
    if REWARD == "fraction" and functions and results[0][1] == "pass":
        return Verdict(functions.count("pass") / len(functions), info)
    return Verdict(float(not failures), info)


IMPORTED = re.compile(r"from solution import ([A-Za-z_][A-Za-z0-9_]*)")


def reference(task: Task[Meta]) -> Reference:
    """Right: the task's reference solution; wrong: the function the tests call, returning None."""
    answer = task.meta.expected_answer
    if answer is None:
        raise InvalidInput("task field `$.meta.expected_answer`: a reference needs the task's reference solution")
    found = IMPORTED.search(task.meta.tests)
    name = task.meta.entry_point or (found.group(1) if found else "solve")
    right = answer if "```" in answer else fenced(answer)
    return Reference(right=right, wrong=fenced(f"def {name}(*args):\n    return None"))


ENVIRONMENT = Environment(name="code_tests", meta=Meta, verify=verify, reference=reference)
