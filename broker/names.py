"""The one rule for identifiers that become a subject token or a KV key.

A run id, an agent, environment or function name is used as one token of a NATS subject
(``gym.agent.<agent>``, ``gym.result.<run_id>``) and in KV keys (``<run_id>.<task>.<rollout>``),
so it must be 1-64 ASCII letters, digits, ``-`` or ``_``: no dots, no spaces, no wildcards, no
accents. Every edge (the run config, the CLI, the wire schemas, the workers) checks it here.
"""

from __future__ import annotations

import re

PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
_NAME = re.compile(PATTERN)
RULE = "1-64 ASCII letters, digits, '-' or '_'"


class InvalidName(ValueError):
    """An identifier breaks the name rule; the message names what it is, the value and the rule."""


def valid(value: str) -> bool:
    return isinstance(value, str) and _NAME.fullmatch(value) is not None


def check(what: str, value: str) -> str:
    """``value`` if it follows the rule; InvalidName naming ``what`` (e.g. "run id") otherwise."""
    if not valid(value):
        raise InvalidName(f"{what} {value!r} is not a valid name: use {RULE} (it becomes a NATS subject token)")
    return value
