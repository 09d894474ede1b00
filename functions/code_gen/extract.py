"""The program in a model's reply: the last fenced code block of its final answer (shared by code_tests)."""

from __future__ import annotations

import re

FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
PYTHON_TAGS = ("python", "py", "python3", "")


def extract_code(text: str) -> str | None:
    """The last ```python (or untagged) block after any <think> section; None if there is none."""
    answer = text.rpartition("</think>")[2]
    blocks = [body for tag, body in FENCE.findall(answer) if tag.lower() in PYTHON_TAGS]
    return blocks[-1] if blocks and blocks[-1].strip() else None


def fenced(code: str) -> str:
    """``code`` as a model would answer it."""
    return f"```python\n{code.rstrip()}\n```"
