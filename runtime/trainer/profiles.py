"""The per-task profile kept across runs: pass rate per task per policy version, for curriculum filtering.

One KV entry per task in the ``runs`` bucket (``tasks.<task key>``, see `samples.task_key`), a JSON
map of policy version -> ``[passed, scored]``, updated by compare-and-set as samples complete (so
several trainers or runs add to it without losing counts). A task that every recent sample passes
teaches nothing, nor does one that none passes: `TaskProfiles.keep` filters both out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from broker import topology

PREFIX = "tasks."
CAS_TRIES = 20


@dataclass
class TaskProfile:
    """One task's counts: policy version -> (passed, scored)."""

    key: str
    by_version: dict[int, tuple[int, int]]

    def pass_rate(self, version: int | None = None) -> float | None:
        """Pass rate at ``version``, or over every version; None with nothing scored."""
        counts = [self.by_version[version]] if version is not None and version in self.by_version else []
        if version is None:
            counts = list(self.by_version.values())
        passed, scored = sum(c[0] for c in counts), sum(c[1] for c in counts)
        return passed / scored if scored else None

    def scored(self, version: int | None = None) -> int:
        if version is not None:
            return self.by_version.get(version, (0, 0))[1]
        return sum(c[1] for c in self.by_version.values())


class TaskProfiles:
    """Read and update the profiles in the broker's ``runs`` bucket."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js

    async def record(self, key: str, version: int, passed: bool) -> None:
        kv = await self.js.key_value(topology.RUNS)
        for _ in range(CAS_TRIES):
            try:
                entry = await kv.get(PREFIX + key)
                counts, revision = json.loads(entry.value or b"{}"), entry.revision
            except KeyNotFoundError:
                counts, revision = {}, 0
            p, n = counts.get(str(version), [0, 0])
            counts[str(version)] = [p + int(passed), n + 1]
            data = json.dumps(counts).encode()
            try:
                if revision:
                    await kv.update(PREFIX + key, data, last=revision)
                else:
                    await kv.create(PREFIX + key, data)
                return
            except (KeyWrongLastSequenceError, Exception) as exc:  # a concurrent update: read it again
                if not _conflict(exc):
                    raise
        raise RuntimeError(f"task profile {key}: {CAS_TRIES} conflicting updates")

    async def get(self, key: str) -> TaskProfile:
        kv = await self.js.key_value(topology.RUNS)
        try:
            raw: dict[str, Any] = json.loads((await kv.get(PREFIX + key)).value or b"{}")
        except KeyNotFoundError:
            raw = {}
        return TaskProfile(key, {int(v): (int(c[0]), int(c[1])) for v, c in raw.items()})

    async def keep(
        self, keys: list[str], *, version: int | None = None, min_scored: int = 4, low: float = 0.0, high: float = 1.0
    ) -> list[bool]:
        """For each task key: keep it unless it has at least ``min_scored`` samples (at ``version``, or in
        all) and a pass rate at or below ``low`` (never solved) or at or above ``high`` (always solved)."""
        out = []
        for key in keys:
            profile = await self.get(key)
            rate = profile.pass_rate(version)
            known = profile.scored(version) >= min_scored and rate is not None
            out.append(not (known and rate is not None and (rate <= low or rate >= high)))
        return out


def _conflict(exc: BaseException) -> bool:
    """A compare-and-set that lost (the key changed, or was created by someone else first)."""
    text = str(exc).lower()
    return isinstance(exc, KeyWrongLastSequenceError) or "wrong last sequence" in text or "key exists" in text
