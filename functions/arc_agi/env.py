"""arc_agi: ARC grids; the reward is 1.0 iff the model's output grid equals ``expected_output`` exactly.

The grid is read from the last ``\\boxed{[[...], ...]}`` in the reply, else from its last bare
``[[...]]``: a JSON list of rows of integers 0-9. A reply with no grid, one that is not valid JSON,
or one that is not rectangular is a wrong answer with the reason in the verifier info. Rows of NeMo
Gym's ``arc_agi`` resources server (``train``, ``test_input``, ``expected_output``, ``task_id``) run unchanged.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from runtime.answers import last_boxed
from runtime.sdk import Environment, Reference, Rollout, Task, Verdict

Grid = list[list[int]]
_BARE = re.compile(r"\[\s*\[[\d\s,\[\]]*\]\s*\]")


class Meta(msgspec.Struct, frozen=True):
    expected_output: Grid
    test_input: Grid | None = None
    train: list[dict[str, Any]] = []
    task_id: str | None = None


def parse_grid(text: str) -> tuple[Grid | None, str | None]:
    """The reply's grid, or None and why not."""
    boxed = last_boxed(text)
    candidate = boxed if boxed is not None and boxed.lstrip().startswith("[") else None
    if candidate is None:
        bare = _BARE.findall(text)
        candidate = bare[-1] if bare else None
    if candidate is None:
        return None, "no grid found (expected \\boxed{[[...], ...]})"
    try:
        grid = json.loads(candidate)
    except json.JSONDecodeError as exc:
        return None, f"the grid is not valid JSON: {exc}"
    if not isinstance(grid, list) or not grid or not all(isinstance(r, list) and r for r in grid):
        return None, "the grid is not a non-empty list of non-empty rows"
    if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 9 for r in grid for c in r):
        return None, "the grid holds something other than integers 0-9"
    if len({len(r) for r in grid}) != 1:
        return None, "the grid's rows differ in length"
    return grid, None


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """1.0 iff the parsed grid equals the expected one, cell for cell."""
    grid, why = parse_grid(rollout.text)
    info: dict[str, Any] = {"extracted_answer": json.dumps(grid) if grid is not None else None}
    if grid is None:
        return Verdict(False, {**info, "reason": why})
    expected = task.meta.expected_output
    if len(grid) != len(expected) or len(grid[0]) != len(expected[0]):
        info["reason"] = f"shape {len(grid)}x{len(grid[0])}, expected {len(expected)}x{len(expected[0])}"
    return Verdict(grid == expected, info)


def reference(task: Task[Meta]) -> Reference:
    right = task.meta.expected_output
    wrong = [row[:] for row in right]
    wrong[0][0] = (wrong[0][0] + 1) % 10  # one cell off: the most plausible wrong answer
    say = "Applying the rule from the examples to the test input:\n\\boxed{{{}}}"
    return Reference(right=say.format(json.dumps(right)), wrong=say.format(json.dumps(wrong)))


ENVIRONMENT = Environment(name="arc_agi", meta=Meta, verify=verify, reference=reference, accepts=["arc_agi"])
