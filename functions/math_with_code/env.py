"""math_with_code: math problems where computing helps; the model may run Python, the answer is verified as in ``math``.

The one tool is ``python`` (``runtime.sandbox.tool``): each call runs the model's code in the
sandbox and returns what it printed. The reward is ``math``'s: 1.0 iff the final answer (the last
``\\boxed{...}``, else the last number) equals ``expected_answer``.
"""

from __future__ import annotations

from functions.math.env import Meta
from functions.math.env import verify as math_verify
from runtime.sandbox.tool import python
from runtime.sdk import Environment, Reference, Task, call


def reference(task: Task[Meta]) -> Reference:
    """Right: compute the answer with the python tool, then box it; wrong: the same, then box it off by one."""
    gold = str(task.meta.expected_answer)
    try:
        off = str(int(gold) + 1)
    except ValueError:
        off = f"{gold} + 1"
    run = call("python", code=f"print({gold})")
    return Reference(right=[run, f"The answer is \\boxed{{{gold}}}."], wrong=[run, f"The answer is \\boxed{{{off}}}."])


ENVIRONMENT = Environment(name="math_with_code", meta=Meta, tools=[python], verify=math_verify, reference=reference)
