"""A compound reward's components, read from the verifier's info (the profile describes each one)."""

from __future__ import annotations

from typing import Any


def components_of(verifier: dict[str, Any]) -> dict[str, float]:
    """The numeric ``components`` a verifier reported (empty when it reports none)."""
    raw = verifier.get("components")
    if not isinstance(raw, dict):
        return {}
    return {str(k): float(v) for k, v in raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
