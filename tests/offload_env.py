"""A test double: an environment whose verifier does CPU-bound work off the loop, slow for tasks that ask."""

from __future__ import annotations

import time

import msgspec

from runtime.sdk import Environment, Reference, Rollout, Task, Verdict, offload


class Meta(msgspec.Struct, frozen=True):
    busy_s: float = 0.0


def burn(seconds: float) -> float:
    """Spin the CPU (never yields: on the loop it would stall every other message)."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return float(n >= 0)


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    return Verdict(await offload(burn, task.meta.busy_s, timeout_s=1.0))


def reference(task: Task[Meta]) -> Reference:
    return Reference(right="done", wrong="done")


ENVIRONMENT = Environment(name="offload", meta=Meta, verify=verify, reference=reference)
