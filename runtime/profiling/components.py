"""A compound reward's components: read from the verifier's info, summed up per component in the profile."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from runtime.profiling.estimators import Stats, describe


def components_of(verifier: dict[str, Any]) -> dict[str, float]:
    """The numeric ``components`` a verifier reported (empty when it reports none)."""
    raw = verifier.get("components")
    if not isinstance(raw, dict):
        return {}
    return {str(k): float(v) for k, v in raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def component_stats(per_rollout: Iterable[dict[str, float]]) -> dict[str, Stats]:
    """Each component's statistics over the scored rollouts that report it."""
    values: dict[str, list[float]] = defaultdict(list)
    for parts in per_rollout:
        for name, v in parts.items():
            values[name].append(v)
    return {name: describe(v) for name, v in sorted(values.items())}
