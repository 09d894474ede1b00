"""Pulling a final answer out of a model's reply: the helpers verifiers share.

Each returns None when the reply holds no answer of that form (a verifier then scores it wrong and
says why), never raises on what a model wrote.
"""

from __future__ import annotations

import re
import unicodedata

_TEXT_WRAP = re.compile(r"\\text(?:bf|it|rm)?\{\s*(.*?)\s*\}", re.S)
_ANSWER_LINE = re.compile(r"(?:final\s+answer|answer)\s*(?:is)?\s*[:：]\s*(.+)", re.I)
_MARKDOWN = re.compile(r"[*_`#>]+")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (nested braces matched), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        start = text.rfind("\\fbox{")
        if start < 0:
            return None
    i = text.index("{", start) + 1
    depth, begin = 1, i
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i].strip()
        i += 1
    return None


def strip_latex(text: str) -> str:
    """``\\text{X}`` (and \\textbf, ...) as X, ``$`` dropped, whitespace trimmed."""
    prev = None
    while prev != text:
        prev, text = text, _TEXT_WRAP.sub(r"\1", text)
    return text.replace("$", "").strip()


def after_answer_colon(text: str, markdown: bool = False) -> str | None:
    """What follows the last ``Answer:`` / ``Final answer:`` on its line (markdown stripped if asked)."""
    if markdown:
        text = _MARKDOWN.sub("", text)
    found = None
    for line in text.splitlines():
        m = _ANSWER_LINE.search(line)
        if m:
            found = m.group(1).strip()
    return found


def last_line(text: str) -> str | None:
    """The last non-empty line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def normalize(text: str) -> str:
    """NFKC, lower case, surrounding quotes and trailing punctuation off, inner whitespace folded."""
    text = unicodedata.normalize("NFKC", text).strip().lower()
    text = text.strip("\"'`“”‘’").strip()
    text = text.rstrip(".!?;:,").strip()
    return " ".join(text.split())
