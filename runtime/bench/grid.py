"""What one benchmark run measures: the configurations of the grid and the bounds of each."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

Workload = Literal["answer", "tool"]

MODEL_CALLS: dict[Workload, int] = {"answer": 1, "tool": 2}
"""Model calls per rollout: "answer" offers no tools; "tool" offers the calculator, which the policy calls once."""

HOPS: dict[Workload, int] = {"answer": 2, "tool": 4}
"""Handled messages per rollout: Start, (Tools, Resume,) Verify."""


@dataclass(frozen=True)
class Config:
    """One point of the grid."""

    workload: Workload
    latency_ms: float
    """The simulated policy's delay before every answer (L)."""
    concurrency: int
    """Rollouts kept in flight by the closed loop (C)."""
    replicas: int
    """Worker processes per function (W)."""

    @property
    def label(self) -> str:
        return f"{self.workload} L={self.latency_ms:g}ms C={self.concurrency} W={self.replicas}"

    @property
    def ideal_rps(self) -> float | None:
        """C / (model calls x L): the throughput if only the policy's latency counted (None when L = 0)."""
        if not self.latency_ms:
            return None
        return self.concurrency / (MODEL_CALLS[self.workload] * self.latency_ms / 1000)


@dataclass(frozen=True)
class Bounds:
    """How long one configuration runs: submission stops at whichever bound comes first."""

    rollouts: int | None = None
    """Rollouts to submit (None: no count bound, ``seconds`` decides, so every configuration is measured
    over the same steady-state window; a count of 4 x C + 200 gave C = 16 a window of ~1-2 s, mostly
    start-up transient)."""
    seconds: float = 20.0
    """Longest submission phase once warmed up (the first C Results in); at most 3x that from the start."""
    drain_s: float = 60.0
    """Longest wait for the rollouts in flight once submission stopped."""
    warmup: int = 8
    """Rollouts run (and not measured) before each configuration, to load lazy imports and connections."""

    def rollouts_for(self, c: Config) -> int:
        return self.rollouts if self.rollouts is not None else UNBOUNDED


UNBOUNDED = 10_000_000
"""The count bound when none is given: never reached in ``seconds`` on one machine."""


@dataclass(frozen=True)
class Axes:
    """The values of each axis of a grid."""

    workload: list[Workload]
    latency_ms: list[float]
    concurrency: list[int]
    replicas: list[int]


FULL = Axes(workload=["answer", "tool"], latency_ms=[0.0, 50.0], concurrency=[1, 16, 64, 256, 1024], replicas=[1, 2])
QUICK = Axes(workload=["answer", "tool"], latency_ms=[0.0], concurrency=[1, 4], replicas=[1])


def expand(
    workloads: list[Workload], latencies: list[float], concurrencies: list[int], replicas: list[int]
) -> list[Config]:
    """Every combination, ordered so a scaling curve (W) and a concurrency sweep (C) sit together."""
    return [Config(w, lat, c, r) for w, lat, r, c in itertools.product(workloads, latencies, replicas, concurrencies)]
