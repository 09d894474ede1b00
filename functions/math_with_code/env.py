"""math_with_code: math problems where computing helps; the model may run Python, the answer is verified as in ``math``.

The one tool is ``python`` (``runtime.sandbox.tool``): each call runs the model's code in the
sandbox and returns what it printed. The reward is ``math``'s: 1.0 iff the final answer (the last
``\\boxed{...}``, else the last number) equals ``expected_answer``.
"""

from __future__ import annotations

from typing import Any

from functions.math.env import Meta
from functions.math.env import verify as math_verify
from runtime.sandbox.tool import python
from runtime.sdk import Environment


def reference(row: dict[str, Any]) -> str:
    """What a perfect model answers (after computing it): the expected answer, boxed."""
    return f"The answer is \\boxed{{{row['expected_answer']}}}."


ENVIRONMENT = Environment(name="math_with_code", meta=Meta, tools=[python], verify=math_verify)
